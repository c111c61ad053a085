#pragma once
// Model configs compiled into the binary: the real Gemma 4 configs (e2b, e4b, 26b-a4b, 31b) and reduced
// ones of the same structure for tests (e2b-tiny, 26b-a4b-tiny). Sources: configs/*.json.
#include <string_view>
#include <vector>

namespace qs {

struct PresetConfig {
  std::string_view name;
  std::string_view json;
};

const std::vector<PresetConfig>& preset_configs();

}  // namespace qs
