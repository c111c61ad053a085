#pragma once
// `qatserve repack SRC DST`: a bf16 QAT export (-qat-q4_0-unquantized) to a lossless int4 W4A16
// compressed-tensors checkpoint in the layout vLLM reads (never run here). Attention, dense MLP, per-layer-embedding
// projections and every MoE expert are packed (fused experts split into experts.{e}.{gate,up,down}_proj);
// everything else is copied byte for byte. A tensor with any group off the QAT grid stays bf16 and goes on
// `ignore`, with the reason in the report. Streams a tensor at a time on every core.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/qat_grid.h"

namespace qs {

struct RepackOptions {
  std::filesystem::path src, dst;
  uint64_t max_shard_bytes = 4ull << 30;
  bool progress = true;
  // Lossless (default) or one of the lossy fixed rules (qat_grid.h), for measuring what they cost.
  RepackGrid grid = RepackGrid::Lossless;
};

struct KeptTensor {
  std::string name, reason;
};

struct RepackReport {
  uint64_t tensors_quantized = 0, tensors_copied = 0, groups = 0, bytes_in = 0, bytes_out = 0;
  // Of `groups`, those whose packed levels and scale give back every bf16 value exactly, counted as they were packed:
  // "lossless" in the report is this measurement (all of them), not the grid asked for.
  std::shared_ptr<std::atomic<uint64_t>> groups_reproduced = std::make_shared<std::atomic<uint64_t>>(0);
  std::vector<KeptTensor> kept;          // quantizable tensors left in bf16, with why
  std::vector<std::string> dropped;      // e.g. a tied lm_head identical to the embedding
  std::vector<std::string> notes;
  double seconds = 0;
  RepackGrid grid = RepackGrid::Lossless;
  nlohmann::ordered_json to_json() const;
};

RepackReport repack_checkpoint(const RepackOptions& options);

}  // namespace qs
