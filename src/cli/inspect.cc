// `qatserve inspect`: a checkpoint summarised and validated (checkpoint_tools/inspect.h).
#include <iostream>

#include "checkpoint_tools/inspect.h"
#include "cli/commands.h"

namespace qs::cli {

void add_inspect(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("inspect", "Summarise and validate a checkpoint directory or .safetensors file");
  static InspectOptions o;
  static bool json = false;
  cmd->add_option("PATH", o.path, "Checkpoint directory or .safetensors file")->required();
  cmd->add_flag("--json", json, "Print the report as JSON");
  cmd->add_option("--samples", o.sample_groups, "Groups sampled per tensor in the grid scan");
  cmd->callback([&run] {
    run = [] {
      auto r = inspect_checkpoint(o);
      std::cout << (json ? r.dump(2) + "\n" : format_inspection(r));
      return 0;
    };
  });
}

}  // namespace qs::cli
