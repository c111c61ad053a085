#pragma once
// JSON Schema -> grammar, in two syntaxes:
//   Json       standard JSON text. Whitespace is bounded so that a random model cannot loop on it: at most one
//              space after ',' and ':', none elsewhere, never a newline.
//   GemmaCall  Gemma 4's tool-call argument syntax, as its chat template writes arguments (format_argument with
//              escape_keys=False): objects {key:value,...} with bare keys in sorted order (the template dictsorts),
//              strings between the special token <|"|> on both sides with nothing escaped, numbers, true, false and
//              null bare, arrays [a,b].
//
// Coverage: type (one or a list, null included), properties, required, additionalProperties (false, true or a
// schema), enum, const (alone or with type), items, prefixItems (and the older array form of items with
// additionalItems), minItems/maxItems, minLength/maxLength, minimum/maximum/exclusiveMinimum/exclusiveMaximum
// (integer and number), anyOf, oneOf (as anyOf, like xgrammar and vLLM: alternatives should not overlap), allOf
// of one schema, $ref to "#", "#/$defs/..", "#/definitions/.." or any pointer into the document (recursion
// allowed), pattern (the regex subset of constrain/regex.h), format date, date-time, uuid, email. Annotations
// (title, description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, discriminator,
// $defs, definitions) are ignored. Any other keyword is a SchemaError naming it and its JSON pointer.
//
// Choices where a schema allows more than is generated (the output is always valid, never the reverse):
// - properties are written in the order the schema declares them (Json: OpenAI's strict mode and llama.cpp do the
//   same; required names that no property declares follow, as listed) or sorted (GemmaCall: Gemma's chat template
//   dictsorts both the tool declarations and the calls' arguments, so sorted is what the model saw); optional ones
//   may be left out, the rest keep that order. Declared order needs an ordered_json schema: a nlohmann::json one
//   has already sorted its keys;
// - no extra properties unless additionalProperties is true or a schema, or the object declares no properties;
//   extra keys are then any string, or when names are declared [A-Za-z0-9_]+ differing from them (GemmaCall keys
//   are always bare: [A-Za-z_][A-Za-z0-9_]*);
// - every number literal is bounded, so that a weak model cannot write digits forever: integers fit 64 bits (at
//   most 19 digits, no leading zeros); numbers have at most 15 integer and 15 fraction digits and an exponent of at
//   most 2 digits (a finite double), never an exponent when bounded; a bounded number has an integer part in range
//   (so bounds with no integer between them are refused); integers never carry a fraction; bounds beyond the
//   64-bit range are clamped to it;
// - strings are written canonically (only the escapes JSON requires); without type, a schema allows the types its
//   keywords belong to (every type when it has none).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "constrain/constraint_spec.h"
#include "constrain/grammar.h"
#include "util/error.h"

namespace qs {

// An unsupported keyword or a schema no document satisfies, e.g.
// `unsupported JSON Schema keyword "patternProperties" at /properties/x`.
class SchemaError : public Error {
 public:
  SchemaError(std::string keyword, std::string pointer, const std::string& message)
      : Error(message), keyword_(std::move(keyword)), pointer_(std::move(pointer)) {}
  const std::string& keyword() const { return keyword_; }
  const std::string& pointer() const { return pointer_; }  // JSON pointer of the schema holding it ("" = root)

 private:
  std::string keyword_, pointer_;
};

enum class JsonSyntax { Json, GemmaCall };

// Token ids of the special tokens Gemma 4's call syntax writes.
struct GemmaCallTokens {
  int32_t quote = 52;       // <|"|>
  int32_t call_start = 48;  // <|tool_call>
  int32_t call_end = 49;    // <tool_call|>
};

// Grammar whose root derives exactly the documents generated for `schema` (a nlohmann::json converts, sorted).
GrammarNetwork json_schema_grammar(const nlohmann::ordered_json& schema, JsonSyntax syntax, const GemmaCallTokens& tokens = {});
// Any JSON object (response_format json_object).
GrammarNetwork json_object_grammar();
// One call (or, with parallel, one or more) <|tool_call>call:NAME{args}<tool_call|>, NAME among `tools`, args valid
// against that tool's parameters in GemmaCall syntax. Errors name the tool: /tools/NAME/parameters/...
GrammarNetwork tool_calls_grammar(const std::vector<ToolSpec>& tools, bool parallel, const GemmaCallTokens& tokens = {});
// JSON text valid against `schema` (any JSON object when null), or else tool calls as tool_calls_grammar writes
// them: response_format with tools under tool_choice auto, where the model may call a tool before it answers.
GrammarNetwork json_or_tool_calls_grammar(const nlohmann::ordered_json* schema, const std::vector<ToolSpec>& tools,
                                          bool parallel, const GemmaCallTokens& tokens = {});

}  // namespace qs
