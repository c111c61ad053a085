#include "server/schema_key_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace qs {
namespace {

using ojson = nlohmann::ordered_json;

// The body with only its `member` (every other top-level member is skipped while parsing), keys in their written
// order. The body parsed before, so its syntax and nesting depth are known to be fine.
ojson member_in_order(std::string_view body, std::string_view member) {
  bool inside = false;  // in the value of the top-level key `member`
  size_t keys = 0;
  ojson::parser_callback_t only_member = [&](int depth, ojson::parse_event_t event, ojson& parsed) {
    if (event != ojson::parse_event_t::key) return true;
    if (depth == 1) return inside = parsed == member;
    if (inside && ++keys > kMaxOrderedSchemaKeys)
      throw ApiError(400, fmt::format("response_format holds more than {} keys", kMaxOrderedSchemaKeys),
                     "response_format");
    return true;
  };
  return ojson::parse(body.begin(), body.end(), only_member);
}

}  // namespace

void keep_schema_key_order(CompletionRequest& request, std::string_view body, SchemaField field) {
  auto is_schema = [](const EngineRequest& c) { return c.constraint.kind == ConstraintSpec::Kind::JsonSchema; };
  if (std::none_of(request.choices.begin(), request.choices.end(), is_schema)) return;
  const bool chat = field == SchemaField::ChatResponseFormat;
  const ojson doc = member_in_order(body, chat ? "response_format" : "text");
  static const ojson::json_pointer chat_at("/response_format/json_schema/schema"), responses_at("/text/format/schema");
  const ojson::json_pointer& at = chat ? chat_at : responses_at;
  if (!doc.contains(at)) return;  // no schema: {} has no keys to order
  const ojson& schema = doc.at(at);
  for (EngineRequest& choice : request.choices)
    if (is_schema(choice)) choice.constraint.schema = schema;
}

}  // namespace qs
