#pragma once
// A sequence's constrained decoding (src/constrain): the matcher of its request's ConstraintSpec, started at once
// or at a trigger token, advanced once per sampled token and never on prefill, so a preempted sequence that
// recomputes its prompt and output keeps it as it is.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "constrain/constraint_spec.h"
#include "constrain/grammar_cache.h"

namespace qs {

class Tokenizer;

class OutputConstraint {
 public:
  bool active() const { return matcher_ != nullptr; }
  // This step's mask: empty (every token allowed) before the constraint starts or without one.
  std::span<const uint64_t> mask();
  // After a sampled token (not a stop): advances the matcher, or starts it at its trigger (the end of the thought
  // channel is not the grammar's; a tool call's opener is its first token). True when the grammar is complete and
  // nothing can follow, so the output ends here.
  bool advance(int32_t token);

 private:
  friend class ConstraintCompiler;
  std::unique_ptr<GrammarMatcher> matcher_;
  bool started_ = false;
  std::optional<int32_t> trigger_;
  bool trigger_in_grammar_ = false;
  std::vector<uint64_t> allowed_;  // the mask, reused across steps
};

// Compiles (or finds cached) requests' grammars, for sequences of any submitting thread; its vocabulary trie is
// built at the first constrained request.
class ConstraintCompiler {
 public:
  // Errors (an unsupported schema keyword, ...) reach the caller at submit, except under tool_choice auto
  // (Start::AtToolCall), whose calls then stay free, as without the grammar, rather than refuse a request that
  // asked for no constraint. end_ids: the tokens that end the output (a complete grammar allows them).
  OutputConstraint start(const ConstraintSpec& spec, const Tokenizer* tokenizer, int64_t vocab,
                         std::vector<int32_t> end_ids);

 private:
  std::mutex mu_;
  std::unique_ptr<GrammarCache> grammars_;
  std::optional<int32_t> thinking_end_, call_start_;  // `<channel|>`, `<|tool_call>`
};

}  // namespace qs
