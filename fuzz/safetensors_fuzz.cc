// libFuzzer target: arbitrary bytes as a whole safetensors file image.
// parse_safetensors must either throw qs::Error or return a header that keeps its own promises: tensors
// sorted, contiguous from 0, each holding product(shape) x dtype size bytes, together covering exactly the
// data buffer. Any other exception, a sanitizer report or a broken promise aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "formats/safetensors.h"
#include "util/error.h"

namespace {

[[noreturn]] void broken(const char* what, const qs::TensorEntry* t) {
  std::fprintf(stderr, "parse_safetensors accepted a file but %s%s%s\n", what, t ? ": tensor " : "",
               t ? t->name.c_str() : "");
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  qs::SafetensorsHeader h;
  try {
    h = qs::parse_safetensors(file, "fuzz.safetensors");
  } catch (const qs::Error& e) {
    if (std::string_view(e.what()).substr(0, 17) != "fuzz.safetensors:") broken("an error does not name the file", nullptr);
    return 0;
  }
  if (h.data_start < 8 || h.data_start > size) broken("data_start lies outside the file", nullptr);
  uint64_t covered = 0;
  for (const qs::TensorEntry& t : h.tensors) {
    if (t.begin != covered || t.end < t.begin) broken("offsets are not contiguous", &t);
    covered = t.end;
    uint64_t bytes = qs::dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) broken("a shape entry is negative", &t);
      bytes *= static_cast<uint64_t>(d);  // wraps only if a later 0 makes the product 0 anyway
    }
    if (bytes != t.nbytes()) broken("byte length disagrees with dtype x shape", &t);
    int64_t n = t.numel();  // consumers call this: it must not overflow (UBSan watches)
    if (n < 0) broken("numel() is negative", &t);
    if (qs::dtype_name(t.dtype).empty()) broken("dtype has no name", &t);
    if (t.nbytes() > 0) {  // ASan checks that the bytes lie inside the input
      volatile std::byte first = file[h.data_start + t.begin], last = file[h.data_start + t.end - 1];
      (void)first;
      (void)last;
    }
  }
  if (h.data_start + covered != size) broken("tensors do not cover the data buffer exactly", nullptr);
  for (const auto& [k, v] : h.metadata) (void)(k.size() + v.size());
  return 0;
}
