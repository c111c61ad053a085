// Media bytes from requests: base64 against RFC 4648's own test vectors, data URLs, and the errors that name the part.
#include "media/media_input.h"

#include <gtest/gtest.h>

#include <string>

#include "util/error.h"
#include "test_util.h"

namespace {

using namespace qs;
using namespace qs::media;

constexpr int64_t kNoLimit = 1 << 30;

TEST(MediaInput, Base64MatchesRfc4648Vectors) {
  // RFC 4648 section 10, with and without the padding.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"Zg==", "f"},     {"Zm8=", "fo"},
                                                         {"Zm9v", "foo"},  {"Zm9vYg==", "foob"}, {"Zm9vYmE=", "fooba"},
                                                         {"Zm9vYmFy", "foobar"}};
  for (auto [encoded, decoded] : vectors) {
    EXPECT_EQ(decode_base64(encoded, kNoLimit, "x"), decoded) << encoded;
    std::string unpadded(encoded);
    while (!unpadded.empty() && unpadded.back() == '=') unpadded.pop_back();
    EXPECT_EQ(decode_base64(unpadded, kNoLimit, "x"), decoded) << unpadded;
  }
  EXPECT_EQ(decode_base64("/+8=", kNoLimit, "x"), "\xff\xef");
}

using qs::test::error_of;

TEST(MediaInput, Base64ErrorsNameThePartAndTheByte) {
  EXPECT_EQ(error_of([] { decode_base64("Zm9v!mFy", kNoLimit, "messages[0].content[1]"); }),
            "messages[0].content[1]: byte 4 of the base64 data (0x21) is not in the base64 alphabet");
  EXPECT_NE(error_of([] { decode_base64("Zm9vY", kNoLimit, "p"); }).find("no byte count"), std::string::npos);
  EXPECT_NE(error_of([] { decode_base64("Zm9v YmFy", kNoLimit, "p"); }).find("byte 4"), std::string::npos);
  EXPECT_NE(error_of([] { decode_base64("Zm=9v", kNoLimit, "p"); }).find("byte 2"), std::string::npos);
  // The size is checked before anything is decoded.
  EXPECT_EQ(error_of([] { decode_base64("Zm9vYmFy", 5, "p"); }), "p: the media is 6 bytes; this server accepts at most 5");
}

TEST(MediaInput, DataUrlsGiveFormatAndBytes) {
  MediaInput png = parse_data_url("data:image/png;base64,Zm9v", MediaKind::Image, kNoLimit, "m[0].c[1]");
  EXPECT_EQ(png.kind, MediaKind::Image);
  EXPECT_EQ(png.declared_format, "png");
  EXPECT_EQ(png.bytes, "foo");
  EXPECT_EQ(png.where, "m[0].c[1]");
  EXPECT_EQ(parse_data_url("DATA:Image/JPEG;name=a.jpg;base64,Zg==", MediaKind::Image, kNoLimit, "p").declared_format,
            "jpeg");
  EXPECT_EQ(parse_data_url("data:audio/x-wav;base64,Zg==", MediaKind::Audio, kNoLimit, "p").declared_format, "wav");
}

TEST(MediaInput, DataUrlErrorsSayWhatWasExpected) {
  auto error = [](std::string url, MediaKind kind = MediaKind::Image) {
    return error_of([&] { parse_data_url(url, kind, kNoLimit, "part"); });
  };
  EXPECT_EQ(error("https://example.com/a.png"), "part: expected a data URL (data:image/<format>;base64,...)");
  EXPECT_EQ(error("data:image/png;base64"), "part: the data URL has no ',' before its data");
  EXPECT_EQ(error("data:image/png,abc"), "part: the data URL must be base64-encoded (';base64,')");
  EXPECT_EQ(error("data:audio/wav;base64,Zg=="), "part: the data URL's type is 'audio/wav'; expected image/<format>");
  EXPECT_EQ(error("data:image/png;base64,Zg==", MediaKind::Audio),
            "part: the data URL's type is 'image/png'; expected audio/<format>");
  EXPECT_EQ(error("data:image/;base64,Zg=="), "part: the data URL's type is 'image/'; expected image/<format>");
}

}  // namespace
