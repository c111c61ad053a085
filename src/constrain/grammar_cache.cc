#include "constrain/grammar_cache.h"

#include <fmt/format.h>

#include "text/tokenizer.h"

namespace qs {

std::string constraint_key(const ConstraintSpec& spec) {
  std::string key = fmt::format("{}|", static_cast<int>(spec.kind));
  if (spec.kind == ConstraintSpec::Kind::JsonSchema) key += spec.schema.dump();
  if (!spec.tools.empty()) {
    key += spec.parallel_calls ? "parallel|" : "single|";
    for (const ToolSpec& t : spec.tools) key += nlohmann::json({t.name, t.parameters}).dump() + "|";
  }
  return key;
}

GrammarCache::GrammarCache(const Tokenizer& tokenizer, size_t vocab_size, size_t capacity)
    : vocab_(std::make_shared<VocabIndex>(tokenizer, vocab_size)), capacity_(capacity) {
  auto quote = tokenizer.token_id("<|\"|>"), start = tokenizer.token_id("<|tool_call>"), end = tokenizer.token_id("<tool_call|>");
  if (quote && start && end) {
    tokens_ = {*quote, *start, *end};
    has_call_tokens_ = true;
  }
}

size_t GrammarCache::compiled_count() const {
  std::lock_guard lock(mu_);
  return compiled_;
}

GrammarNetwork GrammarCache::compile(const ConstraintSpec& spec) const {
  if (!spec.tools.empty() && !has_call_tokens_)
    throw Error("tool calls: the tokenizer lacks Gemma 4's <|tool_call>, <tool_call|> or <|\"|> token");
  const bool or_calls = !spec.tools.empty();
  switch (spec.kind) {
    case ConstraintSpec::Kind::JsonObject:
      return or_calls ? json_or_tool_calls_grammar(nullptr, spec.tools, spec.parallel_calls, tokens_)
                      : json_object_grammar();
    case ConstraintSpec::Kind::JsonSchema:
      return or_calls ? json_or_tool_calls_grammar(&spec.schema, spec.tools, spec.parallel_calls, tokens_)
                      : json_schema_grammar(spec.schema, JsonSyntax::Json);
    case ConstraintSpec::Kind::ToolCalls: return tool_calls_grammar(spec.tools, spec.parallel_calls, tokens_);
    case ConstraintSpec::Kind::None: break;
  }
  throw Error("constraint: nothing to compile for an unconstrained request");
}

std::shared_ptr<CompiledGrammar> GrammarCache::get(const ConstraintSpec& spec) {
  const std::string key = constraint_key(spec);
  {
    std::lock_guard lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  // Compiled outside the lock: a slow schema does not hold up requests whose grammar is cached.
  auto grammar = std::make_shared<CompiledGrammar>(compile(spec), vocab_);
  std::lock_guard lock(mu_);
  ++compiled_;
  if (cache_.contains(key)) return cache_[key].first;
  lru_.push_front(key);
  cache_.emplace(key, std::make_pair(grammar, lru_.begin()));
  if (cache_.size() > capacity_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return grammar;
}

}  // namespace qs
