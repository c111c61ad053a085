// `qatserve verify`: a repack checked against its source from disk (checkpoint_tools/verify.h).
#include <fmt/format.h>

#include "checkpoint_tools/verify.h"
#include "cli/commands.h"

namespace qs::cli {

void add_verify(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("verify", "Check, from disk, that DST is a lossless repack of SRC");
  static VerifyOptions o;
  static bool quiet = false;
  cmd->add_option("SRC", o.src, "bf16 QAT checkpoint")->required();
  cmd->add_option("DST", o.dst, "W4A16 checkpoint")->required();
  cmd->add_option("--show", o.max_failures_shown, "How many failures to print");
  cmd->add_flag("--allow-lossy", o.allow_lossy, "Exit 0 for a lossy repack (`repack --grid textbook|ct-7.5`) whose "
                "groups are nearest-level quantizations on their stored scales; the loss is still reported");
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->callback([&run] {
    run = [] {
      o.progress = !quiet;
      VerifyResult r = verify_repack(o);
      fmt::print("verify {} against {}: {} quantized tensors ({} groups, {:.2f}% of values bit-identical), {} copied "
                 "tensors, in {:.1f} s\n",
                 o.dst.string(), o.src.string(), r.tensors_quantized, r.groups_checked,
                 r.values_checked ? 100.0 * r.values_bit_identical / r.values_checked : 100.0, r.tensors_copied,
                 r.seconds);
      for (const auto& f : r.first_failures) fmt::print("  FAIL {}\n", f);
      if (r.lossy_groups)
        fmt::print("LOSSY: {} of {} groups not reproduced (first: {}), largest |level x scale - value| {:.6g}{}\n",
                   r.lossy_groups, r.groups_checked, r.first_lossy, r.lossy_max_error,
                   o.allow_lossy ? "" : "; pass --allow-lossy to accept a lossy grid");
      if (r.failures) fmt::print("FAILED: {} problems\n", r.failures);
      else fmt::print("{}\n", r.lossy_groups == 0 ? "OK: lossless" : r.ok() ? "OK: lossy (allowed)" : "FAILED: lossy");
      return r.ok() ? 0 : 1;
    };
  });
}

}  // namespace qs::cli
