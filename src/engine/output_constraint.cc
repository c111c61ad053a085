#include "engine/output_constraint.h"

#include <fmt/format.h>

#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {

std::span<const uint64_t> OutputConstraint::mask() {
  if (!matcher_ || !started_) return {};
  matcher_->fill_mask(allowed_);
  return allowed_;
}

bool OutputConstraint::advance(int32_t token) {
  if (!matcher_) return false;
  if (!started_) {
    started_ = token == trigger_;
    if (!started_ || !trigger_in_grammar_) return false;
  }
  if (!matcher_->accept_token(token))
    throw Error(fmt::format("constrained decoding: sampled token {} is not allowed by the grammar", token));
  return matcher_->is_terminated();
}

OutputConstraint ConstraintCompiler::start(const ConstraintSpec& spec, const Tokenizer* tokenizer, int64_t vocab,
                                           std::vector<int32_t> end_ids) {
  using Start = ConstraintSpec::Start;
  if (!tokenizer) throw Error("response_format / tools: constrained output needs the checkpoint's tokenizer");
  {
    std::lock_guard lock(mu_);
    if (!grammars_) {
      grammars_ = std::make_unique<GrammarCache>(*tokenizer, static_cast<size_t>(vocab));
      thinking_end_ = tokenizer->token_id("<channel|>");
      call_start_ = tokenizer->token_id("<|tool_call>");
    }
  }
  if (spec.start == Start::AfterThinking && !thinking_end_)
    throw Error("constraint after thinking: the tokenizer has no <channel|> token");
  OutputConstraint out;
  try {
    out.matcher_ = grammars_->matcher(spec, std::move(end_ids));
  } catch (const Error&) {
    if (spec.start == Start::AtToolCall) return {};
    throw;
  }
  out.allowed_.resize((vocab + 63) / 64);
  out.started_ = spec.start == Start::Now;
  out.trigger_ = spec.start == Start::AfterThinking ? thinking_end_
                 : spec.start == Start::AtToolCall  ? call_start_
                                                    : std::nullopt;
  out.trigger_in_grammar_ = spec.start == Start::AtToolCall;
  return out;
}

}  // namespace qs
