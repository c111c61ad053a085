#pragma once
// Per-request matching of tokens against a grammar network (constrain/grammar.h).
//
// A parse configuration is the set of NFA positions reachable after the bytes so far, each with its call stack
// (stacks are hash-consed: a thread is a pair of ints): a pushdown automaton run breadth first, so ambiguity costs
// nothing more than a larger set. Configurations are interned and their byte transitions memoised, which makes
// the grammar a lazily built DFA: after warm-up one byte of a token costs one table lookup. The token mask of a
// configuration walks the vocabulary trie (constrain/vocab_index.h) through that table, dropping a subtree at its
// first rejected byte, and is cached per configuration: positions that recur (inside a string, between members)
// cost a copy. All of this lives in the CompiledGrammar and is shared by every request with the same grammar.
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "constrain/grammar.h"
#include "constrain/vocab_index.h"

namespace qs {

class CompiledGrammar {
 public:
  CompiledGrammar(GrammarNetwork network, std::shared_ptr<const VocabIndex> vocab);

  struct Thread {
    int32_t state, stack;
    auto operator<=>(const Thread&) const = default;
  };
  struct Config {
    std::vector<Thread> threads;  // positions before a byte or special-token edge, sorted
    bool accepting = false;       // the root rule may end here
  };
  static constexpr int32_t kDead = 0;  // the configuration of a rejected prefix

  const VocabIndex& vocab() const { return *vocab_; }
  std::mutex& mutex() const { return mu_; }

  // The rest is called with mutex() held.
  int32_t initial();
  int32_t intern(Config config);
  const Config& config(int32_t id) const { return configs_[id]; }
  int32_t step_byte(int32_t id, uint8_t byte) {
    const int32_t next = transitions_[static_cast<size_t>(id) * 256 + byte];
    return next >= 0 ? next : compute_step(id, byte);
  }
  int32_t step_special(int32_t id, int32_t token);
  const std::vector<uint64_t>& mask(int32_t id);  // text and special tokens the grammar allows next
  uint64_t epoch() const { return epoch_; }
  // The fewest bytes or special tokens that complete the document from a configuration (for test drivers that
  // must finish a random walk).
  int64_t min_completion(int32_t id);
  // Drops the automaton and masks when they have grown past their bound (matchers re-intern their configuration).
  void reset_if_large();

 private:
  int32_t compute_step(int32_t id, uint8_t byte);
  int32_t closure(std::vector<Thread> seeds);
  int32_t push_stack(int32_t return_state, int32_t parent);

  struct StackNode {
    int32_t return_state, parent, depth;
  };
  GrammarNetwork net_;
  std::shared_ptr<const VocabIndex> vocab_;
  mutable std::mutex mu_;
  std::vector<StackNode> stacks_;                    // 0 = the empty stack
  std::unordered_map<uint64_t, int32_t> stack_ids_;  // (return state, parent) -> id
  std::vector<Config> configs_;
  std::unordered_map<std::string, int32_t> config_ids_;
  std::vector<int32_t> transitions_;  // configs x 256; -1 = not computed yet
  std::vector<std::vector<uint64_t>> masks_;  // per configuration; empty = not computed yet
  size_t masks_held_ = 0;
  std::vector<int64_t> distance_;  // per state: the fewest bytes to its rule's end (empty until asked)
  uint64_t epoch_ = 0;  // bumped when the tables are dropped to bound memory
};

// One request's position in a grammar. Not thread-safe; many matchers may share a CompiledGrammar.
class GrammarMatcher {
 public:
  // end_ids: the tokens that end the output (EOS, end of turn), allowed only where the document is complete.
  GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar, std::vector<int32_t> end_ids);

  // Sets `mask` (one bit per vocabulary id, (vocab + 63) / 64 words) to the tokens allowed next.
  void fill_mask(std::span<uint64_t> mask);
  // Advances by a token; false (and no change) when the grammar does not allow it.
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests, drivers); false and no change when rejected.
  bool accept_bytes(std::string_view bytes);
  bool is_complete() const;    // the document may end here
  bool is_terminated() const;  // complete, and nothing can follow
  bool is_end_token(int32_t id) const;
  // Identifies the parse configuration (equal ids: equal futures) while the grammar keeps its tables.
  int32_t configuration() const { return id_; }
  int64_t min_completion() const;  // see CompiledGrammar::min_completion

 private:
  int32_t current();  // the configuration id, re-interned if the grammar dropped its tables

  std::shared_ptr<CompiledGrammar> grammar_;
  std::vector<int32_t> end_ids_;
  CompiledGrammar::Config config_;
  int32_t id_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace qs
