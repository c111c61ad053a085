#include "formats/checkpoint_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

void write_all(int fd, const void* data, size_t n, const fs::path& path) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(fmt::format("{}: write failed: {}", path.string(), std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Written bytes are handed to the disk every this many (sync_file_range, not waiting): the disk writes while the
// caller computes, instead of the kernel holding gigabytes of dirty pages until commit()'s fsync waits for them all.
constexpr uint64_t kWritebackBytes = 64ull << 20;

std::string shard_header(const std::vector<const TensorSpec*>& tensors) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorSpec* t : tensors) {
    h[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + t->nbytes()}}};
    offset += t->nbytes();
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

// Everything on disk before the rename makes the checkpoint visible: a crash never leaves a complete-looking
// directory with missing data.
void sync_directory_contents(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
      int e = errno;
      if (fd >= 0) ::close(fd);
      throw Error(fmt::format("{}: cannot flush to disk: {}", entry.path().string(), std::strerror(e)));
    }
    ::close(fd);
  }
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

CheckpointWriter::CheckpointWriter(fs::path out_dir, std::vector<TensorSpec> tensors, uint64_t max_shard_bytes)
    : out_dir_(std::move(out_dir)) {
  if (fs::exists(out_dir_))
    throw Error(fmt::format("{}: already exists; choose a new output directory (nothing was written)",
                            out_dir_.string()));
  fs::path parent = fs::absolute(out_dir_).parent_path();
  if (!fs::is_directory(parent))
    throw Error(fmt::format("{}: parent directory {} does not exist", out_dir_.string(), parent.string()));

  // Shards keep the caller's order (a layer's tensors stay together); inside a shard, alignment order.
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t in_shard = 0;
  for (auto& t : tensors) {
    if (!shards.back().empty() && in_shard + t.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += t.nbytes();
    shards.back().push_back(std::move(t));
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    std::stable_sort(shards[s].begin(), shards[s].end(),
                     [](const TensorSpec& a, const TensorSpec& b) { return a.alignment() > b.alignment(); });
    shard_names_.push_back(shards.size() == 1 ? "model.safetensors"
                                              : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1,
                                                            shards.size()));
    for (auto& t : shards[s]) {
      order_.push_back(std::move(t));
      shard_of_.push_back(s);
    }
  }

  temp_dir_ = parent / fmt::format(".{}.partial-{}", out_dir_.filename().string(), getpid());
  fs::remove_all(temp_dir_);
  std::error_code ec;
  if (!fs::create_directory(temp_dir_, ec))
    throw Error(fmt::format("{}: cannot create: {}", temp_dir_.string(), ec.message()));
  if (!order_.empty()) open_shard(0);
  skip_completed();
}

CheckpointWriter::~CheckpointWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_dir_, ec);
  }
}

void CheckpointWriter::open_shard(size_t shard) {
  close_shard();
  std::vector<const TensorSpec*> members;
  for (size_t i = 0; i < order_.size(); ++i)
    if (shard_of_[i] == shard) members.push_back(&order_[i]);
  fs::path path = temp_dir_ / shard_names_[shard];
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(fmt::format("{}: cannot create: {}", path.string(), std::strerror(errno)));
  open_shard_ = shard;
  std::string header = shard_header(members);
  uint64_t n = header.size();
  write_all(fd_, &n, 8, path);
  write_all(fd_, header.data(), header.size(), path);
  shard_bytes_ = 8 + header.size();
  handed_to_disk_ = 0;
}

void CheckpointWriter::close_shard() {
  if (fd_ < 0) return;
  // No fsync here: the kernel writes this shard back while the next one is computed; commit() syncs them all.
  fs::path path = temp_dir_ / shard_names_[open_shard_];
  if (::close(fd_) != 0) throw Error(fmt::format("{}: cannot close: {}", path.string(), std::strerror(errno)));
  fd_ = -1;
}

void CheckpointWriter::append(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    if (next_ >= order_.size())
      throw Error(fmt::format("{}: {} bytes written past the last tensor", out_dir_.string(), bytes.size()));
    const TensorSpec& t = order_[next_];
    uint64_t room = t.nbytes() - written_in_tensor_;
    size_t n = static_cast<size_t>(std::min<uint64_t>(room, bytes.size()));
    write_all(fd_, bytes.data(), n, temp_dir_ / shard_names_[open_shard_]);
    written_in_tensor_ += n;
    shard_bytes_ += n;
    if (shard_bytes_ - handed_to_disk_ >= kWritebackBytes) {
      // A hint: commit() still fsyncs everything, so a failure here changes nothing.
      sync_file_range(fd_, static_cast<off_t>(handed_to_disk_), static_cast<off_t>(shard_bytes_ - handed_to_disk_),
                      SYNC_FILE_RANGE_WRITE);
      handed_to_disk_ = shard_bytes_;
    }
    bytes = bytes.subspan(n);
    skip_completed();
  }
}

void CheckpointWriter::skip_completed() {
  // A zero-byte tensor is complete before any of its bytes arrive.
  while (next_ < order_.size() && written_in_tensor_ == order_[next_].nbytes()) {
    ++next_;
    written_in_tensor_ = 0;
    if (next_ < order_.size() && shard_of_[next_] != open_shard_) open_shard(shard_of_[next_]);
  }
}

void CheckpointWriter::write_file(std::string_view name, std::string_view content) {
  fs::path path = temp_dir_ / name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot create: {}", path.string(), std::strerror(errno)));
  try {
    write_all(fd, content.data(), content.size(), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void CheckpointWriter::copy_file(const fs::path& src, std::string_view name) {
  std::error_code ec;
  fs::copy_file(src, temp_dir_ / name, fs::copy_options::overwrite_existing, ec);
  if (ec) throw Error(fmt::format("{}: cannot copy to output: {}", src.string(), ec.message()));
}

void CheckpointWriter::commit() {
  skip_completed();
  if (next_ < order_.size())
    throw Error(fmt::format("{}: tensor '{}' is incomplete ({} of {} bytes); nothing was written",
                            out_dir_.string(), order_[next_].name, written_in_tensor_, order_[next_].nbytes()));
  close_shard();
  if (shard_names_.size() > 1) {
    nlohmann::ordered_json index;
    uint64_t total = 0;
    for (const auto& t : order_) total += t.nbytes();
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (size_t i = 0; i < order_.size(); ++i) index["weight_map"][order_[i].name] = shard_names_[shard_of_[i]];
    write_file("model.safetensors.index.json", index.dump(2) + "\n");
  }
  sync_directory_contents(temp_dir_);
  std::error_code ec;
  fs::rename(temp_dir_, out_dir_, ec);
  if (ec) throw Error(fmt::format("{}: cannot move the finished checkpoint into place: {}", out_dir_.string(),
                                  ec.message()));
  committed_ = true;
}

}  // namespace qs
