// `qatserve bench`: prefill and decode speed beside bytes read per token and memory bandwidth.
#include <fmt/format.h>

#include <iostream>

#include "bench/bench.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "engine/memory_plan.h"
#include "util/progress.h"

namespace qs::cli {

void add_bench(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("bench", "Prefill and decode tokens/s beside bytes read per token and measured memory "
                                 "bandwidth; with --speculative, decoding with a drafter against plain decoding");
  static BenchOptions o;
  static std::string model_dir, prompts = "128,512,2048", streams = "1,4,8", depths = "0,4096", sweep = "2G", json;
  static std::string paired_sweep = "0";
  static std::string kv_dtypes, fill = "prefill";
  cmd->add_option("--model", model_dir, "Checkpoint directory")->required();
  cmd->add_option("--prompts", prompts, "Prefill lengths, comma-separated (default 128,512,2048)");
  cmd->add_option("--streams", streams, "Sequences decoded together, comma-separated (default 1,4,8)");
  cmd->add_option("--depths", depths, "Cached positions before decoding, comma-separated (default 0,4096)");
  cmd->add_option("--decode-tokens", o.decode_tokens, "Timed decode steps per row (default 32)")->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "Prompt tokens per forward call (default 512)")->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", o.repeat, "Runs per row, median reported (default 1)")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o.threads, "Threads (default: one per core)");
  cmd->add_option("--sweep-size", sweep, "Bandwidth sweep buffer, far past the L3 (default 2G)");
  cmd->add_option("--paired-sweep", paired_sweep, "Also read a buffer of this size (e.g. 256M, past the L3) after "
                  "every timed decode step and report each row's bytes/s against those sweeps, step by step: a "
                  "ratio of one moment on a host whose bandwidth moves (default 0: off)");
  cmd->add_option("--precision", o.precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--kv-dtype", kv_dtypes,
                  "KV cache dtype(s), comma-separated, e.g. bf16,int8: every row once per dtype, the runs alternating "
                  "(A, B, A, B), and each dtype but the precision's default gets its logit error against it "
                  "(default: the precision's, bf16 or f32)");
  cmd->add_option("--kv-error-positions", o.kv_error_positions, "Prompt length of that logit comparison (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--fill", fill, "How depth rows fill their caches: prefill (the model's K/V, default) or random "
                  "(random K/V rows: the same decode work, without a long prefill)")
      ->check(CLI::IsMember({"prefill", "random"}));
  cmd->add_option("--isa", o.isa, "Instruction set of every kernel (linears, attention, gelu/tanh, norms): avx512, avx2 or portable (default: the widest this CPU has)")
      ->check(CLI::IsMember({"avx512", "avx2", "portable"}));
  cmd->add_option("--json", json, "Also write the report as JSON to this file");
  cmd->add_option("--lora", o.loras, "A PEFT LoRA adapter directory (repeatable): instead of the plain rows, every "
                  "prefill and decode row on the base and with the adapters, in turn (decode streams take the "
                  "adapters in turn), and their ratio")->check(CLI::ExistingDirectory);
  static std::string speculative = "none", spec_tokens = "4", draft_model, assistant;
  add_speculative_options(cmd, speculative, o.speculative, draft_model, assistant, &spec_tokens);
  cmd->add_option("--speculative-prompt", o.speculative_prompt, "--speculative: prompt tokens (one 32-token segment "
                  "repeated, default 128)")->check(CLI::PositiveNumber);
  cmd->add_option("--draft-acceptance", o.draft_acceptance, "--speculative: script the drafts' agreement, to "
                  "measure speed at an acceptance random weights never reach: the drafter runs, then each draft "
                  "token is plain greedy's token at its position with this probability (0 to 1), else another")
      ->check(CLI::Range(0.0, 1.0));
  cmd->callback([&run] {
    run = [] {
      o.model = model_dir;
      o.speculative = speculative_config_of(speculative, o.speculative, draft_model, assistant);
      o.speculative_tokens = parse_count_list(spec_tokens, "--num-speculative-tokens");
      o.draft_model = draft_model;
      o.assistant = assistant;
      o.prompts = prompts.empty() ? std::vector<int64_t>{} : parse_count_list(prompts, "--prompts");
      o.streams = streams.empty() ? std::vector<int64_t>{} : parse_count_list(streams, "--streams");
      o.depths = depths.empty() ? std::vector<int64_t>{} : parse_count_list(depths, "--depths", /*allow_zero=*/true);
      o.sweep_bytes = parse_byte_size(sweep, "--sweep-size");
      o.paired_sweep_bytes = paired_sweep == "0" ? 0 : parse_byte_size(paired_sweep, "--paired-sweep");
      o.kv_dtypes.clear();
      for (size_t pos = 0; !kv_dtypes.empty();) {
        const size_t comma = kv_dtypes.find(',', pos);
        const std::string name = kv_dtypes.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        parse_kv_dtype(name);  // throws naming the accepted ones
        o.kv_dtypes.push_back(name);
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      o.random_fill = fill == "random";
      BenchReport r = run_bench(o, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
      std::cout << format_bench_report(r);
      if (!json.empty()) write_bench_json(r, json);
      return 0;
    };
  });
}

}  // namespace qs::cli
