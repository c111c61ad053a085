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

  // The order in which tensor data must be delivered: shard after shard, each shard's tensors in order.
  const std::vector<TensorSpec>& order() const { return order_; }
  size_t shard_count() const { return shards_.size(); }
  size_t shard_of(size_t index) const { return shard_of_[index]; }  // index: into order()

  // The tensor whose bytes append() expects next, or nullptr when all data has been written.
  const TensorSpec* current() const;
  // The next bytes of the checkpoint, in order(), across shards.
  void append(std::span<const std::byte> bytes);
  // The next bytes of one shard. Shards may be written concurrently, each by one thread (not mixed with append).
  void append_to_shard(size_t shard, std::span<const std::byte> bytes);

  // Side files (config.json, tokenizer, report) are written into the temporary directory too.
  void write_file(std::string_view name, std::string_view content);
  void copy_file(const std::filesystem::path& src, std::string_view name);

  void commit();  // every tensor complete -> index, fsync, rename into place

 private:
  // One output file: its tensors are order_[first, end); `next` is the one being written.
  struct Shard {
    std::string name;
    size_t first = 0, end = 0, next = 0;
    uint64_t written_in_tensor = 0;
    uint64_t bytes = 0, handed_to_disk = 0;  // written, and started on their way to disk
    int fd = -1;
    bool complete() const { return next == end; }
  };
  void open(Shard& shard);
  void close(Shard& shard);
  void skip_completed(Shard& shard);

  std::filesystem::path out_dir_, temp_dir_;
  std::vector<TensorSpec> order_;
  std::vector<size_t> shard_of_;  // per tensor in order_
  std::vector<Shard> shards_;
  bool committed_ = false;
};

}  // namespace qs
