#pragma once
// Model configs compiled into the binary: the real Gemma 4 configs (e2b, e4b, 26b-a4b, 31b) and reduced
// ones of the same structure for tests (e2b-tiny, 26b-a4b-tiny: text only; e2b-mm-tiny: the mm_e2b_like fixture's
// config, with tiny vision and audio towers). Sources: configs/*.json. The 26b-a4b and 31b vision_config (a
// 1152-wide, 27-layer tower, head_dim 72, MLP 4304, standardized, no clipped linears) is reconstructed from
// third-party ports, not a copy of Google's file (the shared reconstructed configs carry none).
#include <string_view>
#include <vector>

namespace qs {

struct PresetConfig {
  std::string_view name;
  std::string_view json;
};

const std::vector<PresetConfig>& preset_configs();

}  // namespace qs
