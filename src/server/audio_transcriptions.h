#pragma once
// POST /v1/audio/transcriptions, OpenAI's speech-to-text API as vLLM serves it for audio-capable models: a
// multipart/form-data upload (multipart_form.h) of `file` (WAV, FLAC, Ogg, MP3: whatever media/audio_decode.h reads)
// and the fields `model`, `language` (ISO 639-1), `prompt`, `response_format` (json | text), `temperature`
// (default 0, as OpenAI's) and `stream`. The request runs as the chat request a user would send: one user turn of the
// clip followed by the transcription instruction of Gemma 4's model card (transcription_instruction), so its
// tokens are those of the same /v1/chat/completions request. verbose_json, srt and vtt (segment timestamps, which
// Gemma 4 does not produce) and every field not listed are a 400 naming the field.
#include <cstdint>
#include <string>
#include <string_view>

#include "server/openai_protocol.h"

namespace qs {

enum class TranscriptionFormat { Json, Text };

struct TranscriptionRequest {
  CompletionRequest chat;  // what runs: one choice, chat parsing off
  TranscriptionFormat format = TranscriptionFormat::Json;
};

// The upload of a request whose Content-Type header is `content_type`. Throws ApiError 400 naming the field: a body
// that is not multipart/form-data, no `file`, a file that is empty or larger than the model's media limit, an
// unknown field or value, a model without an audio tower, audio that does not decode (when the served model prepares
// media).
TranscriptionRequest parse_transcription_request(std::string_view content_type, std::string_view body,
                                                 const ServedModel& model);

// The text of the user turn after the clip: the ASR prompt of Gemma 4's model card, in `language` (a full name such
// as "English"; empty: the speech's own), with `prompt` (OpenAI's text the transcript continues) when not empty.
std::string transcription_instruction(std::string_view language, std::string_view prompt);

// The answer of a finished transcription: {"text", "usage": {"type": "tokens", ...}} (json) or the text itself
// (text), with its content type.
struct TranscriptionAnswer {
  std::string content_type, body;
};
TranscriptionAnswer transcription_answer(TranscriptionFormat format, const std::string& text, int64_t prompt_tokens,
                                         int64_t completion_tokens);

// Streaming (stream=true), OpenAI's events: `transcript.text.delta` per piece of text, then `transcript.text.done`
// with the whole text and the usage, then `data: [DONE]` as vLLM ends its streams.
std::string transcription_delta_event(const std::string& delta);
std::string transcription_done_event(const std::string& text, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace qs
