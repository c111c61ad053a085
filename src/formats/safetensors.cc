#include "formats/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace qs {
namespace {

using json = nlohmann::json;

// A valid header nests 3 deep (object -> tensor -> shape). Anything far deeper is rejected while parsing,
// before the recursive json::dump() in an error message could overflow the stack on it.
constexpr int kMaxJsonDepth = 64;

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

[[noreturn]] void fail(std::string_view label, const std::string& what) {
  throw Error(fmt::format("{}: {}", label, what));
}

uint64_t as_u64(const json& v, std::string_view label, const std::string& where) {
  if (!v.is_number_unsigned())  // nlohmann parses every non-negative integer as unsigned
    fail(label, fmt::format("{} must be a non-negative integer, got {}", where, v.dump()));
  return v.get<uint64_t>();
}

TensorEntry parse_entry(const std::string& name, const json& v, std::string_view label) {
  std::string where = fmt::format("tensor '{}'", name);
  if (!v.is_object()) fail(label, where + " must be an object with dtype, shape and data_offsets");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(label, fmt::format("{} has no '{}'", where, key));
  TensorEntry t;
  t.name = name;
  const json& dt = v["dtype"];
  auto parsed = dt.is_string() ? parse_dtype(dt.get<std::string>()) : std::nullopt;
  if (!parsed) fail(label, fmt::format("{} has unknown dtype {}", where, dt.dump()));
  t.dtype = *parsed;
  const json& shape = v["shape"];
  if (!shape.is_array()) fail(label, fmt::format("{} shape must be an array, got {}", where, shape.dump()));
  for (const json& d : shape) {
    uint64_t dim = as_u64(d, label, where + " shape entry");
    if (dim > static_cast<uint64_t>(INT64_MAX)) fail(label, where + " shape entry is too large");
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(label, fmt::format("{} data_offsets must be [begin, end], got {}", where, off.dump()));
  t.begin = as_u64(off[0], label, where + " data_offsets[0]");
  t.end = as_u64(off[1], label, where + " data_offsets[1]");
  if (t.end < t.begin)
    fail(label, fmt::format("{} data_offsets [{}, {}] end before begin", where, t.begin, t.end));
  // Element count too (as the reference's checked product does): a 0 late in the shape makes the byte count
  // 0 even when the dims before it multiply past what numel()'s int64 holds.
  uint64_t expected = dtype_size(t.dtype);
  int64_t elements = 1;
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected) ||
        __builtin_mul_overflow(elements, d, &elements))
      fail(label, fmt::format("{} shape overflows a 64-bit byte or element count", where));
  if (t.end - t.begin != expected)
    fail(label, fmt::format("{} holds {} bytes but dtype {} and shape [{}] need {}", where, t.end - t.begin,
                            dtype_name(t.dtype), fmt::join(t.shape, ", "), expected));
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& v, std::string_view label) {
  if (v.is_null()) return {};
  if (!v.is_object()) fail(label, "__metadata__ must be an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string()) fail(label, fmt::format("__metadata__['{}'] must be a string, got {}", k, val.dump()));
    out[k] = val.get<std::string>();
  }
  return out;
}

// nlohmann::json keeps the last of duplicate keys silently; safetensors forbids them.
json parse_header_json(std::string_view text, std::string_view label) {
  std::set<std::string> top_keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      fail(label, fmt::format("header nests JSON more than {} levels deep", kMaxJsonDepth));
    if (event == json::parse_event_t::key && depth == 1 && !top_keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail(label, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!duplicate.empty()) fail(label, fmt::format("header names tensor '{}' twice", duplicate));
  if (!j.is_object()) fail(label, "header must be a JSON object");
  return j;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label) {
  if (file.size() < 8)
    fail(label, fmt::format("file is {} bytes; a safetensors file starts with an 8-byte header length",
                            file.size()));
  uint64_t n = load_unaligned<uint64_t>(file.data());  // little-endian host
  if (n > kMaxHeaderBytes)
    fail(label, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderBytes));
  if (8 + n > file.size())
    fail(label, fmt::format("header length {} runs past the end of the {}-byte file", n, file.size()));
  std::string_view text(reinterpret_cast<const char*>(file.data() + 8), n);
  if (!is_valid_utf8(text)) fail(label, "header is not valid UTF-8");
  json j = parse_header_json(text, label);

  SafetensorsHeader h;
  h.data_start = 8 + n;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__")
      h.metadata = parse_metadata(v, label);
    else
      h.tensors.push_back(parse_entry(name, v, label));
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != expected_begin)
      fail(label, fmt::format("tensor '{}' starts at byte {} of the data buffer but the previous tensor ends at "
                              "{} (offsets must be contiguous: no gaps, no overlap)",
                              t.name, t.begin, expected_begin));
    expected_begin = t.end;
  }
  uint64_t buffer = file.size() - h.data_start;
  if (expected_begin != buffer)
    fail(label, fmt::format("tensors cover {} bytes but the data buffer holds {} bytes{}", expected_begin, buffer,
                            expected_begin > buffer ? " (file truncated?)" : " (trailing bytes)"));
  return h;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  std::string label = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(label, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(label, "not a regular file");
  }
  SafetensorsFile f;
  f.path_ = path;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(label, fmt::format("cannot map {} bytes: {}", f.size_, std::strerror(e)));
    }
    f.base_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  f.header_ = parse_safetensors({f.base_, f.size_}, label);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_.emplace(f.header_.tensors[i].name, i);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(const_cast<std::byte*>(base_), size_);
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    header_ = std::move(o.header_);
    index_ = std::move(o.index_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) munmap(const_cast<std::byte*>(base_), size_);
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> SafetensorsFile::data(const TensorEntry& t) const {
  return {base_ + header_.data_start + t.begin, t.nbytes()};
}

void SafetensorsFile::release(const TensorEntry& t, uint64_t from, uint64_t to) const {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t begin = header_.data_start + t.begin + from, end = header_.data_start + t.begin + std::min(to, t.nbytes());
  uint64_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) madvise(const_cast<std::byte*>(base_ + first), last - first, MADV_DONTNEED);
}

}  // namespace qs
