#pragma once
// The common case of fit_qat_group for one group of 32, with AVX-512 (qat_grid_avx512.cc).
#include <cstdint>
#include <optional>

#include "quant/qat_grid.h"

namespace qs {

bool cpu_runs_qat_grid_avx512();

// The fit fit_qat_group gives when the group's step is amax / m for some m = 1..8 and that step rounded to bf16
// reproduces every value; nullopt otherwise (zero, tiny or non-finite peaks, a step that needs the least-squares
// refinement, off-grid groups), where the general search decides. Only where cpu_runs_qat_grid_avx512().
std::optional<GroupFit> fit_group32_avx512(const float* w, int8_t* levels);

}  // namespace qs
