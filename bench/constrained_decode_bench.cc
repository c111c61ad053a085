// End-to-end decode speed with and without a tool-call constraint (the goal: constrained decoding keeps
// >= 0.95x of the unconstrained tokens/s, at 1 and 8 streams), through the serving engine on the checkpoint named
// by $QATSERVE_BENCH_MODEL, which must hold its tokenizer (e.g. `qatserve synth --preset e2b --format w4a16
// --tokenizer DIR`, DIR holding the real Gemma 4 tokenizer.json and a chat_template.jinja).
//
// Each repetition decodes the same prompts (chat turns declaring bench/data/agent_tools.json) with the same
// seeds twice: free, and constrained to tool calls of those tools (tool_choice "required"), both with ignore_eos
// so that both decode exactly `tokens` tokens per stream (without end ids the call grammar can only go on with
// another call, so a random-weight model never stops it early). The order alternates between repetitions
// (free first, then constrained first) so that drift in the machine's speed hits both arms alike; run with
// --benchmark_repetitions=N for medians. Tokens/s counts the tokens that arrive while every stream is decoding:
// from the last stream's first token to the first stream's last one (one stream: first to last token). The
// grammar is compiled at the first constrained request and cached, as a repeated schema is in an agent loop.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>

#include "engine/engine.h"
#include "model/gemma4.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

json agent_tools() {
  std::ifstream in(std::string(QATSERVE_SOURCE_DIR) + "/bench/data/agent_tools.json");
  return json::parse(in);
}

// Eight different user turns of an agent loop, each declaring the same tools (as every request of one agent does).
std::vector<std::vector<int32_t>> chat_prompts(const Tokenizer& tokenizer, const std::filesystem::path& dir,
                                               const Gemma4TextConfig& config, const json& tools) {
  static const char* kQuestions[] = {
      "What is the weather in Paris this weekend?",
      "Find recent articles about memory bandwidth in CPU inference.",
      "Book a meeting with Ana tomorrow at 10 for half an hour.",
      "Will it rain in Lisbon over the next five days? Answer in fahrenheit.",
      "Search the web for the best hiking trails near Zurich, ten results.",
      "Put a private reminder in my calendar for the dentist on Friday at 3pm.",
      "How cold is it in Oslo right now?",
      "Look up the opening hours of the British Museum.",
  };
  ChatOptions options;
  options.dialect = gemma4_chat_dialect_for_checkpoint(dir, config);
  for (const auto& t : tools)
    options.tools.push_back({t["function"]["name"], t["function"]["description"], t["function"]["parameters"]});
  std::vector<std::vector<int32_t>> prompts;
  for (const char* question : kQuestions) {
    ChatMessage message{"user", question};
    prompts.push_back(tokenizer.encode(render_gemma4_chat(std::span(&message, 1), options)));
  }
  return prompts;
}

ConstraintSpec tool_calls(const json& tools) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::ToolCalls;
  for (const auto& t : tools)
    spec.tools.push_back({t["function"]["name"], t["function"]["description"], t["function"]["parameters"]});
  return spec;
}

struct Setup {
  std::unique_ptr<Gemma4Model> model;
  Tokenizer tokenizer;
  std::unique_ptr<Engine> engine;
  std::vector<std::vector<int32_t>> prompts;
  ConstraintSpec tools;
};

// Loaded once for every benchmark; null when $QATSERVE_BENCH_MODEL is not set.
Setup* setup() {
  static std::unique_ptr<Setup> s = []() -> std::unique_ptr<Setup> {
    const char* dir = std::getenv("QATSERVE_BENCH_MODEL");
    if (!dir) return nullptr;
    auto model = Gemma4Model::load(dir, Precision::BF16, true);
    auto setup = std::make_unique<Setup>(Setup{std::move(model), Tokenizer::load(std::filesystem::path(dir) / "tokenizer.json")});
    EngineOptions options;
    options.max_running = 8;
    options.max_context = 2048;
    setup->engine = std::make_unique<Engine>(*setup->model, &setup->tokenizer, read_generation_config(dir), options);
    const json tools = agent_tools();
    setup->prompts = chat_prompts(setup->tokenizer, dir, setup->model->config().text, tools);
    setup->tools = tool_calls(tools);
    return setup;
  }();
  return s.get();
}

struct DecodeSpeed {
  int64_t tokens = 0;  // counted in the window
  double seconds = 0;
  double per_second() const { return tokens / seconds; }
};

// Decodes `tokens` tokens in each of `streams` concurrent requests and times the window where all of them decode.
DecodeSpeed decode(Setup& s, int streams, int64_t tokens, const ConstraintSpec& constraint) {
  std::mutex mu;
  std::condition_variable all_done;
  std::vector<std::vector<Clock::time_point>> arrivals(streams);
  std::vector<std::string> finish(streams);
  int finished = 0;
  for (int i = 0; i < streams; ++i) {
    EngineRequest r;
    r.prompt = s.prompts[i % s.prompts.size()];
    r.max_tokens = tokens;
    r.sampling = s.engine->generation_config().default_sampling();
    r.sampling.seed = 1 + i;
    r.ignore_eos = true;
    r.constraint = constraint;
    const SubmitResult submitted = s.engine->submit(std::move(r), [&, i](EngineEvent&& e) {
      const auto now = Clock::now();
      std::lock_guard lock(mu);
      arrivals[i].insert(arrivals[i].end(), e.tokens.size(), now);
      if (e.finished) {
        finish[i] = e.finish_reason == "error" ? "error: " + e.error : e.finish_reason;
        ++finished;
        all_done.notify_all();
      }
      return true;
    });
    if (submitted.status != SubmitStatus::Accepted) throw Error("submit refused: " + submitted.error);
  }
  std::unique_lock lock(mu);
  all_done.wait(lock, [&] { return finished == streams; });
  for (int i = 0; i < streams; ++i)
    if (finish[i] != "length" || static_cast<int64_t>(arrivals[i].size()) != tokens)
      throw Error(fmt::format("stream {} ended after {} of {} tokens ({})", i, arrivals[i].size(), tokens, finish[i]));
  Clock::time_point begin = arrivals[0].front(), end = arrivals[0].back();
  for (const auto& a : arrivals) begin = std::max(begin, a.front()), end = std::min(end, a.back());
  DecodeSpeed speed{0, std::chrono::duration<double>(end - begin).count()};
  for (const auto& a : arrivals)
    speed.tokens += std::count_if(a.begin(), a.end(), [&](Clock::time_point t) { return t > begin && t <= end; });
  return speed;
}

void BM_DecodeFreeVsTools(benchmark::State& state) {
  Setup* s = setup();
  if (!s) return state.SkipWithError("set QATSERVE_BENCH_MODEL to a checkpoint directory with its tokenizer.json");
  const int streams = static_cast<int>(state.range(0));
  const int64_t tokens = state.range(1);
  static std::map<int, int> repetitions;  // per stream count: the order alternates with each repetition
  const bool tools_first = repetitions[streams]++ % 2 == 1;
  for (auto _ : state) {
    DecodeSpeed free, tools;
    try {
      if (tools_first) tools = decode(*s, streams, tokens, s->tools);
      free = decode(*s, streams, tokens, {});
      if (!tools_first) tools = decode(*s, streams, tokens, s->tools);
    } catch (const Error& e) {
      return state.SkipWithError(e.what());
    }
    state.SetIterationTime(free.seconds + tools.seconds);
    state.counters["free_tok_s"] = free.per_second();
    state.counters["tools_tok_s"] = tools.per_second();
    state.counters["ratio"] = tools.per_second() / free.per_second();
    state.counters["tools_first"] = tools_first;
  }
}
BENCHMARK(BM_DecodeFreeVsTools)
    ->ArgNames({"streams", "tokens"})
    ->Args({1, 128})
    ->Args({8, 128})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace qs
