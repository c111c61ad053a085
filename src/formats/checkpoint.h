#pragma once
// A checkpoint: a directory of safetensors shards tied together by model.safetensors.index.json, a
// directory holding one model.safetensors, or a single .safetensors file. Every index entry must resolve
// to a tensor in the named shard, and every tensor must be listed exactly once.
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/safetensors.h"

namespace qs {

struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorEntry* entry = nullptr;

  const std::string& name() const { return entry->name; }
  DType dtype() const { return entry->dtype; }
  const std::vector<int64_t>& shape() const { return entry->shape; }
  uint64_t nbytes() const { return entry->nbytes(); }
  std::span<const std::byte> bytes() const { return file->data(*entry); }
  void release() const { file->release(*entry, 0, entry->nbytes()); }
  void release_bytes(uint64_t begin, uint64_t end) const { file->release(*entry, begin, end); }
};

// Same dtype, shape and bytes. Compares in chunks and drops the pages it read, so comparing multi-GB tensors
// keeps resident memory small.
bool same_tensor_contents(const TensorRef& a, const TensorRef& b);

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& path);

  // The directory (for a single file: the file's directory) and, when present, its config.json.
  const std::filesystem::path& dir() const { return dir_; }
  std::optional<std::filesystem::path> config_path() const;
  bool is_single_file() const { return single_file_; }

  // Tensors ordered by shard, then by offset: the order in which reading them streams through the files.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const TensorRef* find(std::string_view name) const;
  const TensorRef& get(std::string_view name) const;  // throws naming the tensor and the checkpoint
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  uint64_t total_tensor_bytes() const;

 private:
  std::filesystem::path dir_;
  bool single_file_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<TensorRef> tensors_;
  std::vector<std::pair<std::string_view, size_t>> by_name_;  // sorted
};

}  // namespace qs
