// `qatserve repack`: a bf16 QAT export into a lossless int4 W4A16 checkpoint (checkpoint_tools/repack.h).
#include <fmt/format.h>

#include "checkpoint_tools/repack.h"
#include "cli/commands.h"
#include "engine/memory_plan.h"
#include "util/progress.h"

namespace qs::cli {

void add_repack(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("repack", "Repack a bf16 QAT export into a lossless int4 W4A16 compressed-tensors checkpoint");
  static RepackOptions o;
  static std::string shard = "4G", grid = "lossless";
  static bool quiet = false;
  cmd->add_option("SRC", o.src, "bf16 QAT checkpoint directory")->required();
  cmd->add_option("DST", o.dst, "Output directory (must not exist)")->required();
  cmd->add_option("--shard-size", shard, "Largest output shard, e.g. 4G");
  cmd->add_option("--grid", grid, "lossless (default: the QAT step search), or LOSSY for comparison: textbook "
                  "(step amax/8) or ct-7.5 (compressed-tensors' amax/7.5 rule)")
      ->check(CLI::IsMember({"lossless", "textbook", "ct-7.5"}));
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->callback([&run] {
    run = [] {
      o.max_shard_bytes = parse_byte_size(shard, "--shard-size");
      o.progress = !quiet;
      o.grid = parse_repack_grid(grid);
      RepackReport r = repack_checkpoint(o);
      fmt::print("repacked {} -> {}: {} tensors quantized, {} copied, {} kept bf16; {} -> {} ({:.2f}x) in {:.1f} s\n",
                 o.src.string(), o.dst.string(), r.tensors_quantized, r.tensors_copied, r.kept.size(),
                 format_bytes(r.bytes_in), format_bytes(r.bytes_out), double(r.bytes_in) / r.bytes_out, r.seconds);
      for (const auto& k : r.kept) fmt::print("  kept bf16: {}: {}\n", k.name, k.reason);
      for (const auto& n : r.notes) fmt::print("  note: {}\n", n);
      fmt::print("report: {}/repack_report.json\n", o.dst.string());
      return 0;
    };
  });
}

}  // namespace qs::cli
