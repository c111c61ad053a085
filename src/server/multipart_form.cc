#include "server/multipart_form.h"

#include <fmt/format.h>

#include "media/media_input.h"
#include "util/error.h"

namespace qs {
namespace {

constexpr std::string_view kCrlf = "\r\n";
constexpr size_t kMaxBoundary = 70;  // RFC 2046 section 5.1.1

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// One `key=value` parameter of a header value (after the first ';'): a token or a quoted string, whose backslash
// escapes are undone. Returns the rest of `s` after the parameter and its ';'.
struct HeaderParam {
  std::string key, value;
};

std::string_view next_param(std::string_view s, HeaderParam& out, std::string_view header) {
  s = trim(s);
  const size_t eq = s.find('=');
  if (eq == std::string_view::npos)
    throw Error(fmt::format("{}: expected key=value parameters after ';', got \"{}\"", header, s.substr(0, 80)));
  out.key = media::ascii_lower(trim(s.substr(0, eq)));
  s = trim(s.substr(eq + 1));
  out.value.clear();
  if (s.starts_with('"')) {
    size_t i = 1;
    for (; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      out.value += s[i];
    }
    if (i >= s.size()) throw Error(fmt::format("{}: the quoted value of {} has no closing quote", header, out.key));
    s.remove_prefix(i + 1);
    s = trim(s);
    if (!s.empty() && s.front() != ';')
      throw Error(fmt::format("{}: expected ';' after the quoted value of {}", header, out.key));
  } else {
    const size_t end = s.find(';');
    out.value = std::string(trim(s.substr(0, end)));
    s = end == std::string_view::npos ? std::string_view() : s.substr(end);
  }
  return s.empty() ? s : s.substr(1);
}

// Reads the headers of one part (up to the blank line) into `part`.
void read_part_headers(std::string_view headers, FormPart& part, size_t index) {
  bool disposition = false;
  while (!headers.empty()) {
    const size_t eol = headers.find(kCrlf);
    const std::string_view line = headers.substr(0, eol);
    headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + kCrlf.size());
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos)
      throw Error(fmt::format("part {}: a header line without ':' (\"{}\")", index, line.substr(0, 80)));
    const std::string name = media::ascii_lower(trim(line.substr(0, colon)));
    const std::string_view value = trim(line.substr(colon + 1));
    if (name == "content-type") {
      part.content_type = std::string(value);
    } else if (name == "content-disposition") {
      disposition = true;
      const size_t semi = value.find(';');
      if (media::ascii_lower(trim(value.substr(0, semi))) != "form-data")
        throw Error(fmt::format("part {}: Content-Disposition must be form-data, got \"{}\"", index,
                                value.substr(0, 80)));
      std::string_view rest = semi == std::string_view::npos ? std::string_view() : value.substr(semi + 1);
      const std::string header = fmt::format("part {}: Content-Disposition", index);
      while (!trim(rest).empty()) {
        HeaderParam p;
        rest = next_param(rest, p, header);
        if (p.key == "name") part.name = std::move(p.value);
        else if (p.key == "filename") part.filename = std::move(p.value), part.has_filename = true;
      }
    }  // other headers (Content-Transfer-Encoding is deprecated by RFC 7578) are ignored
  }
  if (!disposition) throw Error(fmt::format("part {}: no Content-Disposition header (form-data; name=...)", index));
  if (part.name.empty()) throw Error(fmt::format("part {}: Content-Disposition has no name", index));
}

}  // namespace

std::string multipart_boundary(std::string_view content_type) {
  const size_t semi = content_type.find(';');
  if (media::ascii_lower(trim(content_type.substr(0, semi))) != "multipart/form-data")
    throw Error(fmt::format("expected a multipart/form-data body, got Content-Type \"{}\"",
                            content_type.substr(0, 80)));
  std::string_view rest = semi == std::string_view::npos ? std::string_view() : content_type.substr(semi + 1);
  std::string boundary;
  while (!trim(rest).empty()) {
    HeaderParam p;
    rest = next_param(rest, p, "Content-Type");
    if (p.key == "boundary") boundary = std::move(p.value);
  }
  if (boundary.empty() || boundary.size() > kMaxBoundary)
    throw Error("Content-Type multipart/form-data needs a boundary parameter of 1 to 70 characters");
  return boundary;
}

std::vector<FormPart> parse_multipart_form(std::string_view content_type, std::string_view body) {
  const std::string delimiter = "--" + multipart_boundary(content_type);
  const std::string next_delimiter = std::string(kCrlf) + delimiter;
  if (!body.starts_with(delimiter))
    throw Error("the multipart body does not start with its boundary delimiter (--boundary)");
  size_t pos = delimiter.size();
  std::vector<FormPart> parts;
  for (;;) {
    if (body.substr(pos).starts_with("--")) return parts;  // the closing delimiter; the epilogue is ignored
    if (!body.substr(pos).starts_with(kCrlf))
      throw Error(fmt::format("expected CRLF or \"--\" after the boundary delimiter at byte {}", pos));
    if (parts.size() == kMaxFormParts) throw Error(fmt::format("the form has more than {} parts", kMaxFormParts));
    pos += kCrlf.size();
    const size_t index = parts.size();
    const size_t blank = body.find("\r\n\r\n", pos);
    const bool no_headers = body.substr(pos).starts_with(kCrlf);
    const size_t headers_end = no_headers ? pos : blank;
    if (headers_end == std::string_view::npos || headers_end - pos > kMaxPartHeaderBytes)
      throw Error(fmt::format("part {}: its headers do not end with a blank line within {} bytes", index,
                              kMaxPartHeaderBytes));
    FormPart part;
    read_part_headers(body.substr(pos, headers_end - pos), part, index);
    const size_t data_start = headers_end + (no_headers ? kCrlf.size() : 2 * kCrlf.size());
    const size_t data_end = body.find(next_delimiter, data_start);
    if (data_end == std::string_view::npos)
      throw Error(fmt::format("part {} (\"{}\") does not end: no closing boundary delimiter", index, part.name));
    part.data = body.substr(data_start, data_end - data_start);
    parts.push_back(std::move(part));
    pos = data_end + next_delimiter.size();
  }
}

}  // namespace qs
