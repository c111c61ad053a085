// Images and audio in chat messages: parts become media inputs in prompt order, what the model cannot read or
// the server will not fetch is refused naming the part, per-image token budgets, and the limits on a request.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/image_budget.h"
#include "server/openai_protocol.h"
#include "server_protocol_util.h"

namespace {

using namespace qs;
using namespace qs::test;

json image_part(std::string url = "data:image/png;base64,Zm9v") {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}
json audio_part(std::string data = "UklGRg==") {
  return {{"type", "input_audio"}, {"input_audio", {{"data", data}, {"format", "wav"}}}};
}
json text_part(std::string text) { return {{"type", "text"}, {"text", text}}; }

json media_chat(json content, std::string role = "user") {
  return {{"messages", json::array({{{"role", role}, {"content", content}}})}};
}

// The message of the 400 a chat body gets (its param must be "messages"), or "<accepted>".
std::string media_error(const json& body, const ServedModel& model) {
  try {
    parse_chat_request(body, model);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "messages") << e.what();
    return e.what();
  }
  return "<accepted>";
}

ServedModel media_model(bool images, bool audio) {
  ServedModel m = test_model();
  m.media.images = images;
  m.media.audio = audio;
  return m;
}

TEST(ServerProtocol, MediaPartsBecomeMediaInputsInPromptOrder) {
  CompletionRequest r = parse_chat_request(
      media_chat(json::array({text_part("Look: "), image_part(), text_part("and "), audio_part(),
                              image_part("data:image/jpeg;base64,YmFy")})),
      media_model(true, true));
  ASSERT_EQ(r.media.size(), 3u);
  EXPECT_EQ(r.media[0].kind, media::MediaKind::Image);
  EXPECT_EQ(r.media[0].bytes, "foo");
  EXPECT_EQ(r.media[0].where, "messages[0].content[1].image_url.url");
  EXPECT_EQ(r.media[1].kind, media::MediaKind::Audio);
  EXPECT_EQ(r.media[1].bytes, "RIFF");
  EXPECT_EQ(r.media[1].declared_format, "wav");
  EXPECT_EQ(r.media[1].where, "messages[0].content[3]");
  EXPECT_EQ(r.media[2].declared_format, "jpeg");
}

TEST(ServerProtocol, MediaTheModelCannotReadIsRefusedNamingThePart) {
  const json body = media_chat(json::array({text_part("Hi"), audio_part()}));
  EXPECT_EQ(media_error(body, media_model(true, false)),
            "messages[0].content[1]: this model does not read audio input (no audio tower is loaded)");
  EXPECT_EQ(media_error(media_chat(json::array({image_part()})), test_model()),
            "messages[0].content[0]: this model does not read image input (no vision tower is loaded)");
  EXPECT_EQ(media_error(body, media_model(false, true)), "<accepted>");
}

TEST(ServerProtocol, BadMediaPartsAreRefusedNamingThePart) {
  ServedModel m = media_model(true, true);
  EXPECT_NE(media_error(media_chat(json::array({image_part("https://example.com/cat.png")})), m)
                .find("messages[0].content[0].image_url.url: this server does not fetch images from URLs (its "
                      "operator allows hosts with --allowed-media-domains)"),
            std::string::npos);
  // With hosts allowed, a URL goes to the fetch (media_fetch_test.cc), whose refusal is the part's 400.
  m.media.fetch.allowed_hosts = {"127.0.0.1"};
  EXPECT_EQ(media_error(media_chat(json::array({image_part("HTTPS://example.com/cat.png")})), m),
            "messages[0].content[0].image_url.url: HTTPS://example.com/cat.png: the host 'example.com' is not one "
            "this server fetches media from");
  m.media.fetch = {};
  EXPECT_EQ(media_error(media_chat(json::array({image_part("data:image/png;base64,Zm9v!mFy")})), m),
            "messages[0].content[0].image_url.url: byte 4 of the base64 data (0x21) is not in the base64 alphabet");
  EXPECT_EQ(media_error(media_chat(json::array({{{"type", "image_url"}}})), m),
            "messages[0].content[0].image_url.url is required (a data:image/...;base64 URL)");
  EXPECT_NE(media_error(media_chat(json::array({{{"type", "input_audio"}, {"input_audio", {{"data", "Zg=="}}}}})), m)
                .find("messages[0].content[0].input_audio needs data"),
            std::string::npos);
  EXPECT_EQ(media_error(media_chat(json::array({{{"type", "video_url"}}})), m),
            "messages[0].content[0]: the part type must be \"text\", \"image_url\" or \"input_audio\"");
  EXPECT_EQ(media_error(media_chat(json::array({image_part()}), "system"), m),
            "messages[0].content[0]: image_url parts are read in user and assistant messages only, not in a system "
            "message");
  m.media.max_bytes = 2;
  EXPECT_EQ(media_error(media_chat(json::array({image_part()})), m),
            "messages[0].content[0].image_url.url: the media is 3 bytes; this server accepts at most 2");
}

// Per-image budgets: detail low = 70, high = the server's largest, auto or absent = the request's budget, which is
// mm_processor_kwargs.max_soft_tokens (vLLM's) or the server's default; audio keeps none. Bad values: 400s naming
// the part or mm_processor_kwargs.
TEST(ServerProtocol, ImageBudgetsFromDetailAndMmProcessorKwargs) {
  ServedModel m = media_model(true, true);
  m.media.image_soft_tokens = 140;
  m.media.max_image_soft_tokens = 560;
  auto detailed = [](std::string detail) {
    json part = image_part();
    part["image_url"]["detail"] = detail;
    return part;
  };
  const json content = json::array({image_part(), detailed("low"), detailed("high"), detailed("auto"), audio_part()});
  auto budgets = [&](json body) {
    std::vector<int> out;
    for (const media::MediaInput& input : parse_chat_request(body, m).media) out.push_back(input.image_soft_tokens);
    return out;
  };
  EXPECT_EQ(budgets(media_chat(content)), (std::vector<int>{140, 70, 560, 140, 0}));
  json body = media_chat(content);
  body["mm_processor_kwargs"] = {{"max_soft_tokens", 280}};
  EXPECT_EQ(budgets(body), (std::vector<int>{280, 70, 560, 280, 0}));

  EXPECT_EQ(media_error(media_chat(json::array({detailed("medium")})), m),
            "messages[0].content[0].image_url.detail is \"medium\"; expected \"low\" (70 soft tokens), \"high\" (560) "
            "or \"auto\"");
  for (const auto& [kwargs, message] : std::vector<std::pair<json, std::string>>{
           {{{"max_soft_tokens", 100}}, "mm_processor_kwargs.max_soft_tokens is 100; expected one of 70, 140, 280, 560, 1120"},
           {{{"max_soft_tokens", "70"}}, "mm_processor_kwargs.max_soft_tokens is \"70\"; expected one of 70, 140, 280, 560, 1120"},
           {{{"max_soft_tokens", 1120}}, "mm_processor_kwargs.max_soft_tokens is 1120; this server allows at most 560 per image (serve --max-image-soft-tokens)"},
           {{{"do_pan_and_scan", true}}, "mm_processor_kwargs.do_pan_and_scan is not supported; Gemma 4's processor takes max_soft_tokens"},
           {json::array({1}), "mm_processor_kwargs must be an object, got [1]"}}) {
    json bad = media_chat(content);
    bad["mm_processor_kwargs"] = kwargs;
    try {
      parse_chat_request(bad, m);
      ADD_FAILURE() << kwargs.dump() << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "mm_processor_kwargs");
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

// serve's flags over the processor's budget.
TEST(ServerProtocol, ServeImageBudgets) {
  EXPECT_EQ(resolve_image_budgets(0, 0, 280).fallback, 280);
  EXPECT_EQ(resolve_image_budgets(0, 0, 280).max, 280);
  EXPECT_EQ(resolve_image_budgets(70, 0, 280).max, 70);
  EXPECT_EQ(resolve_image_budgets(0, 1120, 280).max, 1120);
  EXPECT_THROW(resolve_image_budgets(560, 280, 280), Error);  // the largest below the default
  EXPECT_THROW(resolve_image_budgets(100, 0, 280), Error);
}

TEST(ServerProtocol, TooManyMediaItemsAreRefusedAtTheFirstOneOver) {
  ServedModel m = media_model(true, true);
  json parts = json::array();
  for (int i = 0; i < 100; ++i) parts.push_back(image_part());
  EXPECT_EQ(media_error(media_chat(parts), m),
            fmt::format("messages[0].content[{}]: a request may carry at most {} images and audio clips",
                        m.media.max_items, m.media.max_items));
}

TEST(ServerProtocol, TokenizeRefusesMediaItCannotCount) {
  ServedModel m = media_model(true, true);
  try {
    parse_tokenize_request(media_chat(json::array({image_part()})), m);
    FAIL() << "tokenized an image";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("messages[0].content[0].image_url.url: /tokenize counts text only"),
              std::string::npos);
  }
}

}  // namespace
