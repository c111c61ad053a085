#include "engine/stop_strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace qs {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i)
    if (stops_[i].empty()) throw Error(fmt::format("stop: string {} is empty; expected non-empty stop strings", i));
}

// Before this push nothing in held_ completed a stop string, so the first occurrence of each stop is where it is
// completed earliest; among stops, the smallest end is what byte-by-byte streaming would have hit first.
std::optional<StopStringMatcher::Match> StopStringMatcher::first_completed_match() const {
  std::optional<Match> best;
  for (size_t s = 0; s < stops_.size(); ++s) {
    size_t begin = held_.find(stops_[s]);
    if (begin == std::string::npos) continue;
    Match m{begin, begin + stops_[s].size(), s};
    if (!best || m.end < best->end || (m.end == best->end && m.begin < best->begin)) best = m;
  }
  return best;
}

// The length of the longest tail of held_ that is a proper prefix of some stop string: that much must wait.
size_t StopStringMatcher::longest_partial_suffix() const {
  size_t longest = 0;
  for (const std::string& stop : stops_) {
    size_t max_len = std::min(stop.size() - 1, held_.size());
    for (size_t len = max_len; len > longest; --len)
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(stop).substr(0, len)) {
        longest = len;
        break;
      }
  }
  return longest;
}

StopScan StopStringMatcher::push(std::string_view piece) {
  if (stopped()) return {"", stopped_by_};
  held_.append(piece);
  if (auto match = first_completed_match()) {
    stopped_by_ = match->stop;
    StopScan out{held_.substr(0, match->begin), stopped_by_};
    held_.clear();
    return out;
  }
  size_t keep = longest_partial_suffix();
  StopScan out{held_.substr(0, held_.size() - keep), std::nullopt};
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::finish() {
  if (stopped()) return "";
  return std::exchange(held_, {});
}

}  // namespace qs
