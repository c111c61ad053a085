// libFuzzer target: arbitrary bytes as a request's JSON Schema (response_format json_schema, a tool's parameters).
// Whatever the schema, compiling it either gives a grammar or throws qs::Error (SchemaError naming the keyword);
// any other exception, a crash, a sanitizer report or a hang is a bug. The first byte picks the syntax, so both
// JSON and Gemma's call syntax are compiled; the regex subset is reached through `pattern` and `format`.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "constrain/json_schema.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const qs::JsonSyntax syntax = data[0] & 1 ? qs::JsonSyntax::GemmaCall : qs::JsonSyntax::Json;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const nlohmann::json schema = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  try {
    qs::json_schema_grammar(schema, syntax);
  } catch (const qs::Error&) {
    // refused with a message: the expected outcome for a schema qatserve does not support
  }
  return 0;
}
