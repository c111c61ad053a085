#include "checkpoint_tools/tensor_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>

#include "util/error.h"
#include "util/interrupt.h"
#include "util/parallel.h"

namespace qs {
namespace {
constexpr uint64_t kBlockBytes = 64ull << 20;
}

std::vector<TensorSpec> specs_of(const std::vector<OutputTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back(t.spec);
  return specs;
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
  std::map<std::string_view, OutputTensor*> by_name;
  for (auto& t : tensors) by_name[t.spec.name] = &t;
  std::vector<std::byte> buffers[2];
  int current = 0;
  std::future<void> writing;
  // Never unwind while the writer thread still reads a buffer.
  struct Join {
    std::future<void>& f;
    ~Join() {
      if (f.valid()) f.wait();
    }
  } join{writing};
  ThreadPool& pool = ThreadPool::shared();
  for (const TensorSpec& spec : writer.order()) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) throw Error(fmt::format("internal: no producer for tensor '{}'", spec.name));
    OutputTensor& t = *it->second;
    uint64_t row_bytes = t.rows > 0 ? spec.nbytes() / t.rows : 0;
    int64_t block_rows = std::max<int64_t>(1, row_bytes ? kBlockBytes / row_bytes : t.rows);
    for (int64_t r0 = 0; r0 < t.rows; r0 += block_rows) {
      throw_if_interrupted();
      int64_t r1 = std::min(t.rows, r0 + block_rows);
      std::vector<std::byte>& buffer = buffers[current];
      buffer.resize((r1 - r0) * row_bytes);
      std::byte* base = buffer.data();
      pool.parallel_for(r1 - r0, std::max<int64_t>(1, (1 << 16) / std::max<uint64_t>(1, row_bytes)),
                        [&](size_t a, size_t b) { t.fill(r0 + a, r0 + b, base + a * row_bytes); });
      if (writing.valid()) writing.get();
      writing = std::async(std::launch::async, [&writer, &buffer] { writer.append(buffer); });
      if (t.rows_written) t.rows_written(r0, r1);
      progress.advance(t.source_bytes * (r1 - r0) / t.rows);
      current ^= 1;
    }
    if (t.done) t.done();
  }
  if (writing.valid()) writing.get();
}

}  // namespace qs
