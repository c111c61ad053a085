#include "util/huge_buffer.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cstdint>
#include <utility>

#include "util/error.h"

namespace qs {
namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

HugeBuffer::HugeBuffer(size_t bytes) : mapped_(bytes + kHugePage), size_(bytes) {
  base_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw Error(fmt::format("cannot map {} bytes of memory", bytes));
  }
  data_ = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(base_) + kHugePage - 1) & ~(kHugePage - 1));
  madvise(data_, bytes, MADV_HUGEPAGE);
}

HugeBuffer::~HugeBuffer() {
  if (base_) munmap(base_, mapped_);
}

HugeBuffer::HugeBuffer(HugeBuffer&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), mapped_(std::exchange(other.mapped_, 0)),
      size_(std::exchange(other.size_, 0)), data_(std::exchange(other.data_, nullptr)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& other) noexcept {
  if (this != &other) {
    if (base_) munmap(base_, mapped_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    size_ = std::exchange(other.size_, 0);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

}  // namespace qs
