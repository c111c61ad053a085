#include "checkpoint_tools/float_linears.h"

namespace qs {

bool is_float_linear_weight(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || !name.ends_with(".weight")) return false;
  for (const char* not_linear : {"norm", "embed_tokens", "embedding_table", "position_embedding"})
    if (name.find(not_linear) != std::string::npos) return false;
  return true;
}

}  // namespace qs
