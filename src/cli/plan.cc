// `qatserve plan`: device memory planned for a model (engine/memory_plan.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <optional>

#include "checkpoint_tools/synth.h"
#include "cli/commands.h"
#include "engine/memory_plan.h"
#include "formats/checkpoint.h"
#include "util/error.h"

namespace qs::cli {

// `plan`: exit 0 when at least one context of --context tokens fits on the device, 3 when not (the report says
// by how much), 1 on bad input.
void add_plan(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("plan", "Plan device memory: weights by class, runtime reserve, KV cache, contexts that fit");
  cmd->footer("Exit status: 0 when a context of --context tokens (default: the --max-model-len serve would choose) "
              "fits, 3 when it does not, 1 on bad input.");
  static std::string model_dir, config_file, preset, device, kv_dtype = "bf16", weights;
  static int64_t context = 0, max_running = 16;
  static bool json = false;
  auto* m = cmd->add_option("--model", model_dir, "Checkpoint directory: weights counted from its files");
  auto* c = cmd->add_option("--config", config_file, "config.json to plan from")->excludes(m);
  cmd->add_option("--preset", preset, "Model preset: " + fmt::format("{}", fmt::join(synth_preset_names(), ", ")))
      ->excludes(m)->excludes(c);
  cmd->add_option("--device", device, "tpu-v5e, tpu-v6e, l4, h100, h200, cpu (this machine's RAM) or a size like 48G")
      ->required();
  cmd->add_option("--kv-dtype", kv_dtype, "KV cache dtype as the engine stores it: bf16 (default), int8 (codes and a "
                  "scale per position and KV head) or f32")->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--context", context, "Tokens per sequence (default: the --max-model-len serve would choose: the "
                  "model's context, or the longest one sequence's KV fits in)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-running", max_running, "Sequences decoded together, as serve's --max-running (default 16): "
                  "the logits and activations reserved, and the sliding windows the KV pool keeps")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--weights", weights, "bf16 or w4a16, with --config/--preset (default: w4a16 when the config has a "
                  "quantization_config, else bf16)")->check(CLI::IsMember({"bf16", "w4a16"}))->excludes(m);
  static int64_t image_soft_tokens = 0;
  cmd->add_option("--max-image-soft-tokens", image_soft_tokens,
                  "Reserve the vision tower's work for images of this budget, as serve's --max-image-soft-tokens "
                  "(default: the config's soft tokens per image)")
      ->check(CLI::IsMember({70, 140, 280, 560, 1120}));
  static int64_t max_loras = 0, max_lora_rank = 16;
  cmd->add_option("--max-loras", max_loras, "Reserve room for this many LoRA adapters, as serve's --max-loras (default "
                  "0: none), each of --max-lora-rank on every linear and MoE expert parameter an adapter may target")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-lora-rank", max_lora_rank, "The rank each reserved adapter may have, as serve's "
                  "--max-lora-rank (default 16)")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", json, "Print the plan as JSON");
  cmd->callback([&run] {
    run = [] {
      if (model_dir.empty() && config_file.empty() && preset.empty())
        throw Error("give the model as --model DIR, --config FILE or --preset NAME");
      ModelConfig config;
      WeightBytes w;
      std::string label;
      if (!model_dir.empty()) {
        Checkpoint ckpt = Checkpoint::open(model_dir);
        auto cfg = ckpt.config_path();
        if (!cfg) throw Error(fmt::format("{}: no config.json, which plan needs for the architecture", model_dir));
        config = read_model_config(*cfg);
        w = weight_bytes_from_checkpoint(ckpt, config);
        label = "checkpoint " + model_dir;
      } else {
        config = preset.empty() ? read_model_config(config_file) : parse_model_config(preset_config_text(preset), "preset " + preset);
        auto format = !weights.empty() ? parse_weight_format(weights)
                      : config.quantization ? WeightFormat::W4A16 : WeightFormat::Bf16;
        w = weight_bytes_from_config(config, format);
        label = preset.empty() ? "config " + config_file : "preset " + preset;
      }
      PlanOptions o;
      o.device = resolve_device(device);
      o.kv_dtype = parse_kv_dtype(kv_dtype);
      o.image_soft_tokens = image_soft_tokens;
      o.batch = max_running;
      o.adapter_bytes = uint64_t(max_loras) * lora_adapter_bytes(config, max_lora_rank);
      MemoryPlan plan = plan_memory(config, w, o);
      std::optional<ContextChoice> choice;
      if (plan.weights_fit) try {
          choice = choose_max_model_len(plan, config.text, max_running);
        } catch (const Error& e) {
          fmt::print(stderr, "DOES NOT FIT: {}\n", e.what());
        }
      const int64_t n = context ? context : choice ? choice->tokens : config.text.max_position_embeddings_or(kDefaultContext);
      const ContextChoice* chosen = choice ? &*choice : nullptr;
      std::cout << (json ? memory_plan_json(plan, n, label, chosen).dump(2) + "\n" : format_memory_plan(plan, n, label, chosen));
      return plan.contexts_that_fit(n) > 0 ? 0 : 3;
    };
  });
}

}  // namespace qs::cli
