#pragma once
// What a request asks its output to obey, as plain data: filled by the server (response_format, tools with
// tool_choice "required" or a named function, and under "auto" the calls the model opens) or the command line
// (--json-schema, --tools), compiled by the grammar engine (src/constrain) into a per-request matcher that masks
// every sampled token once it starts. None = unconstrained.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qs {

// One callable function as the request declared it (OpenAI `tools[i].function`).
struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::json parameters = nlohmann::json::object();  // a JSON Schema for the arguments object
};

struct ConstraintSpec {
  enum class Kind {
    None,        // free text
    JsonObject,  // response_format json_object: any JSON object
    JsonSchema,  // response_format json_schema: JSON text valid against `schema`
    ToolCalls,   // tool_choice required / named: one or more Gemma 4 tool calls
                 // (<|tool_call>call:NAME{args}<tool_call|>) whose NAME is in `tools` and whose args are valid
                 // against that tool's parameters, in Gemma's call syntax; then end of turn
  };
  Kind kind = Kind::None;
  nlohmann::ordered_json schema;  // JsonSchema, keys in the order sent (properties are generated in it)
  bool strict = false;            // JsonSchema: json_schema.strict as sent
  // ToolCalls: the callable functions (one when a function was named). JsonObject / JsonSchema: when not empty,
  // the output may be calls to these instead of the JSON (tool_choice auto beside response_format, as OpenAI
  // allows: an agent with tools and a structured final answer calls tools first).
  std::vector<ToolSpec> tools;
  bool parallel_calls = true;     // calls: more than one allowed
  // When the constraint starts masking.
  enum class Start {
    Now,
    AfterThinking,  // when the thought channel closes (`<channel|>`): thinking is on, the thoughts are free
    // ToolCalls under tool_choice auto: when the model opens a call (`<|tool_call>`, the grammar's first token).
    // Text stays free; a call once opened names a declared tool and has valid arguments (llama.cpp's lazy grammar).
    AtToolCall,
  };
  Start start = Start::Now;

  bool active() const { return kind != Kind::None; }
};

}  // namespace qs
