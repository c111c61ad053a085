#include "server/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>

#include "server/request_fields.h"

namespace qs {

using json = nlohmann::json;
using namespace request_fields;

namespace {

// The parameter a SamplingParams::validate() message is about: its leading identifier.
std::string leading_identifier(std::string_view message) {
  size_t n = 0;
  while (n < message.size() && (std::islower(static_cast<unsigned char>(message[n])) || message[n] == '_')) ++n;
  return std::string(message.substr(0, n));
}

SamplingParams parse_sampling(const json& body, const ServedModel& model) {
  SamplingParams p = model.generation.default_sampling();
  if (auto* v = find(body, "temperature")) p.temperature = static_cast<float>(as_number(*v, "temperature"));
  if (auto* v = find(body, "top_p")) p.top_p = static_cast<float>(as_number(*v, "top_p"));
  if (auto* v = find(body, "top_k")) p.top_k = static_cast<int32_t>(as_integer_in(*v, "top_k", -1, INT32_MAX));
  if (auto* v = find(body, "min_p")) p.min_p = static_cast<float>(as_number(*v, "min_p"));
  if (auto* v = find(body, "repetition_penalty"))
    p.repetition_penalty = static_cast<float>(as_number(*v, "repetition_penalty"));
  if (auto* v = find(body, "presence_penalty"))
    p.presence_penalty = static_cast<float>(as_number(*v, "presence_penalty"));
  if (auto* v = find(body, "frequency_penalty"))
    p.frequency_penalty = static_cast<float>(as_number(*v, "frequency_penalty"));
  if (auto* v = find(body, "seed")) p.seed = static_cast<uint64_t>(as_integer(*v, "seed"));
  if (auto* v = find(body, "logit_bias")) {
    if (!v->is_object())
      bad("logit_bias", fmt::format("logit_bias must be an object mapping token ids to biases, got {}", describe(*v)));
    for (const auto& [key, bias] : v->items()) {
      int64_t id = -1;
      auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= model.vocab_size)
        bad("logit_bias", fmt::format("logit_bias: key \"{}\" is not a token id in [0, {})", key, model.vocab_size));
      double b = as_number(bias, "logit_bias");
      if (b < -100 || b > 100)
        bad("logit_bias", fmt::format("logit_bias for token {} must be in [-100, 100], got {}", id, b));
      p.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  return p;
}

// "speculative": {"method": "ngram" | "draft_model" | "assistant" | "none", "num_speculative_tokens", "prompt_lookup_min",
// "prompt_lookup_max"} (vLLM's speculative_config names), or false: this request's speculative decoding, in place of
// the server's default.
SpeculativeConfig parse_speculative(const json& v) {
  SpeculativeConfig c;
  if (v.is_boolean() && !v.get<bool>()) return c;
  if (!v.is_object())
    bad("speculative", fmt::format("speculative must be an object {{\"method\": ...}} or false, got {}", describe(v)));
  const json* method = find(v, "method");
  if (!method) bad("speculative", "speculative.method is required: none, ngram, draft_model or assistant");
  for (const auto& [key, value] : v.items())
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_min" && key != "prompt_lookup_max")
      bad("speculative", fmt::format("speculative.{}: unknown field (expected method, num_speculative_tokens, "
                                     "prompt_lookup_min, prompt_lookup_max)", key));
  try {
    c.method = parse_speculative_method(as_string(*method, "speculative.method"));
  } catch (const Error& e) {
    bad("speculative", std::string("speculative.method: ") + e.what());
  }
  if (auto* n = find(v, "num_speculative_tokens"))
    c.num_speculative_tokens = as_integer_in(*n, "speculative.num_speculative_tokens", 1, kMaxSpeculativeTokens);
  if (auto* n = find(v, "prompt_lookup_min")) c.prompt_lookup_min = as_integer_in(*n, "speculative.prompt_lookup_min", 1, 64);
  if (auto* n = find(v, "prompt_lookup_max")) c.prompt_lookup_max = as_integer_in(*n, "speculative.prompt_lookup_max", 1, 64);
  if (c.prompt_lookup_max < c.prompt_lookup_min)
    bad("speculative", fmt::format("speculative.prompt_lookup_max ({}) is below prompt_lookup_min ({})",
                                   c.prompt_lookup_max, c.prompt_lookup_min));
  return c;
}

std::vector<std::string> parse_stop(const json& body) {
  std::vector<std::string> stop;
  const json* v = find(body, "stop");
  if (!v) return stop;
  auto add = [&](const json& s) {
    std::string text = as_string(s, "stop");
    if (!text.empty()) stop.push_back(std::move(text));
  };
  if (v->is_array()) {
    for (const json& s : *v) add(s);
  } else if (v->is_string()) {
    add(*v);
  } else {
    bad("stop", fmt::format("stop must be a string or an array of strings, got {}", describe(*v)));
  }
  return stop;
}

}  // namespace

ModelChoice resolve_model(const json& body, const ServedModel& model) {
  const json* v = find(body, "model");
  if (!v) return {};
  const std::string requested = as_string(*v, "model");
  if (requested == model.name) return {};
  if (model.find_adapter)
    if (auto lora = model.find_adapter(requested)) return {requested, std::move(lora)};
  if (model.strict_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist.", requested), "model", "NotFoundError", "404");
  return {};
}

void apply_model_choice(CompletionRequest& request, const ModelChoice& choice) {
  request.model = choice.name;
  for (EngineRequest& e : request.choices) e.lora = choice.lora;
}

CompletionRequest build_request(ApiKind kind, const json& body, const ServedModel& model, std::vector<int32_t> prompt,
                                LogprobOptions logprobs, int64_t min_max_tokens) {
  CompletionRequest r;
  r.kind = kind;
  r.logprobs = logprobs;
  if (auto* v = find(body, "stream")) r.stream = as_bool(*v, "stream");
  if (auto* v = find(body, "stream_options")) {
    if (!v->is_object()) bad("stream_options", fmt::format("stream_options must be an object, got {}", describe(*v)));
    if (!r.stream) bad("stream_options", "stream_options is only allowed when stream is true");
    if (auto* u = find(*v, "include_usage")) r.include_usage = as_bool(*u, "stream_options.include_usage");
    if (auto* u = find(*v, "continuous_usage_stats"))
      r.continuous_usage = r.include_usage && as_bool(*u, "stream_options.continuous_usage_stats");
  }
  int64_t n = 1;
  if (auto* v = find(body, "n")) n = as_integer_in(*v, "n", 1, 128);

  SamplingParams sampling = parse_sampling(body, model);
  sampling.logprobs = logprobs.enabled;
  sampling.top_logprobs = logprobs.top;
  try {
    sampling.validate();
  } catch (const Error& e) {
    bad(leading_identifier(e.what()), e.what());
  }

  EngineRequest base;
  base.stop = parse_stop(body);
  if (auto* v = find(body, "stop_token_ids")) base.stop_token_ids = token_list(*v, "stop_token_ids", model);
  if (auto* v = find(body, "ignore_eos")) base.ignore_eos = as_bool(*v, "ignore_eos");
  if (auto* v = find(body, "speculative")) base.speculative = parse_speculative(*v);

  // max_tokens: the request's, else what is left of the context (capped by generation_config's max_new_tokens).
  const std::string prompt_param = kind == ApiKind::Chat ? "messages" : "prompt";
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  if (prompt.empty()) bad(prompt_param, fmt::format("{} is empty", prompt_param));
  std::optional<int64_t> max_tokens;
  std::string max_param;
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (kind == ApiKind::Completion && std::string_view(name) == "max_completion_tokens") continue;
    if (auto* v = find(body, name)) {
      max_tokens = as_integer(*v, name);
      max_param = name;
      if (*max_tokens < min_max_tokens)
        bad(name, fmt::format("{} must be at least {}, got {}", name, min_max_tokens, *max_tokens));
      break;
    }
  }
  if (prompt_tokens >= model.max_context)
    bad(prompt_param, fmt::format("This model's maximum context length is {} tokens. However, your request has {} "
                                  "input tokens, which leaves no room for a completion. Please reduce the length "
                                  "of the {}.",
                                  model.max_context, prompt_tokens, prompt_param));
  if (max_tokens && prompt_tokens + *max_tokens > model.max_context)
    bad(max_param, fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                               "({} in the {}, {} in the completion). Please reduce the length of the {} or "
                               "completion.",
                               model.max_context, prompt_tokens + *max_tokens, prompt_tokens, prompt_param,
                               *max_tokens, prompt_param));
  if (!max_tokens) {
    max_tokens = model.max_context - prompt_tokens;
    if (model.generation.max_new_tokens) max_tokens = std::min(*max_tokens, *model.generation.max_new_tokens);
  }
  base.max_tokens = *max_tokens;
  base.prompt = std::move(prompt);
  r.prompt_tokens = prompt_tokens;

  for (int64_t i = 0; i < n; ++i) {
    EngineRequest e = base;
    e.sampling = sampling;
    if (sampling.seed) e.sampling.seed = *sampling.seed + static_cast<uint64_t>(i);
    r.choices.push_back(std::move(e));
  }
  return r;
}

bool tokens_as_ids(const json& body) {
  const json* v = find(body, "return_tokens_as_token_ids");
  return v && as_bool(*v, "return_tokens_as_token_ids");
}

ConstraintSpec response_format_constraint(const json& body) {
  ConstraintSpec spec;
  const json* v = find(body, "response_format");
  if (!v) return spec;
  const json* type = v->is_object() ? find(*v, "type") : nullptr;
  if (!type || !type->is_string())
    bad("response_format", "response_format must be an object with a type (text, json_object or json_schema)");
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "text") return spec;
  if (t == "json_object") {
    spec.kind = ConstraintSpec::Kind::JsonObject;
    return spec;
  }
  if (t != "json_schema")
    bad("response_format", fmt::format("response_format.type \"{}\" is not one of text, json_object, json_schema", t));
  const json* js = find(*v, "json_schema");
  if (!js || !js->is_object()) bad("response_format", "response_format.json_schema must be an object");
  const json* name = find(*js, "name");
  if (!name || !name->is_string()) bad("response_format", "response_format.json_schema.name is required");
  const json* schema = find(*js, "schema");
  if (schema && !schema->is_object() && !schema->is_boolean())
    bad("response_format", "response_format.json_schema.schema must be a JSON Schema (an object)");
  spec.kind = ConstraintSpec::Kind::JsonSchema;
  spec.schema = schema ? *schema : json::object();
  if (auto* strict = find(*js, "strict")) spec.strict = as_bool(*strict, "response_format.json_schema.strict");
  return spec;
}

}  // namespace qs
