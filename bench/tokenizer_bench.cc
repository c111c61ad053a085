// Tokenizer speed on the real Gemma 3 tokenizer.json (../shared/tokenizer/gemma3): load time, encode throughput on
// ~1 MB of varied text (cold word cache and warm), decode and streaming decode. Single thread.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

const std::filesystem::path kGemma3 =
    std::filesystem::path(QATSERVE_SOURCE_DIR) / ".." / "shared" / "tokenizer" / "gemma3" / "tokenizer.json";
const std::filesystem::path kCorpus =
    std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests" / "golden" / "tokenizer_gemma3.json";

const qs::Tokenizer* tokenizer() {
  static std::unique_ptr<qs::Tokenizer> tok =
      std::filesystem::exists(kGemma3) ? std::make_unique<qs::Tokenizer>(qs::Tokenizer::load(kGemma3)) : nullptr;
  return tok.get();
}

// ~1 MB: lines drawn (seeded) from the golden corpus (prose, code, emoji, CJK, Arabic, Hindi, numbers, special
// tokens, long words), sentences of random vocabulary words (so that most words are not repeats), and numbers.
const std::string& varied_text() {
  static const std::string text = [] {
    std::vector<std::string> corpus;
    std::ifstream f(kCorpus);
    auto golden = nlohmann::json::parse(f);
    for (const auto& e : golden["encode"]) corpus.push_back(e["text"]);
    const qs::Tokenizer& tok = *tokenizer();
    std::vector<int32_t> words;  // vocabulary entries that are plain words with a leading "▁"
    for (int32_t id = 0; id < static_cast<int32_t>(tok.model_vocab_size()); ++id) {
      const std::string& p = tok.token_piece(id);
      if (p.size() > 3 && p.compare(0, 3, "\xE2\x96\x81") == 0 && p.find('<') == std::string::npos) words.push_back(id);
    }
    std::mt19937 rng(42);
    std::string out;
    while (out.size() < (1 << 20)) {
      unsigned r = rng() % 10;
      if (r < 4) {
        out += corpus[rng() % corpus.size()];
      } else if (r < 9) {
        std::vector<int32_t> ids;
        for (int n = 8 + rng() % 24; n > 0; --n) ids.push_back(words[rng() % words.size()]);
        out += tok.decode(ids);
        out += ". ";
      } else {
        out += std::to_string(rng()) + "," + std::to_string(rng() % 1000) + " ";
      }
      if (rng() % 3 == 0) out += '\n';
    }
    return out;
  }();
  return text;
}

void BM_LoadGemma3(benchmark::State& state) {
  if (!std::filesystem::exists(kGemma3)) return state.SkipWithError("../shared/tokenizer/gemma3 is absent");
  for (auto _ : state) {
    auto tok = qs::Tokenizer::load(kGemma3);
    benchmark::DoNotOptimize(tok);
  }
}
BENCHMARK(BM_LoadGemma3)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_EncodeVaried(benchmark::State& state, bool warm) {
  const qs::Tokenizer* tok = tokenizer();
  if (!tok) return state.SkipWithError("../shared/tokenizer/gemma3 is absent");
  const std::string& text = varied_text();
  size_t n_ids = 0;
  tok->encode(text);  // warm the word cache (cleared again below for the cold variant)
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      tok->clear_cache();
      state.ResumeTiming();
    }
    auto ids = tok->encode(text);
    n_ids = ids.size();
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["text_MB"] = text.size() / 1e6;
  state.counters["ids"] = static_cast<double>(n_ids);
}
BENCHMARK_CAPTURE(BM_EncodeVaried, cold_cache, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeVaried, warm_cache, true)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state, bool stream) {
  const qs::Tokenizer* tok = tokenizer();
  if (!tok) return state.SkipWithError("../shared/tokenizer/gemma3 is absent");
  const auto ids = tok->encode(varied_text());
  for (auto _ : state) {
    if (stream) {
      qs::StreamDecoder dec(*tok, false);
      size_t total = 0;
      for (int32_t id : ids) total += dec.push(id).size();
      total += dec.flush().size();
      benchmark::DoNotOptimize(total);
    } else {
      auto text = tok->decode(ids);
      benchmark::DoNotOptimize(text);
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * varied_text().size()));
  state.counters["ids_per_s"] =
      benchmark::Counter(static_cast<double>(ids.size()) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_Decode, decode, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, stream_decoder, true)->Unit(benchmark::kMillisecond);

}  // namespace
