#pragma once
// Anonymous memory aligned to 2 MiB and advised onto transparent huge pages, for data read as long streams: the
// weights the kernels stream and the bandwidth sweep that measures their bound. On 4 KiB pages a stream crosses a
// page (a TLB walk, and the end of the hardware prefetcher's reach) every 64 cache lines.
#include <cstddef>

namespace qs {

class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t bytes);  // zero-filled; throws naming the size when the mapping fails
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& other) noexcept;
  HugeBuffer& operator=(HugeBuffer&& other) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;
  size_t mapped_ = 0, size_ = 0;
  std::byte* data_ = nullptr;
};

}  // namespace qs
