#pragma once
// Stop strings over streamed text. Detokenized text arrives a piece per token; a stop string can span pieces, so
// any tail that could still grow into a stop string is held back until it either completes one (generation stops,
// and neither the stop string nor anything after it is emitted, as OpenAI does) or turns out not to.
//
// Matching is chunk-independent: the result is what feeding the same text one byte at a time would give, i.e. the
// stop string that is completed first wins (on a tie, the one that starts first). So with stops {"abcd", "bc"},
// "abcd" stops after "a" however the text is split.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

struct StopScan {
  std::string text;                  // safe to send to the client now
  std::optional<size_t> stopped_by;  // index into the stop list once a stop string has matched
};

class StopStringMatcher {
 public:
  // Throws qs::Error for an empty stop string. No stop strings: every piece passes straight through.
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends one detokenized piece. After a stop, further pieces are ignored (empty text, same stopped_by).
  StopScan push(std::string_view piece);
  // Generation ended another way (EOS, length): the held-back tail is real text after all.
  std::string finish();

  bool stopped() const { return stopped_by_.has_value(); }
  std::optional<size_t> stopped_by() const { return stopped_by_; }  // index into the stop list
  const std::string& held() const { return held_; }

 private:
  struct Match {
    size_t begin, end, stop;
  };
  std::optional<Match> first_completed_match() const;
  size_t longest_partial_suffix() const;

  std::vector<std::string> stops_;
  std::string held_;  // text received but not yet emitted: a possible start of a stop string
  std::optional<size_t> stopped_by_;
};

}  // namespace qs
