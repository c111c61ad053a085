#pragma once
// Which float tensors are nn.Linear weights that a compressed-tensors "Linear" target would match, so that a
// W4A16 config must list their modules in `ignore` (else vLLM expects packed weights and fails to load).
#include <cstdint>
#include <string>
#include <vector>

namespace qs {

// A 2-D "<module>.weight" that is not a norm or an embedding table: tower linears, embedders, lm_head.
bool is_float_linear_weight(const std::string& name, const std::vector<int64_t>& shape);

inline std::string module_of(const std::string& weight_name) {
  return weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
}

}  // namespace qs
