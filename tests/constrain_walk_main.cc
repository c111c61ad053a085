// constrain_walk: random walks through a grammar's token masks, for the property test against the jsonschema
// package (tools/python/check_constrained_outputs.py). For a constraint and seeds it prints one JSON line per
// walk: {"seed", "text", "tokens"} where text is every token's bytes, special tokens as their names; or, when the
// constraint does not compile, one line {"error", "keyword", "pointer"}.
//
// A walk picks uniformly among the allowed tokens for --steps tokens (stopping at random where the document is
// complete), then finishes along a shortest completion, by single-byte and special tokens.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <random>

#include "constrain/grammar_cache.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace {

using json = nlohmann::json;

template <class Json = json>
Json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw qs::Error(path + ": cannot open");
  return Json::parse(in);
}

// Among the finishing moves, one that brings the document closest to complete (ties at random).
int32_t closest_move(const qs::GrammarMatcher& m, const std::vector<int32_t>& moves, std::mt19937_64& rng) {
  int64_t best = INT64_MAX;
  std::vector<int32_t> best_moves;
  for (int32_t id : moves) {
    qs::GrammarMatcher next = m;
    if (!next.accept_token(id)) continue;
    const int64_t d = next.min_completion();
    if (d < best) best = d, best_moves.clear();
    if (d == best) best_moves.push_back(id);
  }
  return best_moves.empty() ? -1 : best_moves[rng() % best_moves.size()];
}

qs::ConstraintSpec spec_from(const std::string& schema, const std::string& tools, bool object, bool parallel) {
  qs::ConstraintSpec spec;
  if (object) {
    spec.kind = qs::ConstraintSpec::Kind::JsonObject;
  } else if (!tools.empty()) {
    spec.kind = qs::ConstraintSpec::Kind::ToolCalls;
    spec.parallel_calls = parallel;
    for (const json& t : read_json(tools)) {
      const json& f = t.contains("function") ? t["function"] : t;
      spec.tools.push_back({f.value("name", ""), f.value("description", ""), f.value("parameters", json::object())});
    }
  } else {
    spec.kind = qs::ConstraintSpec::Kind::JsonSchema;
    spec.schema = read_json<nlohmann::ordered_json>(schema);  // properties are generated in the declared order
  }
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"random walks through a constraint's token masks"};
  std::string tokenizer_path, schema, tools;
  bool object = false, parallel = false;
  uint64_t seed = 0;
  int count = 10, steps = 30, max_steps = 4000;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("--schema", schema, "JSON Schema file");
  app.add_option("--tools", tools, "JSON array of OpenAI tools (tool calls, Gemma 4 syntax)");
  app.add_flag("--json-object", object, "any JSON object");
  app.add_flag("--parallel", parallel, "allow several tool calls");
  app.add_option("--seed", seed, "first seed");
  app.add_option("--count", count, "walks (seeds seed, seed+1, ...)");
  app.add_option("--steps", steps, "uniformly random tokens before finishing");
  app.add_option("--max-steps", max_steps, "give up after this many tokens");
  CLI11_PARSE(app, argc, argv);
  try {
    const qs::Tokenizer tok = qs::Tokenizer::load(tokenizer_path);
    qs::GrammarCache cache(tok, tok.vocab_size());
    const qs::ConstraintSpec spec = spec_from(schema, tools, object, parallel);
    std::shared_ptr<qs::CompiledGrammar> grammar;
    try {
      grammar = cache.get(spec);
    } catch (const qs::SchemaError& e) {
      std::cout << json{{"error", e.what()}, {"keyword", e.keyword()}, {"pointer", e.pointer()}}.dump() << "\n";
      return 0;
    }
    const int32_t end_id = tok.token_id("<eos>").value_or(1);
    // Finishing moves: single-byte tokens and the grammar's special tokens.
    std::vector<int32_t> short_tokens;
    for (size_t i = 0; i < tok.vocab_size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      if (cache.vocab().token_bytes(id).size() == 1 || cache.vocab().is_special(id)) short_tokens.push_back(id);
    }
    std::vector<uint64_t> mask((tok.vocab_size() + 63) / 64);
    for (int w = 0; w < count; ++w) {
      std::mt19937_64 rng(seed + w);
      qs::GrammarMatcher m(grammar, {end_id});
      std::string text;
      int n = 0;
      auto take = [&](int32_t id) {
        if (!m.accept_token(id)) throw qs::Error(fmt::format("seed {}: allowed token {} was rejected", seed + w, id));
        text += cache.vocab().is_special(id) ? tok.token_piece(id) : cache.vocab().token_bytes(id);
        ++n;
      };
      for (; n < steps && !m.is_terminated(); ) {
        m.fill_mask(mask);
        std::vector<int32_t> allowed;
        for (size_t i = 0; i < tok.vocab_size(); ++i)
          if ((mask[i >> 6] >> (i & 63)) & 1 && static_cast<int32_t>(i) != end_id) allowed.push_back(static_cast<int32_t>(i));
        if (m.is_complete() && (allowed.empty() || rng() % 8 == 0)) break;
        if (allowed.empty()) throw qs::Error(fmt::format("seed {}: no token allowed after {:?}", seed + w, text));
        take(allowed[rng() % allowed.size()]);
      }
      while (!m.is_complete()) {
        const int32_t id = n < max_steps ? closest_move(m, short_tokens, rng) : -1;
        if (id < 0) throw qs::Error(fmt::format("seed {}: no completion found after {:?}", seed + w, text));
        take(id);
      }
      json line{{"seed", seed + w}, {"tokens", n}, {"complete", m.is_complete()}};
      line["text"] = text;  // UTF-8 by construction of the grammar
      std::cout << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "constrain_walk: " << e.what() << "\n";
    return 1;
  }
}
