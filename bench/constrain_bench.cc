// Grammar engine speed on the real Gemma 4 vocabulary (../shared/tokenizer/gemma4): the vocabulary trie build
// (once per tokenizer), compiling a 20-tool schema (goal <= 50 ms), and the mask + accept time per generated token
// (budget ~3 ms at E2B's ~17 tok/s for constrained decoding to stay >= 0.95x) for a typical tools schema and for
// json_object, with a cold grammar (the request that compiles it) and a warm one (a repeated schema).
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>

#include "constrain/grammar_cache.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

namespace qs {
namespace {

using json = nlohmann::json;

const Tokenizer* gemma_tokenizer() {
  static const std::string path = std::string(QATSERVE_SOURCE_DIR) + "/../shared/tokenizer/gemma4/tokenizer.reconstructed.json";
  static const std::optional<Tokenizer> tok =
      std::filesystem::exists(path) ? std::optional<Tokenizer>(Tokenizer::load(path)) : std::nullopt;
  return tok ? &*tok : nullptr;
}

GrammarCache& gemma_cache() {
  static GrammarCache cache(*gemma_tokenizer(), 262144);
  return cache;
}

// A tool of the kind agents declare: a few typed, described parameters, one enum, one optional nested object.
ToolSpec tool(int i) {
  json params = {{"type", "object"},
                 {"properties",
                  {{"query", {{"type", "string"}, {"description", "what to look for"}}},
                   {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 100}}},
                   {"unit", {{"type", "string"}, {"enum", {"celsius", "fahrenheit"}}}},
                   {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}, {"maxItems", 5}}},
                   {"options", {{"type", "object"}, {"properties", {{"verbose", {{"type", "boolean"}}}, {"lang", {{"type", "string"}}}}}}}}},
                 {"required", {"query", "limit"}}};
  return {"tool_number_" + std::to_string(i), "a tool", params};
}

ConstraintSpec tools_spec(int n) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::ToolCalls;
  for (int i = 0; i < n; ++i) spec.tools.push_back(tool(i));
  return spec;
}

// A token sequence through the grammar: random allowed tokens (ending as soon as the document may end after
// `length` tokens), as a sampler on random weights would produce.
std::vector<int32_t> walk(const std::shared_ptr<CompiledGrammar>& g, uint64_t seed, int length) {
  GrammarMatcher m(g, {1});
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> mask(262144 / 64);
  std::vector<int32_t> out;
  while (!m.is_terminated() && static_cast<int>(out.size()) < 4 * length) {
    m.fill_mask(mask);
    if (m.is_complete() && static_cast<int>(out.size()) >= length) break;
    std::vector<int32_t> allowed;
    for (int32_t i = 2; i < 262144; ++i)
      if ((mask[i >> 6] >> (i & 63)) & 1) allowed.push_back(i);
    if (allowed.empty()) break;
    // Prefer short tokens 3 times in 4, so walks close their strings as real output does.
    std::vector<int32_t> short_ones;
    for (int32_t id : allowed)
      if (g->vocab().token_bytes(id).size() <= 1 || g->vocab().is_special(id)) short_ones.push_back(id);
    const auto& pool = !short_ones.empty() && rng() % 4 != 0 ? short_ones : allowed;
    // Before `length` tokens, a token that would end the document is drawn again (a few times).
    GrammarMatcher next = m;
    int32_t id = pool[rng() % pool.size()];
    for (int tries = 0; next.accept_token(id) && next.is_complete() && static_cast<int>(out.size()) < length && tries < 50; ++tries) {
      next = m;
      id = pool[rng() % pool.size()];
    }
    out.push_back(id);
    m.accept_token(id);
  }
  return out;
}

void mask_per_token(benchmark::State& state, const ConstraintSpec& spec, bool warm) {
  if (!gemma_tokenizer()) return state.SkipWithError("../shared/tokenizer/gemma4 is absent");
  GrammarCache& cache = gemma_cache();
  const auto tokens = walk(cache.get(spec), 1, 120);
  std::vector<uint64_t> mask(262144 / 64);
  size_t total = 0;
  for (auto _ : state) {
    std::shared_ptr<CompiledGrammar> g;
    if (warm) {
      g = cache.get(spec);
    } else {
      state.PauseTiming();
      g = cache.compile_uncached(spec);
      state.ResumeTiming();
    }
    GrammarMatcher m(g, {1});
    for (int32_t id : tokens) {
      m.fill_mask(mask);
      m.accept_token(id);
    }
    total += tokens.size();
  }
  state.counters["tokens"] = static_cast<double>(tokens.size());
  state.counters["per_token"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

ConstraintSpec json_object() {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::JsonObject;
  return spec;
}

void BM_MaskToolsCold(benchmark::State& s) { mask_per_token(s, tools_spec(3), false); }
void BM_MaskToolsWarm(benchmark::State& s) { mask_per_token(s, tools_spec(3), true); }
void BM_MaskJsonObjectCold(benchmark::State& s) { mask_per_token(s, json_object(), false); }
void BM_MaskJsonObjectWarm(benchmark::State& s) { mask_per_token(s, json_object(), true); }
BENCHMARK(BM_MaskToolsCold)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_MaskToolsWarm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskJsonObjectCold)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_MaskJsonObjectWarm)->Unit(benchmark::kMillisecond);

// Compiling 20 tools: schema -> network -> the start configuration (what a request waits for before its first
// token, besides its first mask, which the mask benchmarks count).
void BM_Compile20Tools(benchmark::State& state) {
  if (!gemma_tokenizer()) return state.SkipWithError("../shared/tokenizer/gemma4 is absent");
  const ConstraintSpec spec = tools_spec(20);
  for (auto _ : state) {
    auto g = gemma_cache().compile_uncached(spec);
    GrammarMatcher m(g, {1});
    benchmark::DoNotOptimize(m.is_complete());
  }
}
BENCHMARK(BM_Compile20Tools)->Unit(benchmark::kMillisecond);

// The first mask of a 20-tool grammar (cold), i.e. the rest of the first token's grammar cost.
void BM_FirstMask20Tools(benchmark::State& state) {
  if (!gemma_tokenizer()) return state.SkipWithError("../shared/tokenizer/gemma4 is absent");
  const ConstraintSpec spec = tools_spec(20);
  std::vector<uint64_t> mask(262144 / 64);
  for (auto _ : state) {
    state.PauseTiming();
    auto g = gemma_cache().compile_uncached(spec);
    GrammarMatcher m(g, {1});
    state.ResumeTiming();
    m.fill_mask(mask);
  }
}
BENCHMARK(BM_FirstMask20Tools)->Unit(benchmark::kMillisecond);

// The worst single mask: inside a string every token but a few is allowed, so the walk visits the whole trie
// (cold: every byte transition is computed too).
void BM_StringMaskCold(benchmark::State& state) {
  if (!gemma_tokenizer()) return state.SkipWithError("../shared/tokenizer/gemma4 is absent");
  std::vector<uint64_t> mask(262144 / 64);
  for (auto _ : state) {
    state.PauseTiming();
    auto g = gemma_cache().compile_uncached(json_object());
    GrammarMatcher m(g, {1});
    m.accept_bytes("{\"key\": \"some text");
    state.ResumeTiming();
    m.fill_mask(mask);
  }
}
BENCHMARK(BM_StringMaskCold)->Unit(benchmark::kMillisecond);

// The sampler's side of a constrained token: Gemma's default sampling (temperature 1, top-k 64, top-p 0.95) over
// 262,144 logits, with and without a mask (a mask makes the sampler work on a masked copy of the logits).
void sample(benchmark::State& state, bool masked) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(262144);
  for (float& l : logits) l = normal(rng);
  std::vector<uint64_t> mask(262144 / 64, ~uint64_t{0});
  for (size_t i = 0; i < mask.size(); i += 3) mask[i] = 0x00FF00FF00FF00FFull;  // a third of the words partly banned
  SamplingParams p;
  p.top_k = 64;
  p.top_p = 0.95f;
  p.seed = 1;
  Sampler sampler(p);
  for (auto _ : state)
    benchmark::DoNotOptimize(sampler.sample(logits, {}, {}, masked ? std::span<const uint64_t>(mask) : std::span<const uint64_t>()));
}
void BM_SampleUnmasked(benchmark::State& s) { sample(s, false); }
void BM_SampleMasked(benchmark::State& s) { sample(s, true); }
BENCHMARK(BM_SampleUnmasked)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleMasked)->Unit(benchmark::kMicrosecond);

// The vocabulary trie, built once per tokenizer.
void BM_VocabIndex(benchmark::State& state) {
  if (!gemma_tokenizer()) return state.SkipWithError("../shared/tokenizer/gemma4 is absent");
  for (auto _ : state) VocabIndex v(*gemma_tokenizer(), 262144);
}
BENCHMARK(BM_VocabIndex)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace
}  // namespace qs
