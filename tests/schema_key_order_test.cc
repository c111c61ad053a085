// The response_format schema keeps the key order the client wrote (src/server/schema_key_order.h): request bodies
// parse into nlohmann::json, which sorts keys, and constrained JSON writes properties in the declared order.
#include "server/schema_key_order.h"

#include <gtest/gtest.h>

#include <string>

namespace qs {
namespace {

constexpr const char* kSchema =
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},)"
    R"("where":{"$ref":"#/$defs/Place"}},"required":["name","age"],"$defs":{"Place":{"type":"object",)"
    R"("properties":{"lon":{"type":"number"},"lat":{"type":"number"}}}}})";

std::string body_with(const std::string& schema) {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"z":1,"a":2}],)"
         R"("response_format":{"type":"json_schema","json_schema":{"name":"s","schema":)" + schema + "}}}";
}

CompletionRequest request_of(const std::string& body, size_t choices) {
  CompletionRequest r;
  r.choices.resize(choices);
  const nlohmann::json parsed = nlohmann::json::parse(body);  // as the server parses it: keys sorted
  for (EngineRequest& c : r.choices) {
    c.constraint.kind = ConstraintSpec::Kind::JsonSchema;
    c.constraint.schema = parsed["response_format"]["json_schema"]["schema"];
  }
  return r;
}

TEST(ServerSchemaKeyOrder, EveryChoiceGetsTheSchemaAsWritten) {
  const std::string body = body_with(kSchema);
  CompletionRequest r = request_of(body, 2);
  ASSERT_NE(r.choices[0].constraint.schema.dump(), kSchema);  // sorted: the order is lost without it
  keep_schema_key_order(r, body);
  for (const EngineRequest& c : r.choices) EXPECT_EQ(c.constraint.schema.dump(), kSchema);
}

// The Responses API declares its schema at text.format.schema; a response_format elsewhere in the body is not read.
TEST(ServerSchemaKeyOrder, ResponsesTextFormatSchemaAsWritten) {
  const std::string body = R"({"model":"m","input":"hi","response_format":{"json_schema":{"schema":{"b":1,"a":2}}},)"
                           R"("text":{"format":{"type":"json_schema","name":"s","schema":)" + std::string(kSchema) +
                           "}}}";
  CompletionRequest r = request_of(body_with(kSchema), 1);
  keep_schema_key_order(r, body, SchemaField::ResponsesTextFormat);
  EXPECT_EQ(r.choices[0].constraint.schema.dump(), kSchema);
}

TEST(ServerSchemaKeyOrder, OtherConstraintsAreLeftAlone) {
  const std::string body = body_with(kSchema);
  CompletionRequest r = request_of(body, 1);
  r.choices[0].constraint = {};
  keep_schema_key_order(r, body);
  EXPECT_FALSE(r.choices[0].constraint.active());
}

TEST(ServerSchemaKeyOrder, TooManyKeysIsA400NamingResponseFormat) {
  std::string props;
  for (size_t i = 0; i <= kMaxOrderedSchemaKeys; ++i) props += (i ? ",\"p" : "\"p") + std::to_string(i) + "\":true";
  const std::string body = body_with(R"({"type":"object","properties":{)" + props + "}}");
  CompletionRequest r = request_of(body, 1);
  try {
    keep_schema_key_order(r, body);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "response_format");
  }
}

}  // namespace
}  // namespace qs
