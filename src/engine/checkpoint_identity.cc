#include "engine/checkpoint_identity.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "formats/checkpoint.h"
#include "model/kv_disk_tier.h"
#include "util/file.h"

namespace qs {

uint64_t checkpoint_identity(const Checkpoint& checkpoint) {
  constexpr uint64_t kSample = 4096;
  uint64_t h = 0;
  if (auto config = checkpoint.config_path()) h = hash_text(read_file(*config), h);
  for (const TensorRef& t : checkpoint.tensors()) {
    h = hash_text(fmt::format("{} {} [{}]", t.name(), static_cast<int>(t.dtype()), fmt::join(t.shape(), ",")), h);
    const std::span<const std::byte> bytes = t.bytes();
    const uint64_t n = bytes.size(), take = std::min(n, kSample);
    for (uint64_t at : {uint64_t{0}, (n - take) / 2, n - take}) h = hash_bytes(bytes.subspan(at, take), h);
  }
  return h;
}

}  // namespace qs
