#include "text/pre_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>

namespace qs::text {
namespace {

using SplitBehavior = PreTokenizer::SplitBehavior;

struct Piece {
  size_t b, e;
  bool flag;  // is_match, then "remove"
};

// `w` cut at every occurrence of the step's pattern: the matches and the text between them, in order.
void match_pieces(std::string_view w, const PreTokenizer::SplitStep& step, std::vector<Piece>& pieces) {
  pieces.clear();
  size_t prev = 0;
  for (size_t hit = w.find(step.pattern); hit != std::string_view::npos;
       hit = w.find(step.pattern, hit + step.pattern.size())) {
    if (prev != hit) pieces.push_back({prev, hit, false});
    pieces.push_back({hit, hit + step.pattern.size(), true});
    prev = hit + step.pattern.size();
  }
  if (prev != w.size()) pieces.push_back({prev, w.size(), false});
  if (step.invert)
    for (auto& p : pieces) p.flag = !p.flag;
}

// tokenizers' SplitDelimiterBehavior: what becomes of the matches; out's flag says "remove".
void apply_behavior(SplitBehavior behavior, const std::vector<Piece>& pieces, std::vector<Piece>& out) {
  out.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto p : pieces) out.push_back({p.b, p.e, false});
      break;
    case SplitBehavior::kRemoved:
      out = pieces;
      break;
    case SplitBehavior::kContiguous:
      for (auto p : pieces) {
        if (p.flag == previous_match && !out.empty()) out.back().e = p.e;
        else out.push_back({p.b, p.e, false});
        previous_match = p.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (auto p : pieces) {
        if (p.flag && !previous_match && !out.empty()) out.back().e = p.e;
        else out.push_back({p.b, p.e, false});
        previous_match = p.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) out.back().b = it->b;
        else out.push_back({it->b, it->e, false});
        previous_match = it->flag;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
}

}  // namespace

PreTokenizer PreTokenizer::parse(const json* pre_tokenizer, const JsonFields& fields) {
  PreTokenizer out;
  if (pre_tokenizer) out.parse_step(*pre_tokenizer, "pre_tokenizer", fields);
  return out;
}

void PreTokenizer::parse_step(const json& n, const std::string& where, const JsonFields& fields) {
  if (n.is_null()) return;
  std::string type = fields.type_of(n, where);
  if (type == "Sequence") {
    const json* list = JsonFields::member(n, "pretokenizers");
    if (!list || !list->is_array()) fields.fail(where + ".pretokenizers must be an array");
    for (size_t i = 0; i < list->size(); ++i)
      parse_step((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i), fields);
  } else if (type == "Split") {
    SplitStep step;
    step.pattern = fields.literal_pattern(n, where);
    std::string b = fields.get_string(n, "behavior", where);
    if (b == "Removed") step.behavior = SplitBehavior::kRemoved;
    else if (b == "Isolated") step.behavior = SplitBehavior::kIsolated;
    else if (b == "MergedWithPrevious") step.behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") step.behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous") step.behavior = SplitBehavior::kContiguous;
    else fields.fail(fmt::format("{}.behavior \"{}\" is not a split behavior", where, b));
    step.invert = fields.get_bool(n, "invert", false, where);
    steps_.push_back(std::move(step));
  } else {
    fields.fail(fmt::format("{}: pre-tokenizer type \"{}\" is not supported (Split with a String pattern, Sequence)",
                            where, type));
  }
}

void PreTokenizer::split(std::string_view s, std::vector<std::string_view>& words) const {
  words.clear();
  if (!s.empty()) words.push_back(s);
  std::vector<std::string_view> next;
  std::vector<Piece> pieces, out;
  for (const SplitStep& step : steps_) {
    next.clear();
    for (std::string_view w : words) {
      match_pieces(w, step, pieces);
      apply_behavior(step.behavior, pieces, out);
      for (auto p : out)
        if (!p.flag && p.e > p.b) next.push_back(w.substr(p.b, p.e - p.b));
    }
    words.swap(next);
  }
}

}  // namespace qs::text
