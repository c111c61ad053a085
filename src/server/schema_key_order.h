#pragma once
// Request bodies are parsed into nlohmann::json, whose objects keep their keys sorted. A structured output schema's key
// order matters: constrained output writes an object's properties in the order its schema declares them (as OpenAI's
// strict mode and llama.cpp do; the openai SDK's parse() declares a pydantic model's fields in order). So the schema
// is read again from the body text with its keys in the order written.
#include <string_view>

#include "server/openai_protocol.h"

namespace qs {

// ordered_json finds a key by a linear scan, so reading an object of n keys costs n^2/2 comparisons: the keys read
// in order are bounded (OpenAI allows 5,000 properties in a strict schema; each property is a schema of a few keys).
inline constexpr size_t kMaxOrderedSchemaKeys = 20'000;

// Where a body declares its schema: Chat Completions' response_format.json_schema.schema, or the Responses API's
// text.format.schema.
enum class SchemaField { ChatResponseFormat, ResponsesTextFormat };

// Gives every choice of `request` whose constraint is a JSON schema the schema of `body` (the text `request` was
// parsed from) with its keys in their written order. A schema of more than kMaxOrderedSchemaKeys keys is an ApiError
// 400 naming response_format (the Responses endpoint names it text.format).
void keep_schema_key_order(CompletionRequest& request, std::string_view body,
                           SchemaField field = SchemaField::ChatResponseFormat);

}  // namespace qs
