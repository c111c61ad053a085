#include "cli/model_options.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "server/openai_protocol.h"
#include "util/error.h"
#include "util/json_parse.h"
#include "util/progress.h"

namespace qs::cli {

std::unique_ptr<Gemma4Model> load_gemma4(const std::string& dir, const std::string& precision,
                                         const std::string& kv_dtype) {
  auto model = Gemma4Model::load(dir, parse_precision(precision), true);
  if (!kv_dtype.empty()) model->set_kv_dtype(parse_kv_dtype(kv_dtype));
  return model;
}

void add_lora_option(CLI::App* cmd, std::string& dir) {
  cmd->add_option("--lora", dir, "PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) "
                                 "applied on top of the model")
      ->check(CLI::ExistingDirectory);
}

std::shared_ptr<const LoraAdapter> load_lora(const std::string& dir, const Gemma4Model& model) {
  if (dir.empty()) return nullptr;
  auto adapter = LoraAdapter::load(dir, model, std::filesystem::path(dir).filename().string());
  const int64_t experts = adapter->expert_parameters();
  const size_t tower = adapter->tower_weights().size();
  fmt::print(stderr, "LoRA adapter {}: {} linears{}{}, rank up to {}, {}\n", dir, adapter->weights().size(),
             tower ? fmt::format(" and {} of the towers", tower) : "",
             experts ? fmt::format(" and {} expert parameters", experts) : "", adapter->max_rank(),
             format_bytes(adapter->bytes()));
  return adapter;
}

MediaPrompt messages_prompt(const std::string& file, const Tokenizer& tokenizer, const ChatOptions& options,
                            const Gemma4Model& model, const std::string& model_dir, const MediaFetchFlags& fetch,
                            const LoraAdapter* lora) {
  try {
    nlohmann::json body = read_json_file(file, kMaxRequestJsonDepth);
    if (!body.is_object() || !body.contains("messages"))
      throw Error("expected a JSON object {\"messages\": [...]} (OpenAI chat messages)");
    MediaOptions media_options;
    media_options.images = model.config().has_vision;
    media_options.audio = model.config().has_audio;
    media_options.fetch = fetch.options();
    std::vector<media::MediaInput> media;
    std::vector<ChatMessage> messages = parse_chat_messages(body["messages"], media_options, media);
    std::vector<int32_t> tokens = tokenizer.encode(render_gemma4_chat(messages, options));
    if (media.empty()) return {std::move(tokens), {}};
    return expand_media_prompt(tokens, media, MediaTowers::load(model, model_dir), tokenizer, lora);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--messages {}: not valid JSON: {}", file, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("--messages {}: {}", file, e.what()));
  }
}

ChatOptions chat_options(const std::string& dir, const Gemma4Model& model, const ConstraintSpec& constraint) {
  ChatOptions co;
  co.dialect = gemma4_chat_dialect_for_checkpoint(dir, model.config().text);
  for (const ToolSpec& t : constraint.tools) co.tools.push_back({t.name, t.description, t.parameters});
  return co;
}

void ModelOptions::add_to(CLI::App* cmd) {
  cmd->add_option("--model", dir, "Checkpoint directory")->required();
  cmd->add_option("--precision", precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
  add_kv_dtype(cmd, kv_dtype);
  cmd->add_option("--max-tokens", max_tokens, "Most tokens to generate");
  cmd->add_option("--temperature", temperature, "0 = greedy (default: generation_config.json)");
  cmd->add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)");
  cmd->add_option("--top-p", top_p, "Nucleus sampling mass");
  cmd->add_option("--min-p", min_p, "Drop tokens below min_p x the top probability");
  cmd->add_option("--seed", seed, "Seed for reproducible sampling");
  cmd->add_option("--stop", stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", ignore_eos, "Generate past end-of-sequence tokens, up to --max-tokens");
  auto* schema = cmd->add_option("--json-schema", json_schema, "Constrain the output to JSON valid against this "
                                 "JSON Schema file")->check(CLI::ExistingFile);
  cmd->add_option("--tools", tools, "Constrain the output to Gemma 4 tool calls (tool_choice required) of this JSON "
                  "array of OpenAI tools")->check(CLI::ExistingFile)->excludes(schema);
  add_speculative_options(cmd, speculative, speculation, draft_model, assistant);
}

SpeculativeConfig ModelOptions::speculative_config() const {
  return speculative_config_of(speculative, speculation, draft_model, assistant);
}

ConstraintSpec ModelOptions::constraint() const {
  ConstraintSpec spec;
  if (!json_schema.empty()) {
    spec.kind = ConstraintSpec::Kind::JsonSchema;
    spec.schema = read_json_file<nlohmann::ordered_json>(json_schema, kMaxRequestJsonDepth);  // declared order
  } else if (!tools.empty()) {
    spec.kind = ConstraintSpec::Kind::ToolCalls;
    const nlohmann::json list = read_json_file(tools, kMaxRequestJsonDepth);
    if (!list.is_array()) throw Error(fmt::format("{}: expected a JSON array of tools", tools));
    for (const auto& t : list) {
      const auto& f = t.contains("function") ? t["function"] : t;
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
        throw Error(fmt::format("{}: every tool needs function.name", tools));
      spec.tools.push_back({f["name"].get<std::string>(), f.value("description", ""),
                            f.value("parameters", nlohmann::json::object())});
    }
  }
  return spec;
}

SamplingParams ModelOptions::sampling_from(const GenerationConfig& g) const {
  SamplingParams p = g.default_sampling();
  if (temperature) p.temperature = *temperature;
  if (top_k) p.top_k = *top_k;
  if (top_p) p.top_p = *top_p;
  if (min_p) p.min_p = *min_p;
  if (seed) p.seed = *seed;
  return p;
}

LoadedModel load_model(const ModelOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel m{load_gemma4(o.dir, o.precision, o.kv_dtype), std::nullopt, read_generation_config(o.dir)};
  std::filesystem::path tok = std::filesystem::path(o.dir) / "tokenizer.json";
  if (std::filesystem::exists(tok)) m.tokenizer = Tokenizer::load(tok);
  if (!o.draft_model.empty()) m.draft_model = Gemma4Model::load(o.draft_model, parse_precision(o.precision), true);
  if (!o.assistant.empty()) m.assistant = Gemma4Assistant::load(o.assistant, *m.model, true);
  make_drafter(o.speculative_config(), *m.model, m.draft_model.get(), 1, m.assistant.get());  // what is missing
  fmt::print(stderr, "loaded {} ({} weights, {} activations, {} KV, {}) in {:.2f} s\n", o.dir,
             m.model->int4_weights() ? "int4" : "bf16", o.precision, kv_dtype_name(m.model->kv_dtype()),
             format_bytes(m.model->weight_bytes()),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return m;
}

const Tokenizer& need_tokenizer(const LoadedModel& m, const std::string& dir, const char* why) {
  if (!m.tokenizer) throw Error(fmt::format("{}: no tokenizer.json, which {} needs", dir, why));
  return *m.tokenizer;
}

void print_speed(const GenerationResult& r, size_t prompt_tokens) {
  std::string speculation;
  if (r.draft_tokens > 0) {
    speculation = fmt::format("; speculative: {} of {} draft tokens accepted ({:.1f}%), by draft position:",
                              r.accepted_tokens, r.draft_tokens, 100.0 * r.accepted_tokens / r.draft_tokens);
    for (size_t i = 0; i < r.draft_tokens_per_pos.size(); ++i)
      speculation += fmt::format(" {}/{}", r.accepted_tokens_per_pos.size() > i ? r.accepted_tokens_per_pos[i] : 0,
                                 r.draft_tokens_per_pos[i]);
  }
  fmt::print(stderr, "\n[{} prompt tokens, {:.1f} tokens/s prefill; {} generated, {:.1f} tokens/s decode; finish: {}{}]\n",
             prompt_tokens, r.prefill_seconds > 0 ? prompt_tokens / r.prefill_seconds : 0.0, r.tokens.size(),
             r.decode_seconds > 0 && r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0.0, r.finish_reason,
             speculation);
}

}  // namespace qs::cli
