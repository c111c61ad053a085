#include "constrain/matcher.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "util/error.h"

namespace qs {
namespace {

// Recursion deeper than this (through rules that consume nothing first) is cut, so a left-recursive grammar ends.
constexpr int32_t kMaxStackDepth = 4096;
// Memory bounds of the shared tables: past them the automaton and masks are dropped and rebuilt as needed.
constexpr size_t kMaxConfigs = 50'000;  // ~1 KB of transitions each
constexpr size_t kMaxMasks = 512;

uint64_t pack(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

std::string key_of(const CompiledGrammar::Config& c) {
  std::string key(1, c.accepting ? '1' : '0');
  key.append(reinterpret_cast<const char*>(c.threads.data()), c.threads.size() * sizeof(CompiledGrammar::Thread));
  return key;
}

}  // namespace

CompiledGrammar::CompiledGrammar(GrammarNetwork network, std::shared_ptr<const VocabIndex> vocab)
    : net_(std::move(network)), vocab_(std::move(vocab)) {
  stacks_.push_back({-1, -1, 0});
  intern({});  // kDead
}

int32_t CompiledGrammar::initial() { return closure({{net_.rule_start[net_.root], 0}}); }

void CompiledGrammar::reset_if_large() {
  if (configs_.size() <= kMaxConfigs) return;
  configs_.clear();
  config_ids_.clear();
  transitions_.clear();
  masks_.clear();
  masks_held_ = 0;
  intern({});  // kDead
  ++epoch_;
}

int32_t CompiledGrammar::intern(Config config) {
  std::string key = key_of(config);
  auto it = config_ids_.find(key);
  if (it != config_ids_.end()) return it->second;
  const auto id = static_cast<int32_t>(configs_.size());
  configs_.push_back(std::move(config));
  config_ids_.emplace(std::move(key), id);
  transitions_.resize(transitions_.size() + 256, -1);
  masks_.emplace_back();
  return id;
}

int32_t CompiledGrammar::push_stack(int32_t return_state, int32_t parent) {
  auto [it, inserted] = stack_ids_.try_emplace(pack(return_state, parent), static_cast<int32_t>(stacks_.size()));
  if (inserted) stacks_.push_back({return_state, parent, stacks_[parent].depth + 1});
  return it->second;
}

// Follows epsilon edges, calls (push) and rule ends (pop) from the seeds; keeps the threads that wait on a byte
// or a special token.
int32_t CompiledGrammar::closure(std::vector<Thread> seeds) {
  Config out;
  std::unordered_set<uint64_t> seen;
  std::vector<Thread> work;
  auto visit = [&](Thread t) {
    if (seen.insert(pack(t.state, t.stack)).second) work.push_back(t);
  };
  for (Thread t : seeds) visit(t);
  while (!work.empty()) {
    const Thread t = work.back();
    work.pop_back();
    bool waits = false;
    for (const auto& e : net_.edges[t.state]) {
      switch (e.kind) {
        case GrammarNetwork::EdgeKind::Bytes:
        case GrammarNetwork::EdgeKind::Special: waits = true; break;
        case GrammarNetwork::EdgeKind::Epsilon: visit({e.target, t.stack}); break;
        case GrammarNetwork::EdgeKind::Call:
          if (stacks_[t.stack].depth < kMaxStackDepth) visit({net_.rule_start[e.arg], push_stack(e.target, t.stack)});
          break;
      }
    }
    if (waits) out.threads.push_back(t);
    if (t.state == net_.rule_end[net_.rule_of[t.state]]) {
      if (t.stack == 0) out.accepting = true;
      else visit({stacks_[t.stack].return_state, stacks_[t.stack].parent});
    }
  }
  std::sort(out.threads.begin(), out.threads.end());
  return intern(std::move(out));
}

int32_t CompiledGrammar::compute_step(int32_t id, uint8_t byte) {
  std::vector<Thread> seeds;
  for (const Thread& t : configs_[id].threads)
    for (const auto& e : net_.edges[t.state])
      if (e.kind == GrammarNetwork::EdgeKind::Bytes && net_.classes[e.arg].has(byte)) seeds.push_back({e.target, t.stack});
  const int32_t next = seeds.empty() ? kDead : closure(std::move(seeds));
  transitions_[static_cast<size_t>(id) * 256 + byte] = next;
  return next;
}

int32_t CompiledGrammar::step_special(int32_t id, int32_t token) {
  std::vector<Thread> seeds;
  for (const Thread& t : configs_[id].threads)
    for (const auto& e : net_.edges[t.state])
      if (e.kind == GrammarNetwork::EdgeKind::Special && e.arg == token) seeds.push_back({e.target, t.stack});
  return seeds.empty() ? kDead : closure(std::move(seeds));
}

const std::vector<uint64_t>& CompiledGrammar::mask(int32_t id) {
  if (!masks_[id].empty()) return masks_[id];
  if (masks_held_ >= kMaxMasks) {
    for (auto& m : masks_) std::vector<uint64_t>().swap(m);
    masks_held_ = 0;
  }
  const VocabIndex& v = *vocab_;
  std::vector<uint64_t> bits((v.vocab_size() + 63) / 64, 0);
  const auto trie = v.trie();
  const auto ids = v.token_ids();
  std::vector<int32_t> at(v.max_depth() + 1);
  at[0] = id;
  for (size_t i = 0; i < trie.size();) {
    const auto& node = trie[i];
    const int32_t next = step_byte(at[node.depth - 1], node.byte);
    if (next == kDead) {
      i = node.subtree_end;
      continue;
    }
    at[node.depth] = next;
    for (int32_t k = node.tokens_begin; k < node.tokens_end; ++k) bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
    ++i;
  }
  for (const Thread& t : configs_[id].threads)
    for (const auto& e : net_.edges[t.state])
      if (e.kind == GrammarNetwork::EdgeKind::Special && static_cast<size_t>(e.arg) < v.vocab_size())
        bits[e.arg >> 6] |= uint64_t{1} << (e.arg & 63);
  ++masks_held_;
  return masks_[id] = std::move(bits);
}

int64_t CompiledGrammar::min_completion(int32_t id) {
  constexpr int64_t kFar = int64_t{1} << 40;
  if (distance_.empty()) {
    // Shortest paths to each rule's end, calls weighted by their rule's shortest string: a fixpoint, swept in
    // reverse state order since the NFAs are built mostly forward.
    const size_t n = net_.edges.size();
    distance_.assign(n, kFar);
    for (int32_t end : net_.rule_end)
      if (end >= 0) distance_[end] = 0;
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t s = n; s-- > 0;)
        for (const auto& e : net_.edges[s]) {
          int64_t d = distance_[e.target];
          if (e.kind == GrammarNetwork::EdgeKind::Bytes || e.kind == GrammarNetwork::EdgeKind::Special) d += 1;
          if (e.kind == GrammarNetwork::EdgeKind::Call) d += distance_[net_.rule_start[e.arg]];
          if (d < distance_[s]) distance_[s] = d, changed = true;
        }
    }
  }
  int64_t best = configs_[id].accepting ? 0 : kFar;
  for (const Thread& t : configs_[id].threads) {
    int64_t d = distance_[t.state];
    for (int32_t k = t.stack; k != 0; k = stacks_[k].parent) d += distance_[stacks_[k].return_state];
    best = std::min(best, d);
  }
  return best;
}

int64_t GrammarMatcher::min_completion() const {
  std::lock_guard lock(grammar_->mutex());
  return grammar_->min_completion(id_);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar, std::vector<int32_t> end_ids)
    : grammar_(std::move(grammar)), end_ids_(std::move(end_ids)) {
  std::lock_guard lock(grammar_->mutex());
  id_ = grammar_->initial();
  config_ = grammar_->config(id_);
  epoch_ = grammar_->epoch();
}

int32_t GrammarMatcher::current() {
  grammar_->reset_if_large();
  if (epoch_ != grammar_->epoch()) {
    id_ = grammar_->intern(config_);
    epoch_ = grammar_->epoch();
  }
  return id_;
}

void GrammarMatcher::fill_mask(std::span<uint64_t> mask) {
  std::lock_guard lock(grammar_->mutex());
  const auto& bits = grammar_->mask(current());
  std::fill(mask.begin(), mask.end(), 0);
  std::copy_n(bits.begin(), std::min(bits.size(), mask.size()), mask.begin());
  if (config_.accepting)
    for (int32_t id : end_ids_)
      if (id >= 0 && static_cast<size_t>(id) < mask.size() * 64) mask[id >> 6] |= uint64_t{1} << (id & 63);
}

bool GrammarMatcher::is_end_token(int32_t id) const { return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end(); }

bool GrammarMatcher::accept_token(int32_t id) {
  const VocabIndex& v = grammar_->vocab();
  if (id < 0 || static_cast<size_t>(id) >= v.vocab_size()) return false;
  std::lock_guard lock(grammar_->mutex());
  int32_t next;
  if (v.is_special(id)) {
    next = grammar_->step_special(current(), id);
  } else {
    const std::string& bytes = v.token_bytes(id);
    if (bytes.empty()) return false;
    next = current();
    for (unsigned char b : bytes) {
      next = grammar_->step_byte(next, b);
      if (next == CompiledGrammar::kDead) break;
    }
  }
  if (next == CompiledGrammar::kDead) return false;
  id_ = next;
  config_ = grammar_->config(next);
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  std::lock_guard lock(grammar_->mutex());
  int32_t next = current();
  for (unsigned char b : bytes) {
    next = grammar_->step_byte(next, b);
    if (next == CompiledGrammar::kDead) return false;
  }
  id_ = next;
  config_ = grammar_->config(next);
  return true;
}

bool GrammarMatcher::is_complete() const { return config_.accepting; }
bool GrammarMatcher::is_terminated() const { return config_.accepting && config_.threads.empty(); }

}  // namespace qs
