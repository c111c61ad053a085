#include "constrain/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "constrain/char_classes.h"
#include "constrain/regex.h"

namespace qs {
namespace {

// Ordered: an object's properties are generated in the order the schema declares them (JsonSyntax::Json).
using json = nlohmann::ordered_json;
using Node = GrammarBuilder::Node;
constexpr int32_t kInf = GrammarBuilder::kUnbounded;
// Literals are bounded even where the schema sets no bound, so that a weak model cannot write digits forever
// (`{"age": 46000000000...` to max_tokens): integers are 64-bit integers (at most 19 digits; the limit is one
// below INT64_MAX so that moving an exclusive bound by one never overflows), numbers have at most 15 integer and
// 15 fraction digits (DBL_DIG: 15 significant digits survive a double) and an exponent of 1 or 2 digits (so the
// value stays below 1e115, finite as a double). Schema bounds beyond the 64-bit range are clamped to it.
constexpr int64_t kMaxInteger = INT64_MAX - 1;
constexpr int64_t kMaxIntegerPart = 999'999'999'999'999;
constexpr int32_t kMaxFractionDigits = 15, kMaxExponentDigits = 2;

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "discriminator", "$defs", "definitions", "$anchor", "contentEncoding", "contentMediaType"};
const std::set<std::string, std::less<>> kSupported = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "pattern", "format"};

// Keywords by the instance type they constrain (a schema without "type" allows the types its keywords name).
const std::map<std::string, std::vector<std::string>> kTypeKeywords = {
    {"object", {"properties", "required", "additionalProperties"}},
    {"array", {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}},
    {"string", {"minLength", "maxLength", "pattern", "format"}},
    {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}}};

const std::map<std::string, std::string> kFormats = {
    {"date", "^(19|20)[0-9]{2}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
             "02-(0[1-9]|1[0-9]|2[0-8]))$"},
    {"date-time", "^(19|20)[0-9]{2}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
                  "02-(0[1-9]|1[0-9]|2[0-8]))T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?"
                  "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    {"email", "^[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){0,3}$"}};

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}
std::string where(const std::string& ptr) { return ptr.empty() ? "the schema root" : ptr; }

[[noreturn]] void fail(const std::string& keyword, const std::string& ptr, const std::string& why) {
  const std::string what = keyword.empty() ? "JSON Schema" : fmt::format("JSON Schema keyword \"{}\"", keyword);
  throw SchemaError(keyword, ptr, fmt::format("{} at {}: {}", what, where(ptr), why));
}

std::string digits_of(int64_t v) { return std::to_string(v); }

// The keyword whose value holds the schema at `ptr` (/properties/x -> properties, /anyOf/2 -> anyOf, root -> "").
std::string holder_keyword(const std::string& ptr) {
  std::vector<std::string> parts;
  for (size_t start = 1, end; start <= ptr.size(); start = end + 1) {
    end = std::min(ptr.find('/', start), ptr.size());
    parts.push_back(ptr.substr(start, end - start));
  }
  for (size_t i = parts.size(); i-- > 0;) {
    const bool index = !parts[i].empty() && std::all_of(parts[i].begin(), parts[i].end(), ::isdigit);
    const bool named = i > 0 && (parts[i - 1] == "properties" || parts[i - 1] == "$defs" || parts[i - 1] == "definitions");
    if (!index && !named) return parts[i];
  }
  return "";
}

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& g, const json& root, JsonSyntax syntax, GemmaCallTokens tokens)
      : g_(g), root_(root), syntax_(syntax), tokens_(tokens) {}

  // The grammar of documents valid against the schema at `ptr` (a rule reference, so reuse is cheap).
  Node value(const json& s, const std::string& ptr) {
    Rule r = g_.declare("schema " + where(ptr));
    g_.define(r, value_body(s, ptr));
    return g_.ref(r);
  }

  Node any_object() {
    Node kv = g_.seq({any_key(), g_.literal(":"), sp(), any_value()});
    return g_.seq({g_.literal("{"), g_.optional(g_.seq({kv, g_.star(g_.seq({comma(), kv}))})), g_.literal("}")});
  }

  Node call(const ToolSpec& tool, const std::string& ptr) {
    json params = tool.parameters.is_null() ? json::object() : json(tool.parameters);
    if (params.is_object() && !params.contains("type")) params["type"] = "object";
    if (!params.is_object() || params["type"] != "object")
      fail("type", ptr, "a tool's parameters must be a JSON Schema of type \"object\"");
    return g_.seq({g_.special(tokens_.call_start), g_.literal("call:" + tool.name), value(params, ptr),
                   g_.special(tokens_.call_end)});
  }

 private:
  using Rule = GrammarBuilder::Rule;
  bool json_syntax() const { return syntax_ == JsonSyntax::Json; }
  Node sp() { return json_syntax() ? g_.optional(g_.literal(" ")) : g_.empty(); }
  Node comma() { return g_.seq({g_.literal(","), sp()}); }
  Node quote() { return json_syntax() ? g_.literal("\"") : g_.special(tokens_.quote); }
  Node char_of(const CharSet& set) { return json_syntax() ? json_string_char(g_, set) : utf8_char(g_, set); }
  CharWriter writer() {
    return [this](GrammarBuilder& g, const CharSet& set) { return char_of(set); };
  }
  // Any one character, as a shared rule: a string of n characters costs n calls, not n copies.
  Node any_char() {
    if (any_char_ < 0) {
      any_char_ = g_.declare("char");
      g_.define(any_char_, char_of(CharSet::all()));
    }
    return g_.ref(any_char_);
  }
  Node any_string() { return g_.seq({quote(), g_.star(any_char()), quote()}); }
  Node any_key() {
    if (json_syntax()) return any_string();
    return g_.seq({g_.bytes(key_first()), g_.star(g_.bytes(key_rest()))});
  }
  ByteSet key_rest() const { return ByteSet().add('0', '9').add('A', 'Z').add('a', 'z').add('_'); }
  ByteSet key_first() const { return json_syntax() ? key_rest() : ByteSet().add('A', 'Z').add('a', 'z').add('_'); }

  Node any_value() {
    if (any_value_ < 0) {
      any_value_ = g_.declare("any value");
      Node array = g_.seq({g_.literal("["), g_.optional(g_.seq({g_.ref(any_value_), g_.star(g_.seq({comma(), g_.ref(any_value_)}))})),
                           g_.literal("]")});
      g_.define(any_value_, g_.alt({any_object(), array, any_string(), number({}, false), g_.literal("true"),
                                    g_.literal("false"), g_.literal("null")}));
    }
    return g_.ref(any_value_);
  }

  Node value_body(const json& s, const std::string& ptr) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      fail("false", ptr, "the schema false has no valid instance");
    }
    if (!s.is_object()) fail(holder_keyword(ptr), ptr, fmt::format("a schema must be an object or a boolean, got {}", s.dump()));
    for (const auto& [key, v] : s.items())
      if (!kAnnotations.contains(key) && !kSupported.contains(key))
        throw SchemaError(key, ptr, fmt::format("unsupported JSON Schema keyword \"{}\" at {}", key, where(ptr)));
    if (s.contains("$ref")) return ref(s, ptr);
    if (s.contains("allOf")) return all_of(s, ptr);
    if (s.contains("anyOf") || s.contains("oneOf")) return any_of(s, ptr);
    if (s.contains("const") || s.contains("enum")) return enumeration(s, ptr);
    std::vector<Node> options;
    for (const std::string& type : types(s, ptr)) options.push_back(typed(type, s, ptr));
    return g_.alt(std::move(options));
  }

  // Keywords beside which another keyword is not supported (besides annotations).
  void only_with(const json& s, const std::string& keyword, const std::string& ptr,
                 std::initializer_list<std::string_view> allowed = {}) {
    for (const auto& [key, v] : s.items())
      if (key != keyword && !kAnnotations.contains(key) && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
        fail(key, ptr, fmt::format("is not supported beside \"{}\"", keyword));
  }

  Node ref(const json& s, const std::string& ptr) {
    only_with(s, "$ref", ptr);
    const json& target = s["$ref"];
    if (!target.is_string() || !target.get<std::string>().starts_with("#"))
      fail("$ref", ptr, "only references inside the document (\"#...\") are supported");
    std::string pointer = target.get<std::string>().substr(1);
    auto it = refs_.find(pointer);
    if (it != refs_.end()) return g_.ref(it->second);
    const json* resolved = nullptr;
    try {
      resolved = &root_.at(json::json_pointer(pointer));
    } catch (const json::exception&) {
      fail("$ref", ptr, fmt::format("\"{}\" points to nothing in the schema", target.get<std::string>()));
    }
    Rule r = g_.declare("$ref " + pointer);
    refs_.emplace(pointer, r);
    g_.define(r, value_body(*resolved, pointer));
    return g_.ref(r);
  }

  Node all_of(const json& s, const std::string& ptr) {
    only_with(s, "allOf", ptr);
    const json& list = s["allOf"];
    if (!list.is_array() || list.size() != 1) fail("allOf", ptr, "only an allOf of exactly one schema is supported");
    return value(list[0], ptr + "/allOf/0");
  }

  Node any_of(const json& s, const std::string& ptr) {
    const std::string keyword = s.contains("anyOf") ? "anyOf" : "oneOf";
    only_with(s, keyword, ptr);
    const json& list = s[keyword];
    if (!list.is_array() || list.empty()) fail(keyword, ptr, "expected a non-empty array of schemas");
    std::vector<Node> options;
    for (size_t i = 0; i < list.size(); ++i) options.push_back(value(list[i], fmt::format("{}/{}/{}", ptr, keyword, i)));
    return g_.alt(std::move(options));
  }

  static bool has_type(const json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (type == "number") return v.is_number();
    if (type == "string") return v.is_string();
    if (type == "array") return v.is_array();
    return v.is_object();
  }

  // const / enum: the listed values (of the allowed types, when "type" is given beside them).
  Node enumeration(const json& s, const std::string& ptr) {
    const std::string keyword = s.contains("const") ? "const" : "enum";
    only_with(s, keyword, ptr, {"type"});
    json values = keyword == "const" ? json::array({s["const"]}) : s["enum"];
    if (!values.is_array()) fail("enum", ptr, "expected an array of values");
    std::vector<std::string> allowed = s.contains("type") ? types(s, ptr) : std::vector<std::string>{};
    std::vector<Node> options;
    for (const json& v : values)
      if (allowed.empty() || std::any_of(allowed.begin(), allowed.end(), [&](const auto& t) { return has_type(v, t); }))
        options.push_back(literal_value(v));
    if (options.empty()) fail(keyword, ptr, "no listed value has the schema's type: no valid instance");
    return g_.alt(std::move(options));
  }

  Node literal_value(const json& v) {
    if (json_syntax()) return g_.literal(v.dump());
    if (v.is_string()) return g_.seq({quote(), g_.literal(v.get<std::string>()), quote()});
    std::vector<Node> parts;
    if (v.is_object()) {
      parts.push_back(g_.literal("{"));
      bool first = true;
      const nlohmann::json sorted = v;  // keys in sorted order, as the template's dictsort writes them
      for (const auto& [key, item] : sorted.items()) {
        parts.push_back(g_.literal(fmt::format("{}{}:", first ? "" : ",", key)));
        parts.push_back(literal_value(item));
        first = false;
      }
      parts.push_back(g_.literal("}"));
    } else if (v.is_array()) {
      parts.push_back(g_.literal("["));
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) parts.push_back(g_.literal(","));
        parts.push_back(literal_value(v[i]));
      }
      parts.push_back(g_.literal("]"));
    } else {
      parts.push_back(g_.literal(v.dump()));
    }
    return g_.seq(std::move(parts));
  }

  std::vector<std::string> types(const json& s, const std::string& ptr) {
    static const std::vector<std::string> kAll = {"object", "array", "string", "number", "boolean", "null"};
    std::vector<std::string> out;
    if (s.contains("type")) {
      const json& t = s["type"];
      for (const json& one : t.is_array() ? t : json::array({t})) {
        if (!one.is_string() || (one != "integer" && std::find(kAll.begin(), kAll.end(), one.get<std::string>()) == kAll.end()))
          fail("type", ptr, fmt::format("unknown type {}", one.dump()));
        out.push_back(one.get<std::string>());
      }
      if (out.empty()) fail("type", ptr, "an empty list of types has no valid instance");
      return out;
    }
    for (const auto& [type, keywords] : kTypeKeywords)
      if (std::any_of(keywords.begin(), keywords.end(), [&](const auto& k) { return s.contains(k); })) out.push_back(type);
    return out.empty() ? kAll : out;
  }

  Node typed(const std::string& type, const json& s, const std::string& ptr) {
    if (type == "null") return g_.literal("null");
    if (type == "boolean") return g_.alt({g_.literal("true"), g_.literal("false")});
    if (type == "string") return string(s, ptr);
    if (type == "integer" || type == "number") return number(s, type == "integer", ptr);
    if (type == "array") return array(s, ptr);
    return object(s, ptr);
  }

  static std::optional<int64_t> count(const json& s, const char* keyword, const std::string& ptr) {
    if (!s.contains(keyword)) return std::nullopt;
    const json& v = s[keyword];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      fail(keyword, ptr, fmt::format("expected a non-negative integer, got {}", v.dump()));
    return std::min<int64_t>(v.get<int64_t>(), int64_t{1} << 30);
  }

  Node string(const json& s, const std::string& ptr) {
    const auto min = count(s, "minLength", ptr), max = count(s, "maxLength", ptr);
    if (min && max && *min > *max) fail("minLength", ptr, fmt::format("minLength {} > maxLength {}: no valid instance", *min, *max));
    std::optional<std::string> regex;
    std::string source;
    if (s.contains("format")) {
      const json& f = s["format"];
      auto it = f.is_string() ? kFormats.find(f.get<std::string>()) : kFormats.end();
      if (it == kFormats.end())
        fail("format", ptr, fmt::format("format {} is not supported (date, date-time, uuid, email are)", f.dump()));
      regex = it->second;
      source = "format";
    }
    if (s.contains("pattern")) {
      if (regex) fail("pattern", ptr, "pattern beside format is not supported");
      if (!s["pattern"].is_string()) fail("pattern", ptr, "expected a string");
      regex = s["pattern"].get<std::string>();
      source = "pattern";
    }
    if (regex && (min || max)) fail(min ? "minLength" : "maxLength", ptr, fmt::format("is not supported beside {}", source));
    if (!regex) return g_.seq({quote(), g_.repeat(any_char(), static_cast<int32_t>(min.value_or(0)),
                                                  max ? static_cast<int32_t>(*max) : kInf), quote()});
    try {
      return g_.seq({quote(), compile_pattern(g_, *regex, writer()), quote()});
    } catch (const SchemaError&) {
      throw;
    } catch (const Error& e) {
      fail(source, ptr, e.what());
    }
  }

  // --- numbers -------------------------------------------------------------------------------------------------

  Node digit_range(char lo, char hi) { return g_.byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); }

  // Digit strings of equal length from a to b (leading zeros allowed: callers fix the first digit).
  Node same_length(const std::string& a, const std::string& b) {
    if (a.empty()) return g_.empty();
    // Every digit string of this length: one node. (Without it the two recursive calls below each meet this case
    // again, and 19-digit bounds took 2^19 calls: found by fuzz/json_schema_fuzz.)
    if (a.find_first_not_of('0') == std::string::npos && b.find_first_not_of('9') == std::string::npos)
      return g_.repeat(digit_range('0', '9'), static_cast<int32_t>(a.size()), static_cast<int32_t>(a.size()));
    if (a[0] == b[0]) return g_.seq({g_.literal(a.substr(0, 1)), same_length(a.substr(1), b.substr(1))});
    const size_t rest = a.size() - 1;
    const std::string nines(rest, '9'), zeros(rest, '0');
    std::vector<Node> options{g_.seq({g_.literal(a.substr(0, 1)), same_length(a.substr(1), nines)})};
    if (b[0] - a[0] > 1) options.push_back(g_.seq({digit_range(a[0] + 1, b[0] - 1), g_.repeat(digit_range('0', '9'), rest, rest)}));
    options.push_back(g_.seq({g_.literal(b.substr(0, 1)), same_length(zeros, b.substr(1))}));
    return g_.alt(std::move(options));
  }

  // Decimal integers a..b without leading zeros, 0 <= a <= b.
  Node natural_range(int64_t a, int64_t b) {
    std::vector<Node> options;
    const size_t la = digits_of(a).size(), lb = digits_of(b).size();
    uint64_t power = 1;  // 10^(len - 1), the smallest number of len digits (at most 10^19: no overflow)
    for (size_t i = 1; i < la; ++i) power *= 10;
    for (size_t len = la; len <= lb; ++len, power *= 10) {
      const std::string lo = len == la ? digits_of(a) : std::to_string(power);
      const std::string hi = len == lb ? digits_of(b) : std::string(len, '9');
      options.push_back(same_length(lo, hi));
    }
    return g_.alt(std::move(options));
  }

  // Integer literals from lo to hi (lo <= hi, both within +-kMaxInteger); "-0" is never written.
  Node integer_range(int64_t lo, int64_t hi) {
    std::vector<Node> options;
    if (hi >= 0) options.push_back(natural_range(std::max<int64_t>(0, lo), hi));
    if (lo < 0) options.push_back(g_.seq({g_.literal("-"), natural_range(-std::min<int64_t>(hi, -1), -lo)}));
    return g_.alt(std::move(options));
  }

  static std::optional<double> bound(const json& s, const char* keyword, const std::string& ptr) {
    if (!s.contains(keyword)) return std::nullopt;
    if (!s[keyword].is_number()) fail(keyword, ptr, fmt::format("expected a number, got {}", s[keyword].dump()));
    return s[keyword].get<double>();
  }
  // Into +-kMaxInteger (0x1p63 is 2^63: every double below it converts to int64 exactly).
  static int64_t clamp(double v) {
    if (v >= 0x1p63) return kMaxInteger;
    if (v <= -0x1p63) return -kMaxInteger;
    return std::clamp<int64_t>(static_cast<int64_t>(v), -kMaxInteger, kMaxInteger);
  }

  // "." and 1 to kMaxFractionDigits digits.
  Node fraction() { return g_.seq({g_.literal("."), g_.repeat(digit_range('0', '9'), 1, kMaxFractionDigits)}); }

  // Without bounds: integers within +-kMaxInteger; numbers with at most kMaxIntegerPart before the point, an
  // optional fraction and an optional exponent of at most kMaxExponentDigits digits.
  Node unbounded_number(bool integer) {
    if (integer) return integer_range(-kMaxInteger, kMaxInteger);
    Node whole = g_.seq({g_.optional(g_.literal("-")), natural_range(0, kMaxIntegerPart)});  // -0.5 too
    Node exponent = g_.seq({g_.alt({g_.literal("e"), g_.literal("E")}), g_.optional(g_.alt({g_.literal("+"), g_.literal("-")})),
                            g_.repeat(digit_range('0', '9'), 1, kMaxExponentDigits)});
    return g_.seq({whole, g_.optional(fraction()), g_.optional(exponent)});
  }

  Node number(const json& s, bool integer, const std::string& ptr = "") {
    auto lo = bound(s, "minimum", ptr), hi = bound(s, "maximum", ptr);
    auto xlo = bound(s, "exclusiveMinimum", ptr), xhi = bound(s, "exclusiveMaximum", ptr);
    const bool lo_excl = xlo && (!lo || *xlo >= *lo), hi_excl = xhi && (!hi || *xhi <= *hi);
    if (lo_excl) lo = xlo;
    if (hi_excl) hi = xhi;
    if (!lo && !hi) return unbounded_number(integer);
    // The integers within the schema's bounds; a side without one gets the literal's own limit (or, past that
    // limit, the other bound: a number with only minimum 1e16 is still satisfiable).
    const int64_t limit = integer ? kMaxInteger : kMaxIntegerPart;
    std::optional<int64_t> lo_int, hi_int;
    if (lo) lo_int = lo_excl ? clamp(std::floor(*lo)) + 1 : clamp(std::ceil(*lo));
    if (hi) hi_int = hi_excl ? clamp(std::ceil(*hi)) - 1 : clamp(std::floor(*hi));
    const int64_t L = lo_int.value_or(std::min(-limit, hi_int.value_or(0)));
    const int64_t H = hi_int.value_or(std::max(limit, lo_int.value_or(0)));
    std::vector<Node> options;
    if (L <= H) options.push_back(integer_range(L, H));
    if (!integer) {
      // "I.F" (I >= 0) lies in [I, I+1): I from L up to floor(hi) - 1. "-M.F" lies in (-(M+1), -M]: M from
      // the magnitude -hi allows up to floor(-lo) - 1.
      const int64_t ihi = hi ? clamp(std::floor(*hi)) - 1 : H;
      const int64_t ilo = std::max<int64_t>(0, L);
      if (ilo <= ihi) options.push_back(g_.seq({natural_range(ilo, ihi), fraction()}));
      int64_t mlo = 0;
      if (hi) mlo = std::max<int64_t>(0, hi_excl ? clamp(std::floor(-*hi)) + 1 : clamp(std::ceil(-*hi)));
      const int64_t mhi = lo ? clamp(std::floor(-*lo)) - 1 : -L;
      if (mlo <= mhi) options.push_back(g_.seq({g_.literal("-"), natural_range(mlo, mhi), fraction()}));
    }
    if (options.empty())
      fail(lo_excl ? "exclusiveMinimum" : "minimum", ptr,
           integer ? "no integer lies within the bounds: no valid instance"
                   : "no integer lies within the bounds (only bounds with an integer between them are supported)");
    return g_.alt(std::move(options));
  }

  // --- arrays --------------------------------------------------------------------------------------------------

  Node array(const json& s, const std::string& ptr) {
    const auto min = count(s, "minItems", ptr).value_or(0);
    auto max = count(s, "maxItems", ptr);
    if (max && min > *max) fail("minItems", ptr, fmt::format("minItems {} > maxItems {}: no valid instance", min, *max));
    if (s.contains("uniqueItems") && s["uniqueItems"] == true && !(max && *max <= 1))
      fail("uniqueItems", ptr, "uniqueItems true is not supported (unless maxItems <= 1)");
    std::vector<Node> prefix;
    std::optional<json> items;  // nullopt: no items after the prefix
    std::string items_ptr = ptr + "/items";
    const bool tuple = s.contains("prefixItems") || (s.contains("items") && s["items"].is_array());
    if (tuple) {
      const char* key = s.contains("prefixItems") ? "prefixItems" : "items";
      const json& list = s[key];
      if (!list.is_array()) fail(key, ptr, "expected an array of schemas");
      for (size_t i = 0; i < list.size(); ++i) prefix.push_back(value(list[i], fmt::format("{}/{}/{}", ptr, key, i)));
      const char* rest = s.contains("prefixItems") ? "items" : "additionalItems";
      items = s.contains(rest) ? s[rest] : json(true);
      items_ptr = ptr + "/" + rest;
    } else {
      items = s.contains("items") ? s["items"] : json(true);
    }
    if (items->is_boolean() && !items->get<bool>()) items.reset();
    if (!items && min > static_cast<int64_t>(prefix.size()))
      fail("minItems", ptr, fmt::format("minItems {} but at most {} items are allowed: no valid instance", min, prefix.size()));
    std::optional<Node> item;
    if (items) item = value(*items, items_ptr);
    return g_.seq({g_.literal("["), elements(prefix, item, 0, min, max), g_.literal("]")});
  }

  // The elements from position j on, each after a "," when j > 0.
  Node elements(const std::vector<Node>& prefix, std::optional<Node> item, int64_t j, int64_t min,
                std::optional<int64_t> max) {
    if (max && j >= *max) return g_.empty();
    const Node sep = j > 0 ? comma() : g_.empty();
    if (j >= static_cast<int64_t>(prefix.size())) {
      if (!item) return g_.empty();
      const auto reps_min = static_cast<int32_t>(std::max<int64_t>(0, min - j));
      const int32_t reps_max = max ? static_cast<int32_t>(*max - j) : kInf;
      if (j > 0) return g_.repeat(g_.seq({comma(), *item}), reps_min, reps_max);
      Node more = g_.repeat(g_.seq({comma(), *item}), std::max(0, reps_min - 1), reps_max == kInf ? kInf : reps_max - 1);
      Node some = g_.seq({*item, more});
      return reps_min > 0 ? some : g_.optional(some);
    }
    Node here = g_.seq({sep, prefix[j], elements(prefix, item, j + 1, min, max)});
    return j < min ? here : g_.optional(here);
  }

  // --- objects -------------------------------------------------------------------------------------------------

  struct Property {
    std::string key;
    Node value;
    bool required;
  };

  Node object(const json& s, const std::string& ptr) {
    const json props = s.contains("properties") ? s["properties"] : json::object();
    if (!props.is_object()) fail("properties", ptr, "expected an object of schemas");
    std::set<std::string> required;
    std::vector<std::string> required_order;  // as listed, each once
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("required", ptr, "expected an array of property names");
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail("required", ptr, fmt::format("expected property names, got {}", r.dump()));
        if (required.insert(r.get<std::string>()).second) required_order.push_back(r.get<std::string>());
      }
    }
    // No extra properties unless asked for, or unless the object declares none (then it is any object).
    json additional = s.contains("additionalProperties") ? s["additionalProperties"] : json(props.empty());
    const bool extra_allowed = !(additional.is_boolean() && !additional.get<bool>());
    std::vector<Property> properties;
    std::vector<std::string> names;
    for (const auto& [key, schema] : props.items()) {
      properties.push_back({key, value(schema, ptr + "/properties/" + pointer_token(key)), required.contains(key)});
      names.push_back(key);
    }
    for (const std::string& key : required_order) {
      if (props.contains(key)) continue;
      if (!extra_allowed) fail("required", ptr, fmt::format("\"{}\" is required but additionalProperties is false", key));
      properties.push_back({key, value(additional, ptr + "/additionalProperties"), true});
      names.push_back(key);
    }
    // JSON: the declared order (properties, then required names declared nowhere else), as OpenAI's strict mode
    // and llama.cpp's json-schema-to-grammar write them. Gemma's call syntax: sorted, the order the model saw in
    // training, since its chat template writes both the tool declarations and the calls' arguments with dictsort.
    if (!json_syntax())
      std::stable_sort(properties.begin(), properties.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    std::optional<Node> extra;
    if (extra_allowed)
      extra = g_.seq({extra_key(names), g_.literal(":"), sp(), value(additional, ptr + "/additionalProperties")});
    return g_.seq({g_.literal("{"), members(properties, extra, ptr), g_.literal("}")});
  }

  // tail[i][first]: the members from property i on; `first` when nothing has been written yet (no comma).
  Node members(const std::vector<Property>& props, std::optional<Node> extra, const std::string& ptr) {
    const size_t n = props.size();
    std::vector<std::array<Rule, 2>> tail(n + 1);
    for (size_t i = 0; i <= n; ++i)
      for (int first = 0; first < 2; ++first) tail[i][first] = g_.declare(fmt::format("members {} {}#{}", where(ptr), i, first));
    for (int first = 0; first < 2; ++first) {
      Node rest = g_.empty();
      if (extra) {
        Node more = g_.star(g_.seq({comma(), *extra}));
        rest = first ? g_.optional(g_.seq({*extra, more})) : more;
      }
      g_.define(tail[n][first], rest);
    }
    for (size_t i = n; i-- > 0;) {
      const Property& p = props[i];
      const Node key = json_syntax() ? g_.literal(json(p.key).dump()) : g_.literal(p.key);
      for (int first = 0; first < 2; ++first) {
        Node with = g_.seq({first ? g_.empty() : comma(), key, g_.literal(":"), sp(), p.value, g_.ref(tail[i + 1][0])});
        g_.define(tail[i][first], p.required ? with : g_.alt({with, g_.ref(tail[i + 1][first])}));
      }
    }
    return g_.ref(tail[0][1]);
  }

  // A key of an extra property: any key when none is declared; else a word of [A-Za-z0-9_] (GemmaCall: not
  // starting with a digit) that is none of the declared names, so that it is checked against additionalProperties
  // and nothing else.
  Node extra_key(const std::vector<std::string>& declared) {
    if (declared.empty()) return any_key();
    std::vector<std::string> names;
    for (const auto& n : declared)
      if (!n.empty() && key_first().has(static_cast<uint8_t>(n[0])) &&
          std::all_of(n.begin(), n.end(), [&](char c) { return key_rest().has(static_cast<uint8_t>(c)); }))
        names.push_back(n);
    Node word = not_in(names, 0);
    return json_syntax() ? g_.seq({g_.literal("\""), word, g_.literal("\"")}) : word;
  }

  // Suffixes w (non-empty overall) such that prefix + w is none of `names`, all of which share the prefix of
  // length `depth`.
  Node not_in(const std::vector<std::string>& names, size_t depth) {
    const ByteSet alphabet = depth == 0 ? key_first() : key_rest();
    std::vector<Node> options;
    if (depth > 0 && std::none_of(names.begin(), names.end(), [&](const auto& n) { return n.size() == depth; }))
      options.push_back(g_.empty());
    std::map<char, std::vector<std::string>> by_next;
    for (const auto& n : names)
      if (n.size() > depth) by_next[n[depth]].push_back(n);
    ByteSet fresh = alphabet;
    for (const auto& [c, group] : by_next) fresh = fresh.minus(ByteSet().add(static_cast<uint8_t>(c)));
    if (!fresh.empty()) options.push_back(g_.seq({g_.bytes(fresh), g_.star(g_.bytes(key_rest()))}));
    for (const auto& [c, group] : by_next) options.push_back(g_.seq({g_.literal(std::string(1, c)), not_in(group, depth + 1)}));
    return g_.alt(std::move(options));
  }

  GrammarBuilder& g_;
  const json& root_;
  JsonSyntax syntax_;
  GemmaCallTokens tokens_;
  std::map<std::string, Rule> refs_;
  Rule any_char_ = -1, any_value_ = -1;
};

GrammarNetwork build(GrammarBuilder& g, Node body) {
  auto root = g.declare("root");
  g.define(root, body);
  try {
    return g.build(root);
  } catch (const SchemaError&) {
    throw;
  } catch (const Error& e) {
    throw SchemaError("", "", fmt::format("the schema has no valid instance that can be generated ({})", e.what()));
  }
}

}  // namespace

GrammarNetwork json_schema_grammar(const nlohmann::ordered_json& schema, JsonSyntax syntax, const GemmaCallTokens& tokens) {
  GrammarBuilder g;
  SchemaCompiler c(g, schema, syntax, tokens);
  return build(g, c.value(schema, ""));
}

GrammarNetwork json_object_grammar() {
  GrammarBuilder g;
  SchemaCompiler c(g, json::object(), JsonSyntax::Json, {});
  return build(g, c.any_object());
}

namespace {

// One call (or, with parallel, one or more) among `tools`, each compiled against its own parameters.
Node tool_calls(GrammarBuilder& g, const std::vector<ToolSpec>& tools, bool parallel, const GemmaCallTokens& tokens) {
  if (tools.empty()) throw SchemaError("tools", "", "tool calls were required but no tool is declared");
  std::vector<Node> calls;
  for (const ToolSpec& tool : tools) {
    if (tool.name.empty()) throw SchemaError("name", "/tools", "a tool has no function name");
    const json params = tool.parameters;  // the compiler keeps a reference: $ref pointers resolve in it
    SchemaCompiler c(g, params, JsonSyntax::GemmaCall, tokens);
    calls.push_back(c.call(tool, "/tools/" + pointer_token(tool.name) + "/parameters"));
  }
  Node one = g.alt(std::move(calls));
  return parallel ? g.repeat(one, 1, kInf) : one;
}

}  // namespace

GrammarNetwork tool_calls_grammar(const std::vector<ToolSpec>& tools, bool parallel, const GemmaCallTokens& tokens) {
  GrammarBuilder g;
  return build(g, tool_calls(g, tools, parallel, tokens));
}

GrammarNetwork json_or_tool_calls_grammar(const nlohmann::ordered_json* schema, const std::vector<ToolSpec>& tools,
                                          bool parallel, const GemmaCallTokens& tokens) {
  GrammarBuilder g;
  const json root = schema ? *schema : json::object();  // the compiler keeps a reference: $ref resolves in it
  SchemaCompiler c(g, root, JsonSyntax::Json, tokens);
  Node answer = schema ? c.value(root, "") : c.any_object();
  return build(g, g.alt({std::move(answer), tool_calls(g, tools, parallel, tokens)}));
}

}  // namespace qs
