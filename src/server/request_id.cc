#include "server/request_id.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "server/openai_protocol.h"

namespace qs {

bool valid_request_id(std::string_view id) {
  return id.size() <= kMaxRequestIdBytes &&
         std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
}

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

void check_request_id(std::string_view id) {
  if (valid_request_id(id)) return;
  throw ApiError(400, fmt::format("X-Request-Id must be at most {} visible ASCII characters (no spaces)",
                                  kMaxRequestIdBytes), "X-Request-Id");
}

}  // namespace qs
