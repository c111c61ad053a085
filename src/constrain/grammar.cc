#include "constrain/grammar.h"

#include <fmt/format.h>

#include "util/error.h"

namespace qs {

namespace {
// Past this many NFA states a grammar is refused rather than built: bounded repetitions are unrolled, so a
// 40-byte schema (maxLength 4000000, nested {1000} quantifiers) would otherwise cost hundreds of MB and seconds of a
// server thread (found by fuzz/json_schema_fuzz). 200k states is ~20 MB; a 20-tool schema needs a few thousand.
constexpr size_t kMaxStates = 200'000;
}  // namespace

GrammarBuilder::Node GrammarBuilder::bytes(const ByteSet& set) {
  classes_.push_back(set);
  exprs_.push_back({Expr::Bytes, static_cast<int32_t>(classes_.size() - 1)});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::literal(std::string_view text) {
  exprs_.push_back({Expr::Literal, 0, 0, std::string(text)});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::special(int32_t token_id) {
  exprs_.push_back({Expr::Special, token_id});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::seq(std::vector<Node> parts) {
  if (parts.size() == 1) return parts[0];
  exprs_.push_back({Expr::Seq, 0, 0, {}, std::move(parts)});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::alt(std::vector<Node> options) {
  if (options.size() == 1) return options[0];
  exprs_.push_back({Expr::Alt, 0, 0, {}, std::move(options)});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::repeat(Node node, int32_t min, int32_t max) {
  if (min < 0 || (max != kUnbounded && max < min))
    throw Error(fmt::format("grammar: repetition {{{},{}}} is empty", min, max));
  exprs_.push_back({Expr::Repeat, min, max, {}, {node}});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::ref(Rule rule) {
  exprs_.push_back({Expr::Ref, rule});
  return static_cast<Node>(exprs_.size() - 1);
}

GrammarBuilder::Rule GrammarBuilder::declare(std::string name) {
  names_.push_back(std::move(name));
  bodies_.push_back(-1);
  return static_cast<Rule>(names_.size() - 1);
}

void GrammarBuilder::define(Rule rule, Node body) { bodies_[rule] = body; }

// Builds the network of one GrammarBuilder: which nodes derive a finite string, then each rule's NFA.
class NetworkCompiler {
 public:
  explicit NetworkCompiler(const GrammarBuilder& g) : g_(g), rule_ok_(g.names_.size(), 0) {
    for (size_t r = 0; r < g.bodies_.size(); ++r)
      if (g.bodies_[r] < 0) throw Error(fmt::format("grammar: rule \"{}\" is declared but never defined", g.names_[r]));
  }

  GrammarNetwork run(GrammarBuilder::Rule root) {
    find_productive();
    if (!rule_ok_[root]) throw Error("grammar: the root derives no finite string (no valid document exists)");
    net_.classes = g_.classes_;
    net_.rule_names = g_.names_;
    net_.root = root;
    const size_t rules = g_.names_.size();
    net_.rule_start.assign(rules, -1);
    net_.rule_end.assign(rules, -1);
    for (size_t r = 0; r < rules; ++r) {
      if (!rule_ok_[r]) continue;
      rule_ = static_cast<int32_t>(r);
      net_.rule_start[r] = new_state();
      net_.rule_end[r] = emit(g_.bodies_[r], net_.rule_start[r]);
    }
    return std::move(net_);
  }

 private:
  using Expr = GrammarBuilder::Expr;

  // Least fixpoint: a rule is productive when its body is, given the rules known productive so far.
  void find_productive() {
    for (bool changed = true; changed;) {
      changed = false;
      memo_.assign(g_.exprs_.size(), -1);
      for (size_t r = 0; r < rule_ok_.size(); ++r)
        if (!rule_ok_[r] && productive(g_.bodies_[r])) rule_ok_[r] = changed = true;
    }
    memo_.assign(g_.exprs_.size(), -1);
  }

  bool productive(GrammarBuilder::Node n) {
    if (memo_[n] >= 0) return memo_[n];
    const Expr& e = g_.exprs_[n];
    bool ok = true;
    switch (e.kind) {
      case Expr::Bytes: ok = !g_.classes_[e.a].empty(); break;
      case Expr::Literal:
      case Expr::Special: ok = true; break;
      case Expr::Seq:
        for (auto c : e.children) ok = ok && productive(c);
        break;
      case Expr::Alt:
        ok = false;
        for (auto c : e.children) ok = productive(c) || ok;
        break;
      case Expr::Repeat: ok = e.a == 0 || productive(e.children[0]); break;
      case Expr::Ref: ok = rule_ok_[e.a]; break;
    }
    memo_[n] = ok;
    return ok;
  }

  int32_t new_state() {
    if (net_.edges.size() >= kMaxStates)
      throw Error(fmt::format("grammar: more than {} states (a length or repetition bound too large?)", kMaxStates));
    net_.edges.emplace_back();
    net_.rule_of.push_back(rule_);
    return static_cast<int32_t>(net_.edges.size() - 1);
  }
  void edge(int32_t from, GrammarNetwork::EdgeKind kind, int32_t arg, int32_t to) {
    net_.edges[from].push_back({kind, arg, to});
  }
  int32_t byte_class(uint8_t b) {
    int32_t& c = single_byte_class_[b];
    if (c < 0) {
      net_.classes.push_back(ByteSet().add(b));
      c = static_cast<int32_t>(net_.classes.size() - 1);
    }
    return c;
  }

  // Adds the NFA of `n` starting at `from`; returns its end state, or -1 when `n` derives nothing.
  int32_t emit(GrammarBuilder::Node n, int32_t from) {
    if (!productive(n)) return -1;
    const Expr& e = g_.exprs_[n];
    using K = GrammarNetwork::EdgeKind;
    switch (e.kind) {
      case Expr::Bytes: {
        int32_t to = new_state();
        edge(from, K::Bytes, e.a, to);
        return to;
      }
      case Expr::Literal:
        for (unsigned char c : e.text) {
          int32_t to = new_state();
          edge(from, K::Bytes, byte_class(c), to);
          from = to;
        }
        return from;
      case Expr::Special: {
        int32_t to = new_state();
        edge(from, K::Special, e.a, to);
        return to;
      }
      case Expr::Seq:
        for (auto c : e.children) from = emit(c, from);
        return from;
      case Expr::Alt: {
        int32_t end = new_state();
        for (auto c : e.children) {
          if (!productive(c)) continue;
          int32_t start = new_state();
          edge(from, K::Epsilon, 0, start);
          edge(emit(c, start), K::Epsilon, 0, end);
        }
        return end;
      }
      case Expr::Repeat: return emit_repeat(e, from);
      case Expr::Ref: {
        int32_t to = new_state();
        edge(from, K::Call, e.a, to);
        return to;
      }
    }
    return -1;
  }

  int32_t emit_repeat(const Expr& e, int32_t from) {
    using K = GrammarNetwork::EdgeKind;
    const auto child = e.children[0];
    for (int32_t i = 0; i < e.a; ++i) from = emit(child, from);
    if (!productive(child)) return from;  // only zero copies are possible
    if (e.b == GrammarBuilder::kUnbounded) {
      int32_t loop = new_state(), body = new_state();
      edge(from, K::Epsilon, 0, loop);
      edge(loop, K::Epsilon, 0, body);
      edge(emit(child, body), K::Epsilon, 0, loop);
      return loop;
    }
    int32_t end = new_state();
    edge(from, K::Epsilon, 0, end);
    for (int32_t i = e.a; i < e.b; ++i) {
      from = emit(child, from);
      edge(from, K::Epsilon, 0, end);
    }
    return end;
  }

  const GrammarBuilder& g_;
  std::vector<uint8_t> rule_ok_;
  std::vector<int8_t> memo_;
  GrammarNetwork net_;
  int32_t rule_ = 0;
  std::array<int32_t, 256> single_byte_class_ = [] {
    std::array<int32_t, 256> a;
    a.fill(-1);
    return a;
  }();
};

GrammarNetwork GrammarBuilder::build(Rule root) const { return NetworkCompiler(*this).run(root); }

}  // namespace qs
