#pragma once
// `qatserve verify SRC DST`: proves a repack lossless by re-reading both checkpoints from disk. For every group
// of every quantized tensor, each stored level must be the source value's level on the stored grid and
// level x scale must reproduce the source within bf16 rounding; copied tensors must be byte-identical;
// nothing missing, nothing extra; every bf16 Linear must be on the config's ignore list.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qs {

struct VerifyOptions {
  std::filesystem::path src, dst;
  bool progress = true;
  size_t max_failures_shown = 10;
  // Accept groups a lossy grid (`repack --grid textbook|ct-7.5`) does not reproduce, as long as each of their levels
  // is the value's nearest on the stored scale; they are still counted and their worst error reported.
  bool allow_lossy = false;
};

struct VerifyResult {
  uint64_t tensors_quantized = 0, tensors_copied = 0, groups_checked = 0;
  uint64_t values_checked = 0, values_bit_identical = 0;  // level x scale rounded to bf16 == source bits
  uint64_t failures = 0;
  std::vector<std::string> first_failures;
  // Groups not reproduced within bf16 rounding whose levels are nevertheless the nearest on their stored scale (a
  // lossy grid's work), the largest |level x scale - value| among them, and the first of them.
  uint64_t lossy_groups = 0;
  float lossy_max_error = 0;
  std::string first_lossy;
  bool lossy_allowed = false;
  double seconds = 0;
  bool ok() const { return failures == 0 && (lossy_groups == 0 || lossy_allowed); }
};

VerifyResult verify_repack(const VerifyOptions& options);

}  // namespace qs
