// libFuzzer target: arbitrary bytes as what a client sends serve, without a socket: the transport's parser (Boost
// Beast, with serve's header and body limits) reads them as one request, the route table routes it, and the body of
// a generation or tokenizer route goes through openai_protocol's parsers (anthropic_messages_request's for
// /v1/messages, audio_transcriptions' multipart parser for /v1/audio/transcriptions, as for a model with an audio
// tower) with the demo tokenizer. A parser error is
// the transport's 400/413/431 with a JSON body; a bad body an ApiError with a 4xx status; anything else thrown, or
// a crash, is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "server/anthropic_messages_request.h"
#include "server/audio_transcriptions.h"
#include "server/http_transport.h"
#include "server/openai_protocol.h"
#include "server/routes.h"
#include "text/tokenizer.h"

namespace {

constexpr size_t kMaxBody = 64 * 1024;  // serve's is 8 MB; a smaller limit lets the fuzzer reach the 413

std::optional<qs::Tokenizer> tokenizer;
qs::ServedModel served;

void check(bool condition) {
  if (!condition) std::abort();
}

void parse_body(qs::Route route, const qs::HttpRequest& request) {
  const std::string& body = request.body;
  try {
    if (route == qs::Route::AudioTranscriptions) {
      qs::parse_transcription_request(request.content_type, body, served);
      return;
    }
    const nlohmann::json json = qs::parse_json_body(body);
    switch (route) {
      case qs::Route::ChatCompletions: qs::parse_chat_request(json, served); break;
      case qs::Route::Completions: qs::parse_completion_request(json, served); break;
      case qs::Route::Tokenize: qs::parse_tokenize_request(json, served); break;
      case qs::Route::Detokenize: qs::parse_detokenize_request(json, served); break;
      case qs::Route::Messages: qs::parse_messages_request(json, served); break;
      case qs::Route::CountMessageTokens: qs::count_message_tokens(json, served); break;
      default: break;
    }
  } catch (const qs::ApiError& e) {
    check(e.status() >= 400 && e.status() < 500);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer = qs::Tokenizer::load(QATSERVE_SOURCE_DIR "/configs/demo-tokenizer/tokenizer.json");
  served.name = "fuzz";
  served.tokenizer = &*tokenizer;
  served.generation = qs::gemma4_release_generation_config();
  served.max_context = 4096;
  served.vocab_size = static_cast<int64_t>(tokenizer->vocab_size());
  served.media.audio = true;  // transcriptions reach their prompt (no tower runs: media stay raw)
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const qs::ParsedRequest parsed = qs::parse_http_request(bytes, kMaxBody);
  if (parsed.incomplete) return 0;
  if (!parsed.request) {
    const int status = parsed.error.status;
    check(status == 400 || status == 413 || status == 431);
    check(nlohmann::json::parse(parsed.error.body, nullptr, false).contains("error"));
    return 0;
  }
  const qs::HttpRequest& request = *parsed.request;
  check(request.body.size() <= kMaxBody && request.path.find('?') == std::string::npos);
  parse_body(qs::route_of(request.method, request.path, true), request);
  return 0;
}
