// libFuzzer target: a multipart/form-data upload (server/multipart_form.h) as POST /v1/audio/transcriptions
// receives it: the input's first line is the Content-Type header, the rest the body. A refusal is a qs::Error; every
// part parsed must name a field and lie inside the body; anything else thrown, or a crash, is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/multipart_form.h"
#include "util/error.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t eol = input.find('\n');
  const std::string_view content_type = input.substr(0, eol);
  const std::string_view body = eol == std::string_view::npos ? std::string_view() : input.substr(eol + 1);
  try {
    const auto parts = qs::parse_multipart_form(content_type, body);
    check(parts.size() <= qs::kMaxFormParts);
    for (const qs::FormPart& part : parts) {
      check(!part.name.empty());
      check(part.data.data() >= body.data() && part.data.data() + part.data.size() <= body.data() + body.size());
    }
  } catch (const qs::Error&) {
  }
  return 0;
}
