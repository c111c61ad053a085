#include "text/normalizer.h"

#include <fmt/format.h>

namespace qs::text {

Normalizer Normalizer::parse(const json* normalizer, const JsonFields& fields) {
  Normalizer out;
  if (normalizer) out.parse_step(*normalizer, "normalizer", fields);
  return out;
}

void Normalizer::parse_step(const json& n, const std::string& where, const JsonFields& fields) {
  if (n.is_null()) return;
  std::string type = fields.type_of(n, where);
  if (type == "Sequence") {
    const json* list = JsonFields::member(n, "normalizers");
    if (!list || !list->is_array()) fields.fail(where + ".normalizers must be an array");
    for (size_t i = 0; i < list->size(); ++i)
      parse_step((*list)[i], fmt::format("{}.normalizers[{}]", where, i), fields);
  } else if (type == "Replace") {
    steps_.push_back({false, fields.literal_pattern(n, where), fields.get_string(n, "content", where)});
  } else if (type == "Prepend") {
    steps_.push_back({true, "", fields.get_string(n, "prepend", where)});
  } else {
    fields.fail(fmt::format(
        "{}: normalizer type \"{}\" is not supported (Replace with a String pattern, Prepend, Sequence)", where, type));
  }
}

void Normalizer::normalize(std::string_view in, std::string& out) const {
  out.assign(in);
  for (const Step& step : steps_) {
    if (step.prepend) {
      if (!out.empty()) out.insert(0, step.content);
    } else if (out.find(step.pattern) != std::string::npos) {
      out = replace_all(out, step.pattern, step.content);
    }
  }
}

std::string replace_all(std::string_view s, std::string_view pattern, std::string_view with) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(pattern, pos);
    if (hit == std::string_view::npos) break;
    out.append(s, pos, hit - pos);
    out.append(with);
    pos = hit + pattern.size();
  }
  if (pos == 0) return std::string(s);
  out.append(s, pos, std::string_view::npos);
  return out;
}

}  // namespace qs::text
