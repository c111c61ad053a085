// `qatserve merge-lora`: a PEFT LoRA adapter merged into a bf16 checkpoint (checkpoint_tools/merge_lora.h).
#include <fmt/format.h>

#include "checkpoint_tools/merge_lora.h"
#include "cli/commands.h"
#include "util/progress.h"

namespace qs::cli {

void add_merge_lora(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("merge-lora", "Merge a PEFT LoRA adapter into a bf16 checkpoint (W + scale * B A, as "
                                               "PEFT's merge_and_unload)");
  static MergeLoraOptions o;
  static bool quiet = false;
  cmd->add_option("BASE", o.base, "bf16 QAT checkpoint directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("ADAPTER", o.adapter, "PEFT LoRA adapter directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("OUT", o.out, "Output directory (must not exist)")->required();
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->callback([&run] {
    run = [] {
      o.progress = !quiet;
      const MergeLoraResult r = merge_lora(o);
      fmt::print("merged {} into {} -> {}: {} linears and expert parameters merged, {} tensors, {} in {:.1f} s\n",
                 o.adapter.string(), o.base.string(), o.out.string(), r.merged, r.tensors, format_bytes(r.bytes),
                 r.seconds);
      return 0;
    };
  });
}

}  // namespace qs::cli
