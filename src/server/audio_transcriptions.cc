#include "server/audio_transcriptions.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <span>
#include <utility>
#include <vector>

#include "media/media_input.h"
#include "server/multipart_form.h"
#include "server/openai_request.h"
#include "server/request_fields.h"
#include "text/tokenizer.h"

namespace qs {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace request_fields;

namespace {

// ISO 639-1 codes OpenAI's `language` takes, with the English names the instruction writes.
constexpr std::array<std::pair<std::string_view, std::string_view>, 40> kLanguages = {{
    {"ar", "Arabic"},     {"bg", "Bulgarian"}, {"bn", "Bengali"},    {"ca", "Catalan"},    {"cs", "Czech"},
    {"da", "Danish"},     {"de", "German"},    {"el", "Greek"},      {"en", "English"},    {"es", "Spanish"},
    {"et", "Estonian"},   {"fa", "Persian"},   {"fi", "Finnish"},    {"fr", "French"},     {"he", "Hebrew"},
    {"hi", "Hindi"},      {"hr", "Croatian"},  {"hu", "Hungarian"},  {"id", "Indonesian"}, {"it", "Italian"},
    {"ja", "Japanese"},   {"ko", "Korean"},    {"lt", "Lithuanian"}, {"lv", "Latvian"},    {"ms", "Malay"},
    {"nl", "Dutch"},      {"no", "Norwegian"}, {"pl", "Polish"},     {"pt", "Portuguese"}, {"ro", "Romanian"},
    {"ru", "Russian"},    {"sk", "Slovak"},    {"sl", "Slovenian"},  {"sr", "Serbian"},    {"sv", "Swedish"},
    {"sw", "Swahili"},    {"th", "Thai"},      {"tr", "Turkish"},    {"uk", "Ukrainian"},  {"vi", "Vietnamese"},
}};

constexpr std::array<std::string_view, 5> kAudioExtensions = {"wav", "flac", "ogg", "opus", "mp3"};

std::string language_name(std::string_view code) {
  const std::string lower = media::ascii_lower(code);
  for (const auto& [iso, name] : kLanguages)
    if (iso == lower) return std::string(name);
  std::string codes;
  for (const auto& [iso, name] : kLanguages) codes += (codes.empty() ? "" : ", ") + std::string(iso);
  bad("language", fmt::format("language \"{}\" is not a supported ISO 639-1 code; expected one of {}",
                              code.substr(0, 40), codes));
}

TranscriptionFormat response_format(std::string_view value) {
  if (value == "json") return TranscriptionFormat::Json;
  if (value == "text") return TranscriptionFormat::Text;
  if (value == "verbose_json" || value == "srt" || value == "vtt")
    bad("response_format", fmt::format("response_format \"{}\" needs segment timestamps, which this model does not "
                                       "produce; expected json or text", value));
  bad("response_format", fmt::format("response_format \"{}\" is not one of json, text", value.substr(0, 40)));
}

// A form field's text as the JSON value the chat request reads: numbers and booleans parsed, else a 400 naming it.
json number_field(std::string_view name, std::string_view value) {
  json v = json::parse(value, nullptr, false);
  if (v.is_discarded() || !v.is_number())
    bad(std::string(name), fmt::format("{} must be a number, got \"{}\"", name, value.substr(0, 40)));
  return v;
}

json bool_field(std::string_view name, std::string_view value) {
  const std::string lower = media::ascii_lower(value);
  if (lower != "true" && lower != "false")
    bad(std::string(name), fmt::format("{} must be true or false, got \"{}\"", name, value.substr(0, 40)));
  return lower == "true";
}

// The declared format of the upload: its file name's extension when it is an audio one ("" lets the decoder sniff).
std::string declared_audio_format(const std::string& filename) {
  const size_t dot = filename.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : media::ascii_lower(filename.substr(dot + 1));
  for (std::string_view known : kAudioExtensions)
    if (ext == known) return ext;
  return "";
}

struct TranscriptionForm {
  json body = json::object();  // the chat request's fields: model, temperature, stream
  const FormPart* file = nullptr;
  std::string language, prompt;
  TranscriptionFormat format = TranscriptionFormat::Json;
};

TranscriptionForm read_form(const std::vector<FormPart>& parts) {
  TranscriptionForm form;
  form.body["temperature"] = 0;  // OpenAI's default for transcriptions
  std::vector<std::string> seen;
  for (const FormPart& part : parts) {
    if (std::find(seen.begin(), seen.end(), part.name) != seen.end())
      bad(part.name, fmt::format("the form gives the field {} twice", part.name));
    seen.push_back(part.name);
    const std::string value(part.data);
    if (part.name == "file") form.file = &part;
    else if (part.name == "model") form.body["model"] = value;
    else if (part.name == "language") form.language = language_name(value);
    else if (part.name == "prompt") form.prompt = value;
    else if (part.name == "response_format") form.format = response_format(value);
    else if (part.name == "temperature") form.body["temperature"] = number_field(part.name, value);
    else if (part.name == "stream") form.body["stream"] = bool_field(part.name, value);
    else
      bad(part.name.substr(0, 64), fmt::format("the form field {} is not supported; expected file, model, language, "
                                               "prompt, response_format, temperature or stream",
                                               part.name.substr(0, 64)));
  }
  if (!form.file || !form.file->has_filename)
    bad("file", "file is required: the audio as a form-data file part (WAV, FLAC, Ogg or MP3)");
  return form;
}

}  // namespace

std::string transcription_instruction(std::string_view language, std::string_view prompt) {
  std::string text = language.empty()
                         ? std::string("Transcribe the following speech segment in its original language.")
                         : fmt::format("Transcribe the following speech segment in {0} into {0} text.", language);
  text += "\n\nFollow these specific instructions for formatting the answer:\n"
          "* Only output the transcription, with no newlines.\n"
          "* When transcribing numbers, write the digits, i.e. write 1.7 and not one point seven, and write 3 instead "
          "of three.";
  if (!prompt.empty()) text += fmt::format("\n* The speech continues this text: {}", prompt);
  return text;
}

TranscriptionRequest parse_transcription_request(std::string_view content_type, std::string_view body,
                                                 const ServedModel& model) {
  std::vector<FormPart> parts;
  try {
    parts = parse_multipart_form(content_type, body);
  } catch (const Error& e) {
    bad("file", fmt::format("the request body is not a valid multipart/form-data upload: {}", e.what()));
  }
  TranscriptionForm form = read_form(parts);
  const ModelChoice chosen = resolve_model(form.body, model);
  if (!model.media.audio)
    bad("file", "this model does not read audio input (no audio tower is loaded), so it cannot transcribe");
  if (form.file->data.empty()) bad("file", "file is empty; expected an audio file");
  if (static_cast<int64_t>(form.file->data.size()) > model.media.max_bytes)
    bad("file", fmt::format("file is {} bytes, more than the limit of {} bytes", form.file->data.size(),
                            model.media.max_bytes));

  media::MediaInput clip;
  clip.kind = media::MediaKind::Audio;
  clip.bytes = std::string(form.file->data);
  clip.declared_format = declared_audio_format(form.file->filename);
  clip.where = "file";
  ChatMessage turn;
  turn.role = "user";
  turn.parts = {{ChatContentPart::Kind::Audio, ""},
                {ChatContentPart::Kind::Text, transcription_instruction(form.language, form.prompt)}};
  turn.content = turn.parts[1].text;
  ChatPrompt prompt;
  prompt.tokens = chat_prompt_tokens(std::span(&turn, 1), model, /*add_generation_prompt=*/true,
                                     /*enable_thinking=*/false);
  prompt.media.push_back(std::move(clip));
  TranscriptionRequest out;
  out.chat = chat_request_from_prompt(form.body, model, std::move(prompt), "file");
  apply_model_choice(out.chat, chosen);
  out.format = form.format;
  return out;
}

namespace {

ojson token_usage(int64_t prompt_tokens, int64_t completion_tokens) {
  ojson usage;
  usage["type"] = "tokens";
  usage["input_tokens"] = prompt_tokens;
  usage["output_tokens"] = completion_tokens;
  usage["total_tokens"] = prompt_tokens + completion_tokens;
  return usage;
}

}  // namespace

TranscriptionAnswer transcription_answer(TranscriptionFormat format, const std::string& text, int64_t prompt_tokens,
                                         int64_t completion_tokens) {
  if (format == TranscriptionFormat::Text) return {"text/plain; charset=utf-8", text};
  ojson body;
  body["text"] = text;
  body["usage"] = token_usage(prompt_tokens, completion_tokens);
  return {"application/json", dump_json(body)};
}

std::string transcription_delta_event(const std::string& delta) {
  ojson event;
  event["type"] = "transcript.text.delta";
  event["delta"] = delta;
  return sse_frame(event);
}

std::string transcription_done_event(const std::string& text, int64_t prompt_tokens, int64_t completion_tokens) {
  ojson event;
  event["type"] = "transcript.text.done";
  event["text"] = text;
  event["usage"] = token_usage(prompt_tokens, completion_tokens);
  return sse_frame(event);
}

}  // namespace qs
