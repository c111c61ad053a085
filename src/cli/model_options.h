// What the commands that run the model share: loading it at a precision and KV dtype, the options of `generate` and
// `chat` (sampling, constraints, speculative decoding), chat-format prompts from --messages, and the speed report.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/common_flags.h"
#include "constrain/constraint_spec.h"
#include "engine/generation_config.h"
#include "engine/generator.h"
#include "engine/media_prompt.h"
#include "engine/sampler.h"
#include "engine/speculative_config.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "model/lora_adapter.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace qs::cli {

// The model at --precision, its caches in --kv-dtype (empty: the precision's default).
std::unique_ptr<Gemma4Model> load_gemma4(const std::string& dir, const std::string& precision,
                                         const std::string& kv_dtype);

// `--lora DIR`: a PEFT LoRA adapter on the model (model/lora_adapter.h); load_lora gives nullptr for an empty DIR.
void add_lora_option(CLI::App* cmd, std::string& dir);
std::shared_ptr<const LoraAdapter> load_lora(const std::string& dir, const Gemma4Model& model);

// `--messages FILE.json`: {"messages": [...]} in the OpenAI chat format (the server's parser), rendered with the
// checkpoint's chat template and the generation prompt, as the server renders a chat request. Image and audio parts
// (data URLs, or http(s) URLs of allowed hosts) go through the checkpoint's towers, loaded only when the messages hold media
// (with `lora`'s vision-tower linears, if it has any).
MediaPrompt messages_prompt(const std::string& file, const Tokenizer& tokenizer, const ChatOptions& options,
                            const Gemma4Model& model, const std::string& model_dir, const MediaFetchFlags& fetch,
                            const LoraAdapter* lora = nullptr);

// The chat template's options for `generate --chat` and `chat`: the checkpoint's dialect, and the tools of --tools
// declared in the system turn as the template declares them (so the model is told what it is made to call).
ChatOptions chat_options(const std::string& dir, const Gemma4Model& model, const ConstraintSpec& constraint);

// What `generate` and `chat` share: the model, its tokenizer (when the checkpoint has one) and sampling flags.
struct ModelOptions {
  std::string dir, precision = "bf16", kv_dtype;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string json_schema, tools;
  std::string speculative = "none", draft_model, assistant;
  SpeculativeConfig speculation;

  void add_to(CLI::App* cmd);
  SpeculativeConfig speculative_config() const;
  // The output constraint the flags ask for (none by default).
  ConstraintSpec constraint() const;
  SamplingParams sampling_from(const GenerationConfig& g) const;
};

struct LoadedModel {
  std::unique_ptr<Gemma4Model> model;
  std::optional<Tokenizer> tokenizer;
  GenerationConfig generation;
  std::unique_ptr<Gemma4Model> draft_model;    // --draft-model
  std::unique_ptr<Gemma4Assistant> assistant;  // --assistant
  Generator generator() const {
    return Generator(*model, tokenizer ? &*tokenizer : nullptr, generation, draft_model.get(), assistant.get());
  }
};

LoadedModel load_model(const ModelOptions& o);

const Tokenizer& need_tokenizer(const LoadedModel& m, const std::string& dir, const char* why);

void print_speed(const GenerationResult& r, size_t prompt_tokens);

}  // namespace qs::cli
