#include "checkpoint_tools/tensor_stream.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "util/error.h"
#include "util/interrupt.h"
#include "util/parallel.h"

namespace qs {
namespace {
constexpr uint64_t kBlockBytes = 64ull << 20;
constexpr size_t kBuffers = 4;          // filled blocks waiting for the disk: 256 MiB at most
constexpr size_t kQueuedBlocks = 8;     // blocks handed to the writer thread, buffered or straight from the source
constexpr size_t kReadAheadBlocks = 2;  // blocks whose source is read in the background ahead of the one computed

// One block of rows of one output tensor, in the writer's order.
struct Block {
  OutputTensor* t;
  int64_t r0, r1;
  uint64_t bytes;
  size_t shard;
};

std::vector<Block> plan_blocks(const CheckpointWriter& writer, std::vector<OutputTensor>& tensors) {
  std::map<std::string_view, OutputTensor*> by_name;
  for (auto& t : tensors) by_name[t.spec.name] = &t;
  std::vector<Block> blocks;
  for (size_t index = 0; index < writer.order().size(); ++index) {
    const TensorSpec& spec = writer.order()[index];
    const size_t shard = writer.shard_of(index);
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) throw Error(fmt::format("internal: no producer for tensor '{}'", spec.name));
    OutputTensor& t = *it->second;
    if (t.copy_source && t.source.size() != spec.nbytes())
      throw Error(fmt::format("internal: tensor '{}' copies {} source bytes into {}", spec.name, t.source.size(),
                              spec.nbytes()));
    if (t.rows <= 0) {  // nothing to write, but its done() still runs
      blocks.push_back({&t, 0, 0, 0, shard});
      continue;
    }
    const uint64_t row_bytes = spec.nbytes() / t.rows;
    const int64_t block_rows = std::max<int64_t>(1, row_bytes ? kBlockBytes / row_bytes : t.rows);
    for (int64_t r0 = 0; r0 < t.rows; r0 += block_rows) {
      const int64_t r1 = std::min(t.rows, r0 + block_rows);
      blocks.push_back({&t, r0, r1, (r1 - r0) * row_bytes, shard});
    }
  }
  return blocks;
}

// The source bytes rows [r0, r1) of t read.
std::span<const std::byte> source_of(const Block& b) {
  const auto& src = b.t->source;
  const uint64_t begin = src.size() * b.r0 / b.t->rows, end = src.size() * b.r1 / b.t->rows;
  return src.subspan(begin, end - begin);
}

// Starts reading a block's source into the page cache without waiting for it (a hint: failure changes nothing).
void read_ahead(const Block& b) {
  const std::span<const std::byte> s = source_of(b);
  if (s.empty()) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(s.data()) & ~(page - 1);
  const uintptr_t last = reinterpret_cast<uintptr_t>(s.data() + s.size());
  madvise(reinterpret_cast<void*>(first), last - first, MADV_WILLNEED);
}

// The writer thread: appends blocks in the order pushed, while the caller computes the next ones; buffers come back
// to the caller once written. A write error reaches the caller at its next acquire(), push() or finish().
class BlockWriter {
 public:
  explicit BlockWriter(CheckpointWriter& writer) : writer_(writer), buffers_(kBuffers) {
    for (auto& b : buffers_) free_.push_back(&b);
    thread_ = std::thread([this] { run(); });
  }
  ~BlockWriter() {  // unwinding: what is queued is dropped (the checkpoint writer discards its partial output)
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      abort_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  BlockWriter(const BlockWriter&) = delete;
  BlockWriter& operator=(const BlockWriter&) = delete;

  std::vector<std::byte>& acquire() {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return error_ || !free_.empty(); });
    if (error_) std::rethrow_exception(error_);
    std::vector<std::byte>* b = free_.back();
    free_.pop_back();
    return *b;
  }

  // buffer: the one `data` lies in (returned once written), or null when data is the source's.
  void push(size_t shard, std::span<const std::byte> data, std::vector<std::byte>* buffer,
            std::function<void()> written) {
    {
      std::unique_lock lock(mu_);
      changed_.wait(lock, [&] { return error_ || queue_.size() < kQueuedBlocks; });
      if (error_) std::rethrow_exception(error_);
      queue_.push_back({shard, data, buffer, std::move(written)});
    }
    changed_.notify_all();
  }

  void finish() {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
    }
    changed_.notify_all();
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Item {
    size_t shard;
    std::span<const std::byte> data;
    std::vector<std::byte>* buffer;
    std::function<void()> written;
  };

  void run() {
    while (true) {
      Item item;
      {
        std::unique_lock lock(mu_);
        changed_.wait(lock, [&] { return abort_ || closing_ || !queue_.empty(); });
        if (abort_ || queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      changed_.notify_all();
      try {
        writer_.append_to_shard(item.shard, item.data);
        if (item.written) item.written();
      } catch (...) {
        {
          std::lock_guard lock(mu_);
          error_ = std::current_exception();
        }
        changed_.notify_all();
        return;
      }
      if (item.buffer) {
        {
          std::lock_guard lock(mu_);
          free_.push_back(item.buffer);
        }
        changed_.notify_all();
      }
    }
  }

  CheckpointWriter& writer_;
  std::vector<std::vector<std::byte>> buffers_;  // sized once: their addresses stay valid
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::vector<std::byte>*> free_;
  std::deque<Item> queue_;
  std::exception_ptr error_;
  bool closing_ = false, abort_ = false;
  std::thread thread_;
};

// Shards whose every tensor is copied unchanged (E2B's 4.7 GB per-layer embedding table is one) are written on a
// thread of their own, from the source's memory map, while the other shards are computed and written: a copy runs
// at the speed of one thread's write(), which otherwise left the computing cores idle for the last 40% of a repack.
class CopyLane {
 public:
  CopyLane(CheckpointWriter& writer, std::vector<Block> blocks) : writer_(writer), blocks_(std::move(blocks)) {
    if (!blocks_.empty()) thread_ = std::thread([this] { run(); });
  }
  ~CopyLane() {  // unwinding: stop after the block being written (the checkpoint writer discards its output)
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;

  // Source bytes copied so far (any thread).
  uint64_t copied() const { return copied_.load(); }

  // A failed copy ends the stream at once, not after every other shard is computed.
  void throw_if_failed() {
    std::lock_guard lock(mu_);
    if (finished_ && error_) std::rethrow_exception(error_);
  }

  // Waits for the lane, reporting its progress; rethrows its error.
  void finish(Progress& progress, uint64_t reported) {
    if (thread_.joinable()) {
      std::unique_lock lock(mu_);
      while (!finished_) {
        const uint64_t now = copied();
        progress.advance(now - std::exchange(reported, now));
        changed_.wait_for(lock, std::chrono::milliseconds(200));
        if (interrupted()) stop_ = true;
      }
      lock.unlock();
      thread_.join();
    }
    progress.advance(copied() - reported);
    if (error_) std::rethrow_exception(error_);
    throw_if_interrupted();
  }

 private:
  void run() {
    try {
      for (size_t i = 0; i < std::min(kReadAheadBlocks, blocks_.size()); ++i) read_ahead(blocks_[i]);
      for (size_t i = 0; i < blocks_.size() && !stop_; ++i) {
        if (i + kReadAheadBlocks < blocks_.size()) read_ahead(blocks_[i + kReadAheadBlocks]);
        const Block& b = blocks_[i];
        OutputTensor& t = *b.t;
        if (b.r0 == b.r1) {  // nothing to write, but its done() still runs
          if (t.done) t.done();
          continue;
        }
        writer_.append_to_shard(b.shard, source_of(b));
        if (t.rows_written) t.rows_written(b.r0, b.r1);
        copied_ += t.source_bytes * (b.r1 - b.r0) / t.rows;
        if (t.done && b.r1 == t.rows) t.done();
      }
    } catch (...) {
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      finished_ = true;
    }
    changed_.notify_all();
  }

  CheckpointWriter& writer_;
  const std::vector<Block> blocks_;
  std::atomic<uint64_t> copied_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable changed_;
  bool finished_ = false;
  std::exception_ptr error_;  // set before finished_
  std::thread thread_;
};

// The blocks of copy-only shards, moved out of `blocks` (which keeps the rest, in order).
std::vector<Block> take_copy_only_shards(const CheckpointWriter& writer, std::vector<Block>& blocks) {
  std::vector<bool> copy_only(writer.shard_count(), true);
  for (const Block& b : blocks)
    if (b.r0 < b.r1 && !b.t->copy_source) copy_only[b.shard] = false;
  std::vector<Block> lane, rest;
  for (const Block& b : blocks) (copy_only[b.shard] ? lane : rest).push_back(b);
  blocks = std::move(rest);
  return lane;
}

}  // namespace

std::vector<TensorSpec> specs_of(const std::vector<OutputTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back(t.spec);
  return specs;
}

OutputTensor copied_tensor(const TensorRef& src) {
  int64_t rows = src.shape().empty() ? 1 : src.shape()[0];
  uint64_t row_bytes = rows ? src.nbytes() / rows : 0;
  OutputTensor t{{src.name(), src.dtype(), src.shape()}, rows, src.nbytes()};
  t.source = src.bytes();
  t.copy_source = true;
  t.rows_written = [src, row_bytes](int64_t r0, int64_t r1) { src.release_bytes(r0 * row_bytes, r1 * row_bytes); };
  return t;
}

OutputTensor constant_tensor(TensorSpec spec, std::vector<std::byte> bytes) {
  OutputTensor t;
  t.spec = std::move(spec);
  t.fill = [bytes = std::move(bytes)](int64_t, int64_t, std::byte* out) {
    std::memcpy(out, bytes.data(), bytes.size());
  };
  return t;
}

void stream_tensors(CheckpointWriter& writer, std::vector<OutputTensor>& tensors, Progress& progress) {
  std::vector<Block> blocks = plan_blocks(writer, tensors);
  CopyLane copies(writer, take_copy_only_shards(writer, blocks));
  uint64_t copies_reported = 0;
  ThreadPool& pool = ThreadPool::shared();
  BlockWriter out(writer);
  for (size_t i = 0; i < std::min(kReadAheadBlocks, blocks.size()); ++i) read_ahead(blocks[i]);
  for (size_t i = 0; i < blocks.size(); ++i) {
    throw_if_interrupted();
    copies.throw_if_failed();
    if (i + kReadAheadBlocks < blocks.size()) read_ahead(blocks[i + kReadAheadBlocks]);
    const Block& b = blocks[i];
    OutputTensor& t = *b.t;
    if (b.r0 == b.r1) {
      if (t.done) t.done();
      continue;
    }
    std::function<void()> written;
    if (t.rows_written) written = [&t, r0 = b.r0, r1 = b.r1] { t.rows_written(r0, r1); };
    if (t.copy_source) {
      out.push(b.shard, source_of(b), nullptr, std::move(written));
    } else {
      std::vector<std::byte>& buffer = out.acquire();
      buffer.resize(b.bytes);
      std::byte* base = buffer.data();
      const uint64_t row_bytes = b.bytes / (b.r1 - b.r0);
      pool.parallel_for(b.r1 - b.r0, std::max<int64_t>(1, (1 << 16) / std::max<uint64_t>(1, row_bytes)),
                        [&](size_t a, size_t e) { t.fill(b.r0 + a, b.r0 + e, base + a * row_bytes); });
      out.push(b.shard, buffer, &buffer, std::move(written));
    }
    const uint64_t copied = copies.copied();
    progress.advance(t.source_bytes * (b.r1 - b.r0) / t.rows + copied - std::exchange(copies_reported, copied));
    if (t.done && b.r1 == t.rows) t.done();
  }
  out.finish();
  copies.finish(progress, copies_reported);
}

}  // namespace qs
