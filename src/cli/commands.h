// The qatserve commands: each adds its subcommand and options to the app and, once parsed, sets `run` to what the
// command does (main.cc calls it after parsing, inside the interrupt handlers and the error report).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace qs::cli {

using CommandRun = std::function<int()>;

void add_synth(CLI::App& app, CommandRun& run);
void add_repack(CLI::App& app, CommandRun& run);
void add_merge_lora(CLI::App& app, CommandRun& run);
void add_verify(CLI::App& app, CommandRun& run);
void add_inspect(CLI::App& app, CommandRun& run);
void add_logits(CLI::App& app, CommandRun& run);
void add_eval(CLI::App& app, CommandRun& run);
void add_generate(CLI::App& app, CommandRun& run);
void add_chat(CLI::App& app, CommandRun& run);
void add_plan(CLI::App& app, CommandRun& run);
void add_bench(CLI::App& app, CommandRun& run);
void add_serve(CLI::App& app, CommandRun& run);

}  // namespace qs::cli
