#pragma once
// Streams a checkpoint to disk a tensor at a time (memory bounded by what the caller holds, never the model).
// Tensors are split into shards of at most max_shard_bytes in the caller's order, each shard's data is ordered
// by descending alignment class, stably (so tensors start aligned, as the reference writer arranges), headers
// are padded to
// 8 bytes with __metadata__ {"format":"pt"}. Everything goes into a hidden temporary directory beside the
// destination, renamed into place by commit(): an interrupted run leaves no half checkpoint.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/dtype.h"

namespace qs {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  // Alignment class the writer sorts by (0 = the dtype's size). A tensor that must stay right after its
  // predecessor (a weight_scale after its weight_packed) takes the predecessor's class.
  int sort_alignment = 0;
  uint64_t nbytes() const;
  int alignment() const { return sort_alignment ? sort_alignment : static_cast<int>(dtype_size(dtype)); }
};

class CheckpointWriter {
 public:
  static constexpr uint64_t kDefaultShardBytes = 4ull << 30;

  CheckpointWriter(std::filesystem::path out_dir, std::vector<TensorSpec> tensors,
                   uint64_t max_shard_bytes = kDefaultShardBytes);
  ~CheckpointWriter();  // removes the temporary directory unless commit() ran
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The order in which append() must deliver tensor data.
  const std::vector<TensorSpec>& order() const { return order_; }
  // The tensor whose bytes append() expects next, or nullptr when all data has been written.
  const TensorSpec* current() const { return next_ < order_.size() ? &order_[next_] : nullptr; }
  void append(std::span<const std::byte> bytes);

  // Side files (config.json, tokenizer, report) are written into the temporary directory too.
  void write_file(std::string_view name, std::string_view content);
  void copy_file(const std::filesystem::path& src, std::string_view name);

  void commit();  // every tensor complete -> index, fsync, rename into place

  size_t shard_count() const { return shard_names_.size(); }

 private:
  void open_shard(size_t shard);
  void close_shard();
  void skip_completed();

  std::filesystem::path out_dir_, temp_dir_;
  std::vector<TensorSpec> order_;
  std::vector<size_t> shard_of_;           // per tensor in order_
  std::vector<std::string> shard_names_;
  size_t next_ = 0;                        // index in order_ of the tensor being written
  uint64_t written_in_tensor_ = 0;
  uint64_t shard_bytes_ = 0, handed_to_disk_ = 0;  // of the open shard: written, and started on their way to disk
  int fd_ = -1;
  size_t open_shard_ = SIZE_MAX;
  bool committed_ = false;
};

}  // namespace qs
