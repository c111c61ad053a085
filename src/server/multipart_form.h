#pragma once
// multipart/form-data bodies (RFC 7578 over RFC 2046's multipart syntax), as OpenAI's clients upload files
// (POST /v1/audio/transcriptions): a strict parser of untrusted bytes. Debian packages no C or C++ library for it
// (Boost.Beast reads the HTTP message, not its multipart body), so it is here, small: the body must start with the
// first delimiter, every part needs a Content-Disposition of form-data with a name, and a part's content ends at
// the next CRLF + delimiter. Anything else is refused with a message saying what was expected.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace qs {

struct FormPart {
  std::string name;          // Content-Disposition's name
  std::string filename;      // its filename; empty for a plain field
  bool has_filename = false;  // a file part (filename given, even empty)
  std::string content_type;  // the part's Content-Type header; empty when absent
  std::string_view data;     // the part's bytes: a view into the parsed body
};

// Bounds on what a form may hold, so a body of many tiny parts cannot cost more than its size.
constexpr size_t kMaxFormParts = 64;
constexpr size_t kMaxPartHeaderBytes = 8 * 1024;

// The boundary of a `multipart/form-data; boundary=...` Content-Type (quoted or not, case-insensitive type and
// parameter name). Throws qs::Error when the type is another, or the boundary is missing or not 1-70 characters.
std::string multipart_boundary(std::string_view content_type);

// The parts of `body` in order; views into `body`, which must outlive them. Throws qs::Error saying where the body
// breaks the syntax: no first delimiter, a part without a blank line after its headers or without a name, a part
// that never ends, no closing delimiter, more than kMaxFormParts parts.
std::vector<FormPart> parse_multipart_form(std::string_view content_type, std::string_view body);

}  // namespace qs
