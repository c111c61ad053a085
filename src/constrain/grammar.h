#pragma once
// A context-free grammar over bytes, built from expressions (literals, byte classes, sequences, alternatives,
// bounded or unbounded repetition, references to named rules, which may recurse) plus terminals that are one
// special token of the tokenizer (e.g. Gemma 4's string delimiter `<|"|>`): special tokens never match as text.
//
// build() turns it into one recursive transition network: per rule a byte NFA (Thompson construction, repetition
// unrolled) whose edges consume a byte class or a special token, or call another rule. Parts that can derive no
// finite string (an empty alternative, a rule that only recurses) are pruned first, so every prefix the network
// accepts can still be completed; a root that derives nothing is an error.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  ByteSet& add(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
    return *this;
  }
  ByteSet& add(uint8_t b) { return add(b, b); }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  ByteSet minus(const ByteSet& o) const {
    ByteSet r;
    for (int i = 0; i < 4; ++i) r.bits[i] = bits[i] & ~o.bits[i];
    return r;
  }
};

// The network build() produces. Rule r's NFA starts at rule_start[r] and accepts at rule_end[r].
struct GrammarNetwork {
  enum class EdgeKind : uint8_t { Bytes, Special, Epsilon, Call };
  struct Edge {
    EdgeKind kind;
    int32_t arg;     // Bytes: index into classes; Special: token id; Call: rule
    int32_t target;  // the state after the edge (after the call returns, for Call)
  };
  std::vector<std::vector<Edge>> edges;  // per state
  std::vector<int32_t> rule_of;          // per state: the rule its NFA belongs to
  std::vector<ByteSet> classes;
  std::vector<int32_t> rule_start, rule_end;
  std::vector<std::string> rule_names;
  int32_t root = 0;
};

class GrammarBuilder {
 public:
  using Node = int32_t;
  using Rule = int32_t;
  static constexpr int32_t kUnbounded = -1;

  Node bytes(const ByteSet& set);
  Node byte_range(uint8_t lo, uint8_t hi) { return bytes(ByteSet().add(lo, hi)); }
  Node literal(std::string_view text);  // its bytes in order; "" is the empty string
  Node special(int32_t token_id);
  Node empty() { return literal(""); }
  Node seq(std::vector<Node> parts);
  Node alt(std::vector<Node> options);  // no options: derives nothing
  Node repeat(Node node, int32_t min, int32_t max);  // max kUnbounded = no limit
  Node optional(Node node) { return repeat(node, 0, 1); }
  Node star(Node node) { return repeat(node, 0, kUnbounded); }
  Node ref(Rule rule);

  Rule declare(std::string name);
  void define(Rule rule, Node body);

  // Throws qs::Error when the root derives no string or the network would be unreasonably large.
  GrammarNetwork build(Rule root) const;

  struct Expr {
    enum Kind : uint8_t { Bytes, Literal, Special, Seq, Alt, Repeat, Ref } kind;
    int32_t a = 0, b = 0;        // Bytes: class; Special: token; Repeat: min, max; Ref: rule
    std::string text;            // Literal
    std::vector<Node> children;  // Seq, Alt, Repeat (one)
  };

 private:
  std::vector<Expr> exprs_;
  std::vector<ByteSet> classes_;
  std::vector<std::string> names_;
  std::vector<Node> bodies_;
  friend class NetworkCompiler;
};

}  // namespace qs
