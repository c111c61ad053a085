#include "server/schema_key_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace qs {
namespace {

using ojson = nlohmann::ordered_json;

// The body with only its response_format member (every other top-level member is skipped while parsing), keys in
// their written order. The body parsed before, so its syntax and nesting depth are known to be fine.
ojson response_format_in_order(std::string_view body) {
  bool inside = false;  // in the value of the top-level key response_format
  size_t keys = 0;
  ojson::parser_callback_t only_response_format = [&](int depth, ojson::parse_event_t event, ojson& parsed) {
    if (event != ojson::parse_event_t::key) return true;
    if (depth == 1) return inside = parsed == "response_format";
    if (inside && ++keys > kMaxOrderedSchemaKeys)
      throw ApiError(400, fmt::format("response_format holds more than {} keys", kMaxOrderedSchemaKeys),
                     "response_format");
    return true;
  };
  return ojson::parse(body.begin(), body.end(), only_response_format);
}

}  // namespace

void keep_schema_key_order(CompletionRequest& request, std::string_view body) {
  auto is_schema = [](const EngineRequest& c) { return c.constraint.kind == ConstraintSpec::Kind::JsonSchema; };
  if (std::none_of(request.choices.begin(), request.choices.end(), is_schema)) return;
  const ojson doc = response_format_in_order(body);
  static const ojson::json_pointer at("/response_format/json_schema/schema");
  if (!doc.contains(at)) return;  // no schema: {} has no keys to order
  const ojson& schema = doc.at(at);
  for (EngineRequest& choice : request.choices)
    if (is_schema(choice)) choice.constraint.schema = schema;
}

}  // namespace qs
