#pragma once
// `qatserve inspect PATH`: what a checkpoint holds and whether it fits the Gemma 4 architecture its config
// describes: tensors by dtype and size, quantized modules, expected tensors that are absent (and whether that
// is fine), unexpected extras, and a grid scan (which group sizes put the bf16 weights on a 4-bit grid).
#include <filesystem>
#include <nlohmann/json.hpp>

namespace qs {

struct InspectOptions {
  std::filesystem::path path;
  int sample_groups = 256;  // per tensor and group size, for the grid scan
};

nlohmann::ordered_json inspect_checkpoint(const InspectOptions& options);
std::string format_inspection(const nlohmann::ordered_json& report);

}  // namespace qs
