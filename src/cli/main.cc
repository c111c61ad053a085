// qatserve: one binary, git-style subcommands over the qatserve library (one file per command: cli/commands.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>

#include "cli/commands.h"
#include "util/interrupt.h"

int main(int argc, char** argv) {
  using namespace qs;
  using namespace qs::cli;
  CLI::App app{"qatserve: engine, server and toolchain for Gemma 4 QAT checkpoints"};
  app.require_subcommand(0, 1);
  CommandRun run;
  auto* help = app.add_subcommand("help", "Show the commands");
  add_synth(app, run);
  add_repack(app, run);
  add_merge_lora(app, run);
  add_verify(app, run);
  add_inspect(app, run);
  add_logits(app, run);
  add_eval(app, run);
  add_generate(app, run);
  add_chat(app, run);
  add_plan(app, run);
  add_serve(app, run);
  add_bench(app, run);
  const std::string usage = app.help();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!run || help->parsed()) {
    std::cout << usage;
    return argc > 1 && !help->parsed() ? 2 : 0;
  }
  install_interrupt_handlers();
  try {
    return run();
  } catch (const std::exception& e) {
    std::string name = app.get_subcommands().empty() ? "qatserve" : "qatserve " + app.get_subcommands()[0]->get_name();
    fmt::print(stderr, "\n{}: error: {}\n", name, e.what());
    return 1;
  }
}
