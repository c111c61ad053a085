#include "formats/checkpoint_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
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
    Shard& shard = shards_.emplace_back();
    shard.name = shards.size() == 1 ? "model.safetensors"
                                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    shard.first = shard.next = order_.size();
    for (auto& t : shards[s]) {
      order_.push_back(std::move(t));
      shard_of_.push_back(s);
    }
    shard.end = order_.size();
  }

  temp_dir_ = parent / fmt::format(".{}.partial-{}", out_dir_.filename().string(), getpid());
  fs::remove_all(temp_dir_);
  std::error_code ec;
  if (!fs::create_directory(temp_dir_, ec))
    throw Error(fmt::format("{}: cannot create: {}", temp_dir_.string(), ec.message()));
  for (Shard& shard : shards_) skip_completed(shard);
}

CheckpointWriter::~CheckpointWriter() {
  for (Shard& shard : shards_)
    if (shard.fd >= 0) ::close(shard.fd);
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_dir_, ec);
  }
}

void CheckpointWriter::open(Shard& shard) {
  std::vector<const TensorSpec*> members;
  for (size_t i = shard.first; i < shard.end; ++i) members.push_back(&order_[i]);
  fs::path path = temp_dir_ / shard.name;
  shard.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (shard.fd < 0) throw Error(fmt::format("{}: cannot create: {}", path.string(), std::strerror(errno)));
  std::string header = shard_header(members);
  uint64_t n = header.size();
  write_all(shard.fd, &n, 8, path);
  write_all(shard.fd, header.data(), header.size(), path);
  shard.bytes = 8 + header.size();
  shard.handed_to_disk = 0;
}

void CheckpointWriter::close(Shard& shard) {
  if (shard.fd < 0) return;
  // No fsync here: the kernel writes this shard back while the next one is computed; commit() syncs them all.
  fs::path path = temp_dir_ / shard.name;
  const int fd = std::exchange(shard.fd, -1);
  if (::close(fd) != 0) throw Error(fmt::format("{}: cannot close: {}", path.string(), std::strerror(errno)));
}

const TensorSpec* CheckpointWriter::current() const {
  for (const Shard& shard : shards_)
    if (!shard.complete()) return &order_[shard.next];
  return nullptr;
}

void CheckpointWriter::append(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    auto open_shard = std::find_if(shards_.begin(), shards_.end(), [](const Shard& s) { return !s.complete(); });
    if (open_shard == shards_.end())
      throw Error(fmt::format("{}: {} bytes written past the last tensor", out_dir_.string(), bytes.size()));
    uint64_t room = 0;
    for (size_t i = open_shard->next; i < open_shard->end; ++i) room += order_[i].nbytes();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(room - open_shard->written_in_tensor, bytes.size()));
    append_to_shard(open_shard - shards_.begin(), bytes.first(n));
    bytes = bytes.subspan(n);
  }
}

void CheckpointWriter::append_to_shard(size_t index, std::span<const std::byte> bytes) {
  Shard& shard = shards_.at(index);
  while (!bytes.empty()) {
    if (shard.complete())
      throw Error(fmt::format("{}: {} bytes written past the last tensor of {}", out_dir_.string(), bytes.size(),
                              shard.name));
    if (shard.fd < 0) open(shard);
    const TensorSpec& t = order_[shard.next];
    const size_t n = static_cast<size_t>(std::min<uint64_t>(t.nbytes() - shard.written_in_tensor, bytes.size()));
    write_all(shard.fd, bytes.data(), n, temp_dir_ / shard.name);
    shard.written_in_tensor += n;
    shard.bytes += n;
    if (shard.bytes - shard.handed_to_disk >= kWritebackBytes) {
      // A hint: commit() still fsyncs everything, so a failure here changes nothing.
      sync_file_range(shard.fd, static_cast<off_t>(shard.handed_to_disk),
                      static_cast<off_t>(shard.bytes - shard.handed_to_disk), SYNC_FILE_RANGE_WRITE);
      shard.handed_to_disk = shard.bytes;
    }
    bytes = bytes.subspan(n);
    skip_completed(shard);
  }
}

void CheckpointWriter::skip_completed(Shard& shard) {
  // A zero-byte tensor is complete before any of its bytes arrive.
  while (!shard.complete() && shard.written_in_tensor == order_[shard.next].nbytes()) {
    ++shard.next;
    shard.written_in_tensor = 0;
  }
  if (shard.complete()) close(shard);
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
  for (Shard& shard : shards_) {
    if (!shard.complete())
      throw Error(fmt::format("{}: tensor '{}' is incomplete ({} of {} bytes); nothing was written", out_dir_.string(),
                              order_[shard.next].name, shard.written_in_tensor, order_[shard.next].nbytes()));
    if (shard.bytes == 0 && shard.end > shard.first) open(shard), close(shard);  // empty tensors: a header alone
  }
  if (shards_.size() > 1) {
    nlohmann::ordered_json index;
    uint64_t total = 0;
    for (const auto& t : order_) total += t.nbytes();
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (size_t i = 0; i < order_.size(); ++i) index["weight_map"][order_[i].name] = shards_[shard_of_[i]].name;
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
