#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "server/completion_prompts.h"
#include "server/image_budget.h"
#include "server/request_id.h"
#include "text/tokenizer.h"
#include "util/json_parse.h"

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type, std::string code)
    : Error(message), status_(status), param_(std::move(param)), type_(std::move(type)), code_(std::move(code)) {}

ojson error_body(std::string_view message, std::string_view type, std::string_view param, std::string_view code) {
  ojson e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  // vLLM's codes are the HTTP status as a number (404), OpenAI's are words (invalid_api_key): each as its client
  // expects it.
  const bool numeric = !code.empty() && code.find_first_not_of("0123456789") == std::string_view::npos;
  e["code"] = code.empty() ? ojson(nullptr) : numeric ? ojson(std::stoi(std::string(code))) : ojson(code);
  ojson body;
  body["error"] = std::move(e);
  return body;
}

ojson error_body(const ApiError& error) { return error_body(error.what(), error.type(), error.param(), error.code()); }

std::string dump_json(const ojson& value) { return value.dump(-1, ' ', false, ojson::error_handler_t::replace); }

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return fmt::format("a boolean ({})", v.get<bool>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return fmt::format("an integer ({})", v.dump());
    case json::value_t::number_float: return fmt::format("a number ({})", v.dump());
    case json::value_t::string: {
      std::string s = v.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      return fmt::format("a string ({})", json(s).dump(-1, ' ', false, json::error_handler_t::replace));
    }
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

// The field, or nullptr when it is absent or null (OpenAI clients send null for "not set").
const json* find(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double as_number(const json& v, const std::string& name) {
  if (!v.is_number()) bad(name, fmt::format("{} must be a number, got {}", name, describe(v)));
  return v.get<double>();
}

int64_t as_integer(const json& v, const std::string& name) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(name, fmt::format("{} is too large: {}", name, v.dump()));
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  bad(name, fmt::format("{} must be an integer, got {}", name, describe(v)));
}

int64_t as_integer_in(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  int64_t x = as_integer(v, name);
  if (x < lo || x > hi) bad(name, fmt::format("{} must be in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

bool as_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, fmt::format("{} must be a boolean, got {}", name, describe(v)));
  return v.get<bool>();
}

std::string as_string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, fmt::format("{} must be a string, got {}", name, describe(v)));
  return v.get<std::string>();
}

int32_t token_in_vocab(const json& v, const std::string& name, const ServedModel& model) {
  int64_t id = as_integer(v, name);
  if (id < 0 || id >= model.vocab_size)
    bad(name, fmt::format("{}: token id {} is outside the vocabulary of {} tokens", name, id, model.vocab_size));
  return static_cast<int32_t>(id);
}

std::vector<int32_t> token_list(const json& v, const std::string& name, const ServedModel& model) {
  if (!v.is_array()) bad(name, fmt::format("{} must be an array of token ids, got {}", name, describe(v)));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& x : v) ids.push_back(token_in_vocab(x, name, model));
  return ids;
}

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

// With --served-model-name, a request must name that model; vLLM answers others with this 404 (and, as vLLM, a
// request that names no model gets the served one).
// Checked before the prompt is read, as vLLM does.
void check_model_name(const json& body, const ServedModel& model) {
  const json* v = find(body, "model");
  if (!v) return;
  const std::string requested = as_string(*v, "model");
  if (model.strict_name && requested != model.name)
    throw ApiError(404, fmt::format("The model `{}` does not exist.", requested), "model", "NotFoundError", "404");
}

// Everything chat and completions share, once the prompt is known.
CompletionRequest build_request(ApiKind kind, const json& body, const ServedModel& model, std::vector<int32_t> prompt,
                                LogprobOptions logprobs, int64_t min_max_tokens = 1) {
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

// Requests nest a few levels (a tool's parameter schema perhaps a dozen). Deeper JSON is refused while parsing, before
// the recursive code that reads it (nlohmann's copy and dump, the chat template's argument and schema formatting,
// the schema compiler) could overflow the stack: 400 KB of nested tool parameters did (fuzz/openai_request_fuzz
// on a crafted input; the fuzzer's 16 KB inputs nest too little to reach it).

// `text` as JSON, else ApiError 400 (param `param`) saying what `what` is not.
json parse_request_json(std::string_view text, const std::string& param, const std::string& what) {
  json::parser_callback_t limit_depth = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxRequestJsonDepth)
      bad(param, fmt::format("{} nests more than {} levels deep", what, kMaxRequestJsonDepth));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit_depth);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number beyond double (1e999)
    bad(param, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

}  // namespace

json parse_json_body(std::string_view body) {
  json v = parse_request_json(body, "", "the request body");
  if (!v.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", describe(v)));
  return v;
}

namespace {

// One image or audio part: its bytes decoded, where it came from, checked against what the model reads.
media::MediaInput media_part(const json& part, const std::string& type, const std::string& where,
                             const MediaOptions& options) {
  const bool image = type == "image_url";
  const media::MediaKind kind = image ? media::MediaKind::Image : media::MediaKind::Audio;
  if (image ? !options.images : !options.audio)
    bad("messages", fmt::format("{}: this model does not read {} input (no {} tower is loaded)", where,
                                media::media_kind_name(kind), image ? "vision" : "audio"));
  try {
    if (image) {
      const json* holder = find(part, "image_url");
      const json* url = holder && holder->is_object() ? find(*holder, "url") : nullptr;
      if (!url || !url->is_string())
        bad("messages", fmt::format("{}.image_url.url is required (a data:image/...;base64 URL)", where));
      const std::string& text = url->get_ref<const std::string&>();
      const size_t colon = text.find(':');
      const std::string scheme = colon <= 5 ? media::ascii_lower(text.substr(0, colon)) : "";
      if ((scheme == "http" || scheme == "https") && !options.fetch.enabled())
        bad("messages", fmt::format("{}.image_url.url: this server does not fetch images from URLs (its operator "
                                    "allows hosts with --allowed-media-domains); send the image as a "
                                    "data:image/...;base64 URL",
                                    where));
      if (scheme == "http" || scheme == "https")
        return media::fetch_media(text, kind, options.fetch, options.max_bytes, where + ".image_url.url");
      return media::parse_data_url(text, kind, options.max_bytes, where + ".image_url.url");
    }
    const json* holder = find(part, "input_audio");
    const json* data = holder && holder->is_object() ? find(*holder, "data") : nullptr;
    const json* format = holder && holder->is_object() ? find(*holder, "format") : nullptr;
    if (!data || !data->is_string() || !format || !format->is_string())
      bad("messages", fmt::format("{}.input_audio needs data (base64) and format (\"wav\", \"mp3\", ...)", where));
    media::MediaInput input;
    input.kind = kind;
    input.declared_format = format->get<std::string>();
    input.bytes = media::decode_base64(data->get_ref<const std::string&>(), options.max_bytes, where + ".input_audio.data");
    input.where = where;
    return input;
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

// A message's content: a string, a list of parts, or null/absent (empty). Text parts of system, developer and tool
// messages are joined by newlines (the templates print those contents whole); user and assistant parts are kept
// for the template to render one by one, media parts becoming markers and their bytes appended to `media`.
void message_content(const json& m, size_t i, ChatMessage& msg, const MediaOptions& options,
                     std::vector<media::MediaInput>& media) {
  const json* content = find(m, "content");
  if (!content || content->is_null()) return;
  if (content->is_string()) {
    msg.content = content->get<std::string>();
    return;
  }
  if (!content->is_array())
    bad("messages", fmt::format("messages[{}].content must be a string or an array of parts, got {}", i,
                                describe(*content)));
  const bool turn_parts = msg.role == "user" || msg.role == "assistant";
  for (size_t k = 0; k < content->size(); ++k) {
    const json& part = (*content)[k];
    const std::string where = fmt::format("messages[{}].content[{}]", i, k);
    const json* type = part.is_object() ? find(part, "type") : nullptr;
    const std::string kind = type && type->is_string() ? type->get<std::string>() : "";
    if (kind == "text") {
      const json* t = find(part, "text");
      if (!t || !t->is_string()) bad("messages", fmt::format("{}.text must be a string", where));
      if (!msg.content.empty()) msg.content += "\n";
      msg.content += t->get<std::string>();
      msg.parts.push_back({ChatContentPart::Kind::Text, t->get<std::string>()});
    } else if ((kind == "image_url" || kind == "input_audio") && turn_parts) {
      if (media.size() >= static_cast<size_t>(options.max_items))
        bad("messages", fmt::format("{}: a request may carry at most {} images and audio clips", where, options.max_items));
      media.push_back(media_part(part, kind, where, options));
      if (kind == "image_url")
        media.back().image_soft_tokens = image_detail_soft_tokens(part.at("image_url"), options, where + ".image_url");
      msg.parts.push_back({kind == "image_url" ? ChatContentPart::Kind::Image : ChatContentPart::Kind::Audio, ""});
    } else if (kind == "image_url" || kind == "input_audio") {
      bad("messages", fmt::format("{}: {} parts are read in user and assistant messages only, not in a {} message",
                                  where, kind, msg.role));
    } else {
      bad("messages", fmt::format("{}: the part type must be \"text\", \"image_url\" or \"input_audio\"", where));
    }
  }
  if (!turn_parts) msg.parts.clear();
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments: JSON string}}]. The
// arguments reach the template parsed, as vLLM passes them (an empty string is {}).
std::vector<ChatToolCall> message_tool_calls(const json& calls, size_t i) {
  const std::string where = fmt::format("messages[{}].tool_calls", i);
  if (!calls.is_array()) bad("messages", fmt::format("{} must be an array, got {}", where, describe(calls)));
  std::vector<ChatToolCall> out;
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const json* function = c.is_object() ? find(c, "function") : nullptr;
    const json* name = function && function->is_object() ? find(*function, "name") : nullptr;
    if (!name || !name->is_string())
      bad("messages", fmt::format("{}[{}].function.name must be a string", where, j));
    ChatToolCall call;
    call.name = name->get<std::string>();
    if (auto* id = find(c, "id")) call.id = as_string(*id, "messages");
    const json* arguments = find(*function, "arguments");
    if (arguments && arguments->is_string() && !arguments->get_ref<const std::string&>().empty()) {
      call.arguments = parse_request_json(arguments->get_ref<const std::string&>(), "messages",
                                          fmt::format("{}[{}].function.arguments", where, j));
    } else if (arguments && arguments->is_object()) {
      call.arguments = *arguments;
    }
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

std::vector<ChatMessage> parse_chat_messages(const json& messages, const MediaOptions& options,
                                            std::vector<media::MediaInput>& media) {
  if (!messages.is_array())
    bad("messages", fmt::format("messages must be an array of {{role, content}} objects, got {}", describe(messages)));
  if (messages.empty()) bad("messages", "messages must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) bad("messages", fmt::format("messages[{}] must be an object, got {}", i, describe(m)));
    const json* role = find(m, "role");
    if (!role || !role->is_string()) bad("messages", fmt::format("messages[{}].role must be a string", i));
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool")
      bad("messages", fmt::format("messages[{}].role \"{}\" is not supported; expected system, developer, user, "
                                  "assistant or tool",
                                  i, msg.role));
    message_content(m, i, msg, options, media);
    if (msg.role == "assistant") {
      if (auto* calls = find(m, "tool_calls")) msg.tool_calls = message_tool_calls(*calls, i);
      for (const char* field : {"reasoning_content", "reasoning"})
        if (auto* r = find(m, field); r && msg.reasoning_content.empty()) msg.reasoning_content = as_string(*r, "messages");
    }
    if (msg.role == "tool") {
      const json* id = find(m, "tool_call_id");
      if (!id || !id->is_string())
        bad("messages", fmt::format("messages[{}].tool_call_id is required for a tool message (the id of the call it "
                                    "answers)",
                                    i));
      msg.tool_call_id = id->get<std::string>();
      if (auto* name = find(m, "name")) msg.name = as_string(*name, "messages");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<ChatTool> parse_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", fmt::format("tools must be an array, got {}", describe(tools)));
  std::vector<ChatTool> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const json* type = t.is_object() ? find(t, "type") : nullptr;
    if (!type || !type->is_string() || type->get<std::string>() != "function")
      bad("tools", fmt::format("tools[{}].type must be \"function\"", i));
    const json* function = find(t, "function");
    if (!function || !function->is_object())
      bad("tools", fmt::format("tools[{}].function must be an object", i));
    const json* name = find(*function, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
      bad("tools", fmt::format("tools[{}].function.name is required (a non-empty string)", i));
    ChatTool tool;
    tool.name = name->get<std::string>();
    if (auto* d = find(*function, "description")) tool.description = as_string(*d, "tools");
    if (auto* p = find(*function, "parameters")) {
      const json* ptype = p->is_object() ? find(*p, "type") : nullptr;
      const json* props = p->is_object() ? find(*p, "properties") : nullptr;
      if (!p->is_object() || (ptype && *ptype != "object") || (props && !props->is_object()))
        bad("tools", fmt::format("tools[{}].function.parameters must be a JSON Schema of an object ({{\"type\": "
                                 "\"object\", \"properties\": {{...}}}}), got {}",
                                 i, p->is_object() ? p->dump() : describe(*p)));
      tool.parameters = *p;
    }
    for (const ChatTool& earlier : out)
      if (earlier.name == tool.name) bad("tools", fmt::format("tools[{}]: function '{}' is declared twice", i, tool.name));
    out.push_back(std::move(tool));
  }
  return out;
}

std::string chat_prompt_text(std::span<const ChatMessage> messages, const ServedModel& model,
                             bool add_generation_prompt, bool enable_thinking, std::span<const ChatTool> tools) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.enable_thinking = enable_thinking;
  options.dialect = model.dialect;
  options.tools.assign(tools.begin(), tools.end());
  try {
    return render_gemma4_chat(messages, options);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

std::vector<int32_t> chat_prompt_tokens(std::span<const ChatMessage> messages, const ServedModel& model,
                                        bool add_generation_prompt, bool enable_thinking) {
  return model.tokenizer->encode(chat_prompt_text(messages, model, add_generation_prompt, enable_thinking, {}));
}

namespace {

// Thinking: chat_template_kwargs.enable_thinking (vLLM's convention), or reasoning_effort: "none" is off, any
// other effort (minimal, low, medium, high) is on; Gemma 4 has no levels.
bool thinking_requested(const json& body) {
  bool on = false;
  if (auto* v = find(body, "reasoning_effort")) on = as_string(*v, "reasoning_effort") != "none";
  if (auto* v = find(body, "chat_template_kwargs")) {
    if (!v->is_object())
      bad("chat_template_kwargs", fmt::format("chat_template_kwargs must be an object, got {}", describe(*v)));
    if (auto* t = find(*v, "enable_thinking")) on = as_bool(*t, "chat_template_kwargs.enable_thinking");
  }
  return on;
}

struct ToolChoice {
  enum class Mode { Auto, None, Required, Named } mode = Mode::Auto;
  std::string name;
};

ToolChoice parse_tool_choice(const json& body, std::span<const ChatTool> tools) {
  ToolChoice choice;
  const json* v = find(body, "tool_choice");
  if (!v) return choice;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (s == "auto") choice.mode = ToolChoice::Mode::Auto;
    else if (s == "none") choice.mode = ToolChoice::Mode::None;
    else if (s == "required") choice.mode = ToolChoice::Mode::Required;
    else bad("tool_choice", fmt::format("tool_choice \"{}\" is not one of auto, none, required", s));
  } else {
    const json* function = v->is_object() ? find(*v, "function") : nullptr;
    const json* name = function && function->is_object() ? find(*function, "name") : nullptr;
    if (!name || !name->is_string())
      bad("tool_choice", "tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}");
    choice.mode = ToolChoice::Mode::Named;
    choice.name = name->get<std::string>();
    if (std::none_of(tools.begin(), tools.end(), [&](const ChatTool& t) { return t.name == choice.name; }))
      bad("tool_choice", fmt::format("tool_choice names function '{}', which is not in tools", choice.name));
  }
  if ((choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Named) && tools.empty())
    bad("tool_choice", "tool_choice requires a tool call but no tools were given");
  return choice;
}

ToolSpec tool_spec(const ChatTool& tool) {
  return {tool.name, tool.description, tool.parameters.is_null() ? json::object() : tool.parameters};
}

// response_format: text | json_object | json_schema {name, schema, strict}.
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

// What a chat request asks the output to obey: a forced tool call wins over response_format (as vLLM: the tool
// call is the answer).
ConstraintSpec chat_constraint(const json& body, std::span<const ChatTool> tools, const ToolChoice& choice,
                               bool thinking) {
  ConstraintSpec spec = response_format_constraint(body);
  const json* parallel = find(body, "parallel_tool_calls");
  const bool parallel_calls = !parallel || as_bool(*parallel, "parallel_tool_calls");
  if (choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Named) {
    spec = {};
    spec.kind = ConstraintSpec::Kind::ToolCalls;
    for (const ChatTool& t : tools)
      if (choice.mode == ToolChoice::Mode::Required || t.name == choice.name) spec.tools.push_back(tool_spec(t));
    spec.parallel_calls = parallel_calls;
  }
  spec.after_thinking = spec.active() && thinking;
  return spec;
}

struct ChatPrompt {
  std::vector<int32_t> tokens;  // with one marker token per media item, not yet expanded to its soft tokens
  OutputParsing parsing;
  ConstraintSpec constraint;
  std::vector<media::MediaInput> media;
};

ChatPrompt chat_prompt_from_body(const json& body, const ServedModel& model) {
  const json* messages = find(body, "messages");
  if (!messages) bad("messages", "messages is required");
  ChatPrompt out;
  std::vector<ChatMessage> parsed = parse_chat_messages(*messages, model.media, out.media);
  apply_image_soft_tokens(out.media, request_image_soft_tokens(body, model.media));
  bool add_generation_prompt = true;
  if (auto* v = find(body, "add_generation_prompt")) add_generation_prompt = as_bool(*v, "add_generation_prompt");
  const bool thinking = thinking_requested(body);
  std::vector<ChatTool> tools;
  if (auto* v = find(body, "tools")) tools = parse_tools(*v);
  ToolChoice choice = parse_tool_choice(body, tools);

  // tool_choice none still declares the tools (vLLM's default) but reads no calls back.
  std::string text = chat_prompt_text(parsed, model, add_generation_prompt, thinking, tools);
  out.tokens = model.tokenizer->encode(text);
  out.parsing.tool_calls = !tools.empty() && choice.mode != ToolChoice::Mode::None;
  out.parsing.reasoning = thinking;
  out.parsing.enabled = out.parsing.tool_calls || thinking;
  out.parsing.starts_in_thought = text.ends_with("<|channel>thought\n");
  out.constraint = chat_constraint(body, tools, choice, thinking);
  return out;
}

}  // namespace

CompletionRequest parse_chat_request(const json& body, const ServedModel& model) {
  check_model_name(body, model);
  ChatPrompt prompt = chat_prompt_from_body(body, model);
  std::vector<MediaSpan> spans;
  if (!prompt.media.empty() && model.prepare_media) {
    try {
      MediaPrompt expanded = model.prepare_media(prompt.tokens, prompt.media);
      prompt.tokens = std::move(expanded.tokens);
      spans = std::move(expanded.spans);
      prompt.media.clear();
    } catch (const Error& e) {
      bad("messages", e.what());
    }
  }
  LogprobOptions lp;
  if (auto* v = find(body, "logprobs")) lp.enabled = as_bool(*v, "logprobs");
  if (auto* v = find(body, "top_logprobs")) {
    lp.top = static_cast<int32_t>(as_integer_in(*v, "top_logprobs", 0, kMaxTopLogprobs));
    if (lp.top > 0 && !lp.enabled) bad("top_logprobs", "top_logprobs needs logprobs to be true");
  }
  lp.tokens_as_ids = tokens_as_ids(body);
  CompletionRequest r = build_request(ApiKind::Chat, body, model, std::move(prompt.tokens), lp);
  r.parsing = prompt.parsing;
  r.media = std::move(prompt.media);
  for (EngineRequest& e : r.choices) {
    e.constraint = prompt.constraint;
    e.keep_chat_markers = prompt.parsing.enabled;  // the splitter reads the template's markers
    e.media = spans;
  }
  return r;
}

CompletionRequest parse_completion_request(const json& body, const ServedModel& model) {
  check_model_name(body, model);
  const json* prompt = find(body, "prompt");
  if (!prompt) bad("prompt", "prompt is required");
  std::vector<CompletionPrompt> prompts = parse_completion_prompts(*prompt, model);
  const bool echo = parse_echo(body);
  if (response_format_constraint(body).active())
    bad("response_format", "response_format is supported on /v1/chat/completions only");
  if (auto* v = find(body, "suffix"); v && !as_string(*v, "suffix").empty())
    bad("suffix", "suffix is not supported by this server");
  if (auto* v = find(body, "best_of"); v && as_integer(*v, "best_of") > 1)
    bad("best_of", "best_of is not supported by this server (use n)");
  LogprobOptions lp;
  if (auto* v = find(body, "logprobs")) {
    lp.enabled = true;
    lp.top = static_cast<int32_t>(as_integer_in(*v, "logprobs", 0, kMaxTopLogprobs));
  }
  lp.tokens_as_ids = tokens_as_ids(body);
  // A batch's choices: each prompt's n in turn; with echo, each scores its prompt (max_tokens 0: only that).
  std::optional<CompletionRequest> all;
  for (CompletionPrompt& p : prompts) {
    CompletionRequest one = build_request(ApiKind::Completion, body, model, std::move(p.tokens), lp, echo ? 0 : 1);
    for (EngineRequest& e : one.choices) {
      if (echo && (lp.enabled || e.max_tokens == 0)) e.prompt_logprobs = lp.top;
      if (echo) one.echo_texts.push_back(p.text);
    }
    if (!all) {
      all = std::move(one);
      continue;
    }
    all->prompt_tokens += one.prompt_tokens;
    for (EngineRequest& e : one.choices) all->choices.push_back(std::move(e));
    for (std::string& t : one.echo_texts) all->echo_texts.push_back(std::move(t));
  }
  all->echo = echo;
  return std::move(*all);
}

std::vector<int32_t> parse_tokenize_request(const json& body, const ServedModel& model) {
  if (find(body, "messages")) {
    ChatPrompt prompt = chat_prompt_from_body(body, model);
    if (!prompt.media.empty())
      bad("messages", fmt::format("{}: /tokenize counts text only; a media part's tokens depend on its decoding",
                                  prompt.media.front().where));
    return std::move(prompt.tokens);
  }
  const json* prompt = find(body, "prompt");
  if (!prompt) bad("prompt", "give either prompt (a string) or messages");
  std::string text = as_string(*prompt, "prompt");
  bool add_special = true;
  if (auto* v = find(body, "add_special_tokens")) add_special = as_bool(*v, "add_special_tokens");
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(model.generation.bos_token_id);
  auto encoded = model.tokenizer->encode(text);
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  return ids;
}

std::vector<int32_t> parse_detokenize_request(const json& body, const ServedModel& model) {
  const json* tokens = find(body, "tokens");
  if (!tokens) bad("tokens", "tokens is required");
  return token_list(*tokens, "tokens", model);
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  ojson u;
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  return u;
}

namespace {

std::string new_tool_call_id() {
  return random_id("call_");
}

ojson tool_call_json(const ParsedToolCall& call) {
  ojson function;
  function["name"] = call.name;
  function["arguments"] = call.arguments.dump(-1, ' ', false, json::error_handler_t::replace);
  ojson c;
  c["id"] = new_tool_call_id();
  c["type"] = "function";
  c["function"] = std::move(function);
  return c;
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

ModelOutputSplitter splitter_for(const OutputParsing& parsing) {
  return ModelOutputSplitter(parsing.starts_in_thought, parsing.tool_calls);
}

}  // namespace

ojson chat_message(const std::string& text, const OutputParsing& parsing, std::string& finish_reason) {
  ojson message;
  message["role"] = "assistant";
  if (!parsing.enabled) {
    message["content"] = text;
    return message;
  }
  ModelOutputSplitter splitter = splitter_for(parsing);
  OutputDelta all = splitter.push(text);
  all.append(splitter.finish());
  // Only calls: content is null (whitespace around the calls is not an answer).
  message["content"] = all.calls.empty() || !all_space(all.content) ? ojson(all.content) : ojson(nullptr);
  if (parsing.reasoning) message["reasoning_content"] = all.reasoning;
  if (!all.calls.empty()) {
    ojson calls = ojson::array();
    for (const ParsedToolCall& call : all.calls) calls.push_back(tool_call_json(call));
    message["tool_calls"] = std::move(calls);
    if (finish_reason != "error" && finish_reason != "abort") finish_reason = "tool_calls";
  }
  return message;
}

ojson completion_response(const CompletionRequest& request, const ServedModel& model, std::string_view id,
                          int64_t created, std::span<const ChoiceResult> choices) {
  const bool chat = request.kind == ApiKind::Chat;
  ojson r;
  r["id"] = id;
  r["object"] = chat ? "chat.completion" : "text_completion";
  r["created"] = created;
  r["model"] = model.name;
  ojson list = ojson::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    completion_tokens += c.completion_tokens;
    ojson choice;
    choice["index"] = i;
    ojson logprobs = nullptr;
    int64_t offset = 0;
    if (request.logprobs.enabled && request.echo)
      logprobs = echo_completion_logprobs(request.choices[i].prompt, c.prompt_logprobs, c.tokens, request.logprobs,
                                          *model.tokenizer, offset);
    else if (request.logprobs.enabled)
      logprobs = chat ? chat_logprobs(c.tokens, request.logprobs, *model.tokenizer)
                      : completion_logprobs(c.tokens, request.logprobs, *model.tokenizer, offset);
    std::string finish_reason = c.finish_reason;
    if (chat) {
      choice["message"] = chat_message(c.text, request.parsing, finish_reason);
    } else {
      choice["text"] = request.echo ? request.echo_texts[i] + c.text : c.text;
    }
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = finish_reason;
    list.push_back(std::move(choice));
  }
  r["choices"] = std::move(list);
  r["usage"] = usage_json(request.prompt_tokens, completion_tokens);
  return r;
}

std::string sse_frame(const ojson& value) { return "data: " + dump_json(value) + "\n\n"; }

SseStream::SseStream(const CompletionRequest& request, const ServedModel& model, std::string id, int64_t created)
    : kind_(request.kind),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      continuous_usage_(request.continuous_usage),
      model_(model),
      id_(std::move(id)),
      created_(created),
      prompt_tokens_(request.prompt_tokens),
      completion_tokens_(request.choices.size(), 0),
      text_offset_(request.choices.size(), 0),
      parsing_(request.parsing),
      calls_sent_(request.choices.size(), 0) {
  if (parsing_.enabled)
    for (size_t i = 0; i < request.choices.size(); ++i) splitters_.push_back(splitter_for(parsing_));
  if (request.echo)
    for (size_t i = 0; i < request.choices.size(); ++i)
      unechoed_.push_back(EchoedPrompt{request.echo_texts[i], request.choices[i].prompt});
}

// The delta of a parsed chunk: content, reasoning_content, and each completed call whole (index, id, type, name
// and its complete arguments in one delta: a call's arguments are only known to be well-formed once it closes).
ojson SseStream::chat_delta(size_t choice, const OutputDelta& delta) {
  ojson out = ojson::object();
  if (!delta.content.empty()) out["content"] = delta.content;
  if (!delta.reasoning.empty() && parsing_.reasoning) out["reasoning_content"] = delta.reasoning;
  if (!delta.calls.empty()) {
    ojson calls = ojson::array();
    for (const ParsedToolCall& call : delta.calls) {
      ojson c = tool_call_json(call);
      c["index"] = calls_sent_[choice]++;
      calls.push_back(std::move(c));
    }
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

ojson SseStream::chunk(size_t choice, ojson delta_or_text, const ojson& logprobs,
                       const std::string& finish_reason) const {
  const bool chat = kind_ == ApiKind::Chat;
  ojson c;
  c["id"] = id_;
  c["object"] = chat ? "chat.completion.chunk" : "text_completion";
  c["created"] = created_;
  c["model"] = model_.name;
  ojson ch;
  ch["index"] = choice;
  ch[chat ? "delta" : "text"] = std::move(delta_or_text);
  ch["logprobs"] = logprobs;
  ch["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  c["choices"] = ojson::array({std::move(ch)});
  if (continuous_usage_) c["usage"] = usage_json(prompt_tokens_, completion_tokens_[choice]);
  else if (include_usage_) c["usage"] = nullptr;
  return c;
}

std::string SseStream::start() {
  if (kind_ != ApiKind::Chat) return "";
  std::string out;
  for (size_t i = 0; i < completion_tokens_.size(); ++i) {
    ojson delta;
    delta["role"] = "assistant";
    delta["content"] = "";
    out += sse_frame(chunk(i, std::move(delta), nullptr, ""));
  }
  return out;
}

std::string SseStream::event(size_t choice, const EngineEvent& event) {
  const bool chat = kind_ == ApiKind::Chat;
  std::string out;
  completion_tokens_[choice] += static_cast<int64_t>(event.tokens.size());
  if (event.finished && event.completion_tokens > 0) completion_tokens_[choice] = event.completion_tokens;
  // Echo (as vLLM streams it): a choice's first chunk carries its prompt before its first text, and with logprobs
  // the prompt's tokens before the first generated ones.
  std::optional<EchoedPrompt> echo;
  if (choice < unechoed_.size() && unechoed_[choice]) echo = std::exchange(unechoed_[choice], std::nullopt);
  const bool with_logprobs = logprobs_.enabled && (!event.tokens.empty() || echo);
  ojson payload;
  bool has_text = !event.text.empty();
  if (echo) {
    payload = echo->text + event.text;
    has_text = true;
  } else if (!chat) {
    payload = event.text;
  } else if (parsing_.enabled) {
    OutputDelta delta = splitters_[choice].push(event.text);
    if (event.finished) delta.append(splitters_[choice].finish());
    payload = chat_delta(choice, delta);
    has_text = !payload.empty();
  } else {
    payload["content"] = event.text;
  }
  if (has_text || with_logprobs) {
    ojson logprobs = nullptr;
    if (with_logprobs && echo)
      logprobs = echo_completion_logprobs(echo->prompt, event.prompt_logprobs, event.tokens, logprobs_,
                                          *model_.tokenizer, text_offset_[choice]);
    else if (with_logprobs)
      logprobs = chat ? chat_logprobs(event.tokens, logprobs_, *model_.tokenizer)
                      : completion_logprobs(event.tokens, logprobs_, *model_.tokenizer, text_offset_[choice]);
    out += sse_frame(chunk(choice, std::move(payload), logprobs, ""));
  }
  if (event.finished) {
    if (event.finish_reason == "error") {
      out += sse_frame(error_body(event.error.empty() ? "generation failed" : event.error, "server_error"));
    } else {
      std::string reason = event.finish_reason;
      if (calls_sent_[choice] > 0 && reason != "abort") reason = "tool_calls";
      out += sse_frame(chunk(choice, chat ? ojson::object() : ojson(""), nullptr, reason));
    }
  }
  return out;
}

int64_t SseStream::completion_tokens() const {
  int64_t total = 0;
  for (int64_t n : completion_tokens_) total += n;
  return total;
}

std::string SseStream::finish() {
  std::string out;
  if (include_usage_) {
    ojson c;
    c["id"] = id_;
    c["object"] = kind_ == ApiKind::Chat ? "chat.completion.chunk" : "text_completion";
    c["created"] = created_;
    c["model"] = model_.name;
    c["choices"] = ojson::array();
    c["usage"] = usage_json(prompt_tokens_, completion_tokens());
    out += sse_frame(c);
  }
  out += kSseDone;
  return out;
}

std::string new_request_id(ApiKind kind) {
  return random_id(kind == ApiKind::Chat ? "chatcmpl-" : "cmpl-");
}

}  // namespace qs
