#pragma once
// One safetensors file, memory-mapped, validated as the reference implementation validates it: header
// length limits, UTF-8 JSON, every tensor's byte range contiguous, gap-free, in bounds, and equal to
// product(shape) x dtype size. Tensor views point into the mapping (zero copy, never assumed aligned).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/dtype.h"

namespace qs {

struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data buffer
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // in file order (by offset)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
};

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Validates a whole file image (its first 8 bytes, header and data length). `label` names the file in errors.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label);

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorEntry* find(std::string_view name) const;
  std::span<const std::byte> data(const TensorEntry& t) const;
  uint64_t file_size() const { return size_; }

  // Drops the pages of a tensor from this process (they stay in the page cache): streaming tools call it
  // after each tensor so resident memory stays bounded by the largest tensor, not the model.
  void release(const TensorEntry& t, uint64_t begin, uint64_t end) const;  // bytes [begin, end) of t

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace qs
