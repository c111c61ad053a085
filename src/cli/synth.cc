// `qatserve synth`: a synthetic checkpoint of the real architecture (checkpoint_tools/synth.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint_tools/synth.h"
#include "cli/commands.h"
#include "engine/memory_plan.h"
#include "util/progress.h"

namespace qs::cli {

void add_synth(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("synth", "Write a synthetic Gemma 4 checkpoint whose weights sit on the QAT grid");
  static SynthOptions o;
  static std::string format = "bf16", shard = "4G";
  static bool quiet = false;
  cmd->add_option("--preset", o.preset, "Model preset: " + fmt::format("{}", fmt::join(synth_preset_names(), ", ")));
  cmd->add_option("--config", o.config_file, "config.json to build instead of a preset")->check(CLI::ExistingFile);
  cmd->add_option("--format", format, "bf16 (-qat-q4_0-unquantized style) or w4a16 (-qat-w4a16-ct style)")
      ->check(CLI::IsMember({"bf16", "w4a16"}));
  cmd->add_option("--out", o.out, "Output directory (must not exist)")->required();
  cmd->add_option("--seed", o.seed, "Seed: the same seed writes the same bytes");
  cmd->add_option("--tokenizer", o.tokenizer_dir, "Directory whose files are copied into the checkpoint");
  cmd->add_option("--shard-size", shard, "Largest shard, e.g. 4G or 300M");
  // Callbacks, not a flag bound to the optional: unset must stay unset so the format decides.
  cmd->add_flag_callback("--lm-head", [] { o.lm_head = true; }, "Write a redundant lm_head.weight (default: w4a16 only)");
  cmd->add_flag_callback("--no-lm-head", [] { o.lm_head = false; }, "Never write lm_head.weight");
  cmd->add_flag_callback("--towers", [] { o.towers = true; }, "Write the vision/audio towers the config describes "
                         "(default: when it describes any)");
  cmd->add_flag_callback("--no-towers", [] { o.towers = false; }, "Write the text decoder only");
  cmd->add_flag("--towers-bf16", o.towers_bf16, "w4a16: keep the tower linears bf16 (on `ignore`), as a ct export may");
  cmd->add_flag("--towers-only", o.towers_only, "Write the towers and the config only, no text decoder");
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->add_option("--fault-off-grid", o.fault_off_grid, "Plant a group off the grid in this tensor");
  cmd->add_option("--fault-missing", o.fault_missing, "Leave this tensor out");
  cmd->add_flag("--fault-truncate", o.fault_truncate, "Cut the last shard short after writing");
  cmd->callback([&run] {
    run = [] {
      o.format = format == "w4a16" ? CheckpointFormat::W4A16 : CheckpointFormat::Bf16;
      o.max_shard_bytes = parse_byte_size(shard, "--shard-size");
      o.progress = !quiet;
      SynthResult r = synth_checkpoint(o);
      fmt::print("wrote {}: {} tensors, {} in {:.1f} s\n", o.out.string(), r.tensors, format_bytes(r.bytes), r.seconds);
      return 0;
    };
  });
}

}  // namespace qs::cli
