#pragma once
// ConstraintSpec -> compiled grammar for one vocabulary, cached by the spec's text so that a repeated schema (every
// request of an agent loop) compiles once and shares its automaton and masks. Thread-safe.
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "constrain/constraint_spec.h"
#include "constrain/json_schema.h"
#include "constrain/matcher.h"

namespace qs {

class Tokenizer;

class GrammarCache {
 public:
  // vocab_size: the model's logits length.
  GrammarCache(const Tokenizer& tokenizer, size_t vocab_size, size_t capacity = 64);

  // Throws SchemaError (bad or unsupported schema, naming keyword and pointer) or qs::Error.
  std::shared_ptr<CompiledGrammar> get(const ConstraintSpec& spec);
  std::unique_ptr<GrammarMatcher> matcher(const ConstraintSpec& spec, std::vector<int32_t> end_ids) {
    return std::make_unique<GrammarMatcher>(get(spec), std::move(end_ids));
  }
  // A fresh grammar, outside the cache (benchmarks of the first request with a schema).
  std::shared_ptr<CompiledGrammar> compile_uncached(const ConstraintSpec& spec) const {
    return std::make_shared<CompiledGrammar>(compile(spec), vocab_);
  }
  const VocabIndex& vocab() const { return *vocab_; }
  const GemmaCallTokens& call_tokens() const { return tokens_; }
  size_t compiled_count() const;  // grammars compiled so far (cache misses)

 private:
  GrammarNetwork compile(const ConstraintSpec& spec) const;

  std::shared_ptr<const VocabIndex> vocab_;
  GemmaCallTokens tokens_;
  bool has_call_tokens_ = false;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::pair<std::shared_ptr<CompiledGrammar>, std::list<std::string>::iterator>> cache_;
  size_t compiled_ = 0;
};

// The text a spec is cached under (its kind and every field that changes the grammar).
std::string constraint_key(const ConstraintSpec& spec);

}  // namespace qs
