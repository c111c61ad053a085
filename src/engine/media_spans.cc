#include "engine/media_spans.h"

#include <fmt/format.h>

#include <algorithm>

namespace qs {

std::optional<std::string> check_media(const EngineRequest& request, int64_t hidden, const MediaTowers* towers) {
  int64_t next_free = 0;
  for (size_t i = 0; i < request.media.size(); ++i) {
    const MediaSpan& span = request.media[i];
    const int64_t count = span.count;
    if (count <= 0 || span.first < next_free || span.first + count > static_cast<int64_t>(request.prompt.size()))
      return fmt::format("media[{}]: {} soft tokens at prompt position {} are not inside the {}-token prompt after "
                         "the previous media", i, count, span.first, request.prompt.size());
    if (span.embeddings.empty() ? !span.prepared || !towers
                                : count * hidden != static_cast<int64_t>(span.embeddings.size()))
      return span.embeddings.empty()
                 ? fmt::format("media[{}]: no soft tokens, and {}", i, span.prepared ? "no towers to encode it with"
                                                                                     : "no prepared input")
                 : fmt::format("media[{}]: {} values are not {} soft tokens of {}", i, span.embeddings.size(), count,
                               hidden);
    next_free = span.first + count;
  }
  return std::nullopt;
}

void key_media_positions(std::span<const MediaSpan> media, std::vector<int32_t>& tokens, int64_t key_vocab) {
  for (const MediaSpan& span : media) {
    const uint64_t h = span.key.hi ^ (span.key.lo * 0xff51afd7ed558ccdull);
    for (int64_t j = 0; j < span.count; ++j) {
      uint64_t z = h + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(j + 1);  // splitmix64's finalizer
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      tokens[span.first + j] = static_cast<int32_t>((z ^ (z >> 31)) % static_cast<uint64_t>(key_vocab));
    }
  }
}

int64_t chunk_outside_media(std::span<const MediaSpan> media, int64_t start, int64_t n) {
  for (const MediaSpan& span : media) {
    const int64_t end = span.first + span.count;
    if (span.first < start + n && start + n < end) return span.first > start ? span.first - start : end - start;
  }
  return n;
}

std::vector<SoftTokens> step_soft_tokens(std::span<const MediaSpan> media, int64_t start, int64_t n, int64_t hidden) {
  std::vector<SoftTokens> out;
  for (const MediaSpan& span : media) {
    const int64_t lo = std::max(span.first, start), hi = std::min(span.first + span.count, start + n);
    if (lo < hi)
      out.push_back({lo - start, std::span(span.embeddings).subspan((lo - span.first) * hidden, (hi - lo) * hidden),
                     span.vision});
  }
  return out;
}

}  // namespace qs
