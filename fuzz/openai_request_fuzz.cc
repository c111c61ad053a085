// libFuzzer target: arbitrary bytes as the body of an OpenAI or Anthropic request, through the protocol parser the
// server runs on it (src/server/openai_protocol.*, src/server/anthropic_messages_request.*,
// src/server/openai_responses.*), against the demo tokenizer and its chat template. The first byte picks the endpoint
// (chat/completions, completions, tokenize, detokenize; with bit 16, Anthropic's messages or messages/count_tokens;
// with bit 32, responses, whose store holds "resp_seed" for previous_response_id), whether the model name is strict,
// and which Gemma 4 template dialect renders chat prompts. A body is either refused with an ApiError (400, or 404 for another
// model's name) whose error object serializes, or becomes a request the engine can run: 1-128 choices, each with a
// non-empty prompt of ids in the vocabulary and max_tokens >= 1 that fits the context. Any other exception is a bug
// (the server would answer 500).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/anthropic_messages_request.h"
#include "server/openai_protocol.h"
#include "server/openai_responses.h"
#include "text/tokenizer.h"
#include "util/file.h"

namespace {

constexpr int64_t kMaxContext = 512;

const qs::Tokenizer& demo_tokenizer() {
  static const qs::Tokenizer tokenizer =
      qs::Tokenizer::load(QATSERVE_SOURCE_DIR "/configs/demo-tokenizer/tokenizer.json");
  return tokenizer;
}

// later_template: the 31B revision (tool results folded into the model turn), else the demo's early template.
// The strict-name models read no media (a media part is the 400 naming it); the others read images and audio, so
// media parts reach the data-URL and base64 decoding (src/media/media_input.cc).
qs::ServedModel served_model(bool later_template, bool strict_name) {
  qs::ServedModel m;
  m.name = "demo";
  m.strict_name = strict_name;
  m.media.images = m.media.audio = !strict_name;
  m.tokenizer = &demo_tokenizer();
  m.generation.eos_token_ids = {1, 106};
  m.generation.max_new_tokens = 64;
  const char* templ =
      later_template ? QATSERVE_SOURCE_DIR "/tests/data/gemma4-tokenizer/google-gemma-4-31B-it.from-llamacpp-fork.jinja"
                     : QATSERVE_SOURCE_DIR "/configs/demo-tokenizer/chat_template.jinja";
  m.dialect = qs::gemma4_chat_dialect_from_template(qs::read_file(templ));
  m.max_context = kMaxContext;
  m.vocab_size = static_cast<int64_t>(demo_tokenizer().vocab_size());
  return m;
}

void check_runnable(const qs::CompletionRequest& r, const qs::ServedModel& model) {
  if (r.choices.empty() || r.choices.size() > 128) std::abort();
  if (r.prompt_tokens < 1 || r.prompt_tokens >= model.max_context) std::abort();
  for (const qs::EngineRequest& e : r.choices) {
    if (static_cast<int64_t>(e.prompt.size()) != r.prompt_tokens) std::abort();
    for (int32_t id : e.prompt)
      if (id < 0 || id >= model.vocab_size) std::abort();
    if (e.max_tokens < 1 || r.prompt_tokens + e.max_tokens > model.max_context) std::abort();
    e.sampling.validate();  // what the engine's Sampler checks again
  }
}

void check_ids(const std::vector<int32_t>& ids, const qs::ServedModel& model) {
  for (int32_t id : ids)
    if (id < 0 || id >= model.vocab_size) std::abort();
}

// A store with one response whose conversation ends in a function call, so that previous_response_id and
// function_call_output reach the stored-conversation path.
qs::ResponseStore& seeded_store() {
  static qs::ResponseStore store(16, 1 << 20);
  static const bool seeded = [] {
    qs::StoredResponse r;
    r.response = {{"id", "resp_seed"}, {"object", "response"}, {"status", "completed"}};
    r.conversation = nlohmann::json::parse(
        R"([{"type":"message","role":"user","content":"Weather?"},)"
        R"({"type":"function_call","call_id":"call_seed","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}])");
    store.put("resp_seed", std::move(r));
    return true;
  }();
  (void)seeded;
  return store;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const qs::ServedModel early = served_model(false, false), early_strict = served_model(false, true),
                               later = served_model(true, false), later_strict = served_model(true, true);
  const bool strict = data[0] & 4, later_template = data[0] & 8;
  const qs::ServedModel& model = later_template ? (strict ? later_strict : later) : (strict ? early_strict : early);
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    nlohmann::json body = qs::parse_json_body(text);
    if (data[0] & 16) {
      if (data[0] & 1) (void)qs::count_message_tokens(body, model);
      else check_runnable(qs::parse_messages_request(body, model), model);
      return 0;
    }
    if (data[0] & 32) {
      qs::ResponsesRequest r = qs::parse_responses_request(body, model, &seeded_store());
      if (r.chat.choices.size() != 1) std::abort();
      check_runnable(r.chat, model);
      return 0;
    }
    switch (data[0] & 3) {
      case 0: check_runnable(qs::parse_chat_request(body, model), model); break;
      case 1: check_runnable(qs::parse_completion_request(body, model), model); break;
      case 2: check_ids(qs::parse_tokenize_request(body, model), model); break;
      case 3: check_ids(qs::parse_detokenize_request(body, model), model); break;
    }
  } catch (const qs::ApiError& e) {
    if (e.status() != 400 && e.status() != 404) std::abort();
    (void)qs::dump_json(qs::error_body(e));  // the message may quote the request's bytes: never throws
    (void)qs::dump_json(qs::anthropic_error_body(e));
  }
  return 0;
}
