#include "model/kv_disk_tier.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>
#include <utility>
#include <vector>

#include "util/error.h"

namespace qs {
namespace {

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'Q', 'S', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kNameLength = 16 + 1 + 1;  // <key hex>-<class>

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

uint64_t finalise(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27, x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::span<const std::byte> as_bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

uint64_t hash_bytes(std::span<const std::byte> bytes, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ finalise(seed + bytes.size());
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = (h ^ word) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<uint8_t>(bytes[i])) * 0x100000001b3ull;
  return finalise(h);
}

uint64_t hash_text(std::string_view text, uint64_t seed) { return hash_bytes(as_bytes(text), seed); }

KvDiskTier::KvDiskTier(DiskTierOptions options)
    : options_(std::move(options)), dir_(options_.dir / fmt::format("{:016x}", options_.identity)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error(fmt::format("--prefix-cache-dir {}: cannot create {}: {}", options_.dir.string(), dir_.string(), ec.message()));
  // The files a previous process left, oldest first, so that the most recently written are evicted last.
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string stem = entry.path().stem().string();
    if (entry.path().extension() != ".kvb" || stem.size() != kNameLength || !entry.is_regular_file()) {
      if (entry.path().extension() == ".tmp") fs::remove(entry.path(), ec);  // a write cut short
      continue;
    }
    found.emplace_back(entry.last_write_time(ec), stem);
  }
  if (ec) throw Error(fmt::format("--prefix-cache-dir {}: cannot list {}: {}", options_.dir.string(), dir_.string(), ec.message()));
  std::sort(found.begin(), found.end());
  for (const auto& [time, name] : found) {
    index_[name].bytes = fs::file_size(path_of(name), ec);
    stats_.bytes += index_[name].bytes;
    ++stats_.files;
    touch(name);
  }
  make_room(0);
}

std::string KvDiskTier::file_key(uint64_t key, int kv_class) { return fmt::format("{:016x}-{}", key, kv_class); }

void KvDiskTier::warn(const std::string& line) const {
  if (options_.warn) options_.warn(line);
  else fmt::print(stderr, "warning: {}\n", line);
}

std::string KvDiskTier::header(const DiskBlockId& id, uint64_t data_bytes) const {
  std::string h(kMagic, sizeof kMagic);
  put(h, kVersion);
  put(h, static_cast<uint32_t>(id.kv_class));
  put(h, options_.identity);
  put(h, options_.adapter);
  put(h, id.key);
  put(h, id.parent);
  put(h, static_cast<uint32_t>(id.tokens.size()));
  put(h, static_cast<uint32_t>(id.dtype));
  put(h, data_bytes);
  for (int32_t t : id.tokens) put(h, t);
  return h;
}

void KvDiskTier::touch(const std::string& name) {
  Entry& e = index_[name];
  if (e.used) by_use_.erase(e.used);
  e.used = ++tick_;
  by_use_[e.used] = name;
}

void KvDiskTier::forget(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  std::error_code ec;
  fs::remove(path_of(name), ec);
  stats_.bytes -= it->second.bytes;
  --stats_.files;
  by_use_.erase(it->second.used);
  index_.erase(it);
}

void KvDiskTier::reject(const std::string& name, const std::string& why) {
  warn(fmt::format("prefix cache file {} is not used: {}", path_of(name).string(), why));
  ++stats_.rejected;
  forget(name);
}

// Least recently used files out until `bytes` more fit under the bound.
void KvDiskTier::make_room(uint64_t bytes) {
  while (!by_use_.empty() && stats_.bytes + bytes > options_.max_bytes) {
    forget(by_use_.begin()->second);
    ++stats_.removed;
  }
}

bool KvDiskTier::store(const DiskBlockId& id, std::span<const std::byte> data) {
  const std::string name = file_key(id.key, id.kv_class);
  if (index_.count(name)) return true;
  std::string bytes = header(id, data.size());
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size());
  put(bytes, hash_bytes(as_bytes(bytes)));
  if (bytes.size() > options_.max_bytes) {
    ++stats_.write_errors;
    if (!std::exchange(warned_bound_, true))
      warn(fmt::format("prefix cache: a block of {} bytes exceeds --prefix-cache-disk-bytes {}: blocks are not "
                       "written to disk", bytes.size(), options_.max_bytes));
    return false;
  }
  make_room(bytes.size());
  const fs::path path = path_of(name), tmp = fs::path(path).replace_extension(fmt::format(".{}.tmp", getpid()));
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ok = out && out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) && out.flush();
  }
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    ++stats_.write_errors;
    warn(fmt::format("prefix cache: cannot write {}: {}", path.string(), ok ? ec.message() : std::strerror(errno)));
    return false;
  }
  index_[name].bytes = bytes.size();
  stats_.bytes += bytes.size();
  ++stats_.files;
  ++stats_.stored;
  touch(name);
  return true;
}

bool KvDiskTier::load(const DiskBlockId& id, std::span<std::byte> data) {
  const std::string name = file_key(id.key, id.kv_class);
  if (!index_.count(name)) return false;
  const std::string expected = header(id, data.size());
  const uint64_t size = expected.size() + data.size() + sizeof(uint64_t);
  std::ifstream in(path_of(name), std::ios::binary);
  std::string bytes(size, '\0');
  if (!in || !in.read(bytes.data(), static_cast<std::streamsize>(size))) {
    reject(name, in ? fmt::format("shorter than the {} bytes of a block", size) : "cannot be read");
    return false;
  }
  if (in.peek() != std::ifstream::traits_type::eof()) {
    reject(name, fmt::format("longer than the {} bytes of a block", size));
    return false;
  }
  if (bytes.compare(0, expected.size(), expected) != 0) {
    reject(name, "its header is not this block's (another model, adapter, precision, KV layout or prefix)");
    return false;
  }
  uint64_t checksum;
  std::memcpy(&checksum, bytes.data() + size - sizeof checksum, sizeof checksum);
  if (checksum != hash_bytes(as_bytes(std::string_view(bytes).substr(0, size - sizeof checksum)))) {
    reject(name, "its checksum does not match its contents");
    return false;
  }
  std::memcpy(data.data(), bytes.data() + expected.size(), data.size());
  ++stats_.loaded;
  touch(name);
  return true;
}

}  // namespace qs
