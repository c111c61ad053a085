// The multipart/form-data parser of POST /v1/audio/transcriptions (server/multipart_form.h): a form as httpx (the
// openai client) writes it reads back whole, and each way a body breaks the syntax is refused with a message saying
// where. The end-to-end check against the client itself is ctest audio_transcriptions.
#include <gtest/gtest.h>

#include <string>

#include "server/multipart_form.h"
#include "util/error.h"

namespace qs {
namespace {

const std::string kType = "multipart/form-data; boundary=xyz";

std::string refusal(std::string_view content_type, std::string_view body) {
  try {
    parse_multipart_form(content_type, body);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(MultipartForm, ReadsFieldsAndFilesAsHttpxWritesThem) {
  const std::string body =
      "--xyz\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
      "--xyz\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a \\\"b\\\".wav\"\r\n"
      "Content-Type: audio/wav\r\n\r\nRIFF\r\n--xy\r\n\r\n--xyz--\r\nepilogue";
  const auto parts = parse_multipart_form("Multipart/Form-Data; boundary=\"xyz\"", body);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].name, "model");
  EXPECT_EQ(parts[0].data, "m");
  EXPECT_FALSE(parts[0].has_filename);
  EXPECT_EQ(parts[1].name, "file");
  EXPECT_EQ(parts[1].filename, "a \"b\".wav");
  EXPECT_EQ(parts[1].content_type, "audio/wav");
  EXPECT_EQ(parts[1].data, "RIFF\r\n--xy\r\n");  // a near-delimiter inside the data is data
}

TEST(MultipartForm, RefusesWhatBreaksTheSyntax) {
  EXPECT_NE(refusal("application/json", "{}").find("expected a multipart/form-data body"), std::string::npos);
  EXPECT_NE(refusal("multipart/form-data", "").find("boundary parameter"), std::string::npos);
  EXPECT_NE(refusal("multipart/form-data; boundary=" + std::string(71, 'b'), "").find("1 to 70"), std::string::npos);
  EXPECT_NE(refusal(kType, "preamble\r\n--xyz--").find("does not start with its boundary"), std::string::npos);
  EXPECT_NE(refusal(kType, "--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nno end")
                .find("part 0 (\"a\") does not end"), std::string::npos);
  EXPECT_NE(refusal(kType, "--xyz\r\nContent-Type: text/plain\r\n\r\nx\r\n--xyz--").find("no Content-Disposition"),
            std::string::npos);
  EXPECT_NE(refusal(kType, "--xyz\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nx\r\n--xyz--")
                .find("must be form-data"), std::string::npos);
  EXPECT_NE(refusal(kType, "--xyz\r\nContent-Disposition: form-data; filename=\"a\"\r\n\r\nx\r\n--xyz--")
                .find("has no name"), std::string::npos);
  EXPECT_NE(refusal(kType, "--xyz\r\nContent-Disposition: form-data; name=\"a\r\n\r\nx\r\n--xyz--")
                .find("no closing quote"), std::string::npos);
  EXPECT_NE(refusal(kType, "--xyzjunk").find("expected CRLF"), std::string::npos);
  std::string many = "--xyz";
  for (size_t i = 0; i <= kMaxFormParts; ++i) many += "\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\n\r\n--xyz";
  EXPECT_NE(refusal(kType, many + "--").find("more than"), std::string::npos);
}

}  // namespace
}  // namespace qs
