#include "text/tokenizer_json.h"

#include <fmt/format.h>

#include <cstdint>

#include "util/error.h"

namespace qs::text {
namespace {

// Streaming SAX loader: model.vocab and model.merges (~780k entries in the Gemma files) go straight into vectors;
// everything else becomes a small DOM. About 3x faster than parsing the whole file into a json value.
// It fills the TokenizerJson it is.
class LoadSax final : public nlohmann::json_sax<json>, public TokenizerJson {
 public:
  std::string error;  // why parsing stopped

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab)
      return vocab_id(v > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    if (mode_ == Mode::kVocab) return fail("model.vocab: the id of \"" + vocab_key_ + "\" is not an integer");
    return value(json(v));
  }
  bool string(string_t& s) override {
    switch (mode_) {
      case Mode::kDom:
        return value(json(std::move(s)));
      case Mode::kVocab:
        return fail("model.vocab: the id of \"" + vocab_key_ + "\" is a string, expected an integer");
      case Mode::kMerges: {
        // Legacy form "left right": exactly one space.
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return fail(fmt::format("model.merges[{}]: \"{}\" is not of the form \"left right\"", merges.size(), s));
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_.size() >= 2) return fail(fmt::format("model.merges[{}]: expected a pair of strings", merges.size()));
        pair_.push_back(std::move(s));
        return true;
    }
    return false;
  }
  bool binary(binary_t&) override { return fail("unexpected binary value"); }
  bool start_object(std::size_t) override {
    if (mode_ == Mode::kDom) {
      if (!stack_.empty() && stack_.back() == model_ && key_ == "vocab") {
        mode_ = Mode::kVocab;
        vocab_seen = true;
        vocab.clear();
        return true;
      }
      return start(json::object());
    }
    if (mode_ == Mode::kVocab) return fail("model.vocab: the id of \"" + vocab_key_ + "\" is an object");
    return fail(fmt::format("model.merges[{}]: expected a pair of strings or \"left right\"", merges.size()));
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    switch (mode_) {
      case Mode::kDom:
        if (!stack_.empty() && stack_.back() == model_ && key_ == "merges") {
          mode_ = Mode::kMerges;
          merges_seen = true;
          merges.clear();
          return true;
        }
        return start(json::array());
      case Mode::kVocab:
        return fail("model.vocab: the id of \"" + vocab_key_ + "\" is an array");
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_.clear();
        return true;
      case Mode::kMergePair:
        return fail(fmt::format("model.merges[{}]: expected a pair of strings", merges.size()));
    }
    return false;
  }
  bool end_array() override {
    switch (mode_) {
      case Mode::kMergePair:
        if (pair_.size() != 2) return fail(fmt::format("model.merges[{}]: expected a pair of strings", merges.size()));
        merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        mode_ = Mode::kMerges;
        return true;
      case Mode::kMerges:
        mode_ = Mode::kDom;
        return true;
      default:
        stack_.pop_back();
        return true;
    }
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    if (error.empty()) error = fmt::format("not valid JSON (byte {}): {}", position, ex.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool fail(std::string why) {
    error = std::move(why);
    return false;
  }
  bool vocab_id(int64_t v) {
    if (v < 0 || v > INT32_MAX)
      return fail(fmt::format("model.vocab: the id of \"{}\" is {}, expected 0..{}", vocab_key_, v, INT32_MAX));
    vocab.emplace_back(std::move(vocab_key_), static_cast<int32_t>(v));
    return true;
  }
  bool value(json&& v) {
    if (mode_ == Mode::kVocab) return fail("model.vocab: the id of \"" + vocab_key_ + "\" is not an integer");
    if (mode_ != Mode::kDom)
      return fail(fmt::format("model.merges[{}]: expected a pair of strings or \"left right\"", merges.size()));
    if (stack_.empty()) {
      root = std::move(v);
      return true;
    }
    json* top = stack_.back();
    if (top->is_array())
      top->push_back(std::move(v));
    else
      (*top)[key_] = std::move(v);
    return true;
  }
  bool start(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      stack_.push_back(&root);
      return true;
    }
    json* top = stack_.back();
    json* child;
    if (top->is_array()) {
      top->push_back(std::move(v));
      child = &top->back();
    } else {
      child = &((*top)[key_] = std::move(v));
      if (top == &root && key_ == "model" && child->is_object()) model_ = child;
    }
    stack_.push_back(child);
    return true;
  }

  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;
  std::string key_, vocab_key_;
  json* model_ = nullptr;
  std::vector<std::string> pair_;
};

}  // namespace

void JsonFields::fail(const std::string& why) const { throw Error(fmt::format("{}: {}", source_, why)); }

const json* JsonFields::member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool JsonFields::get_bool(const json& obj, const char* key, bool dflt, const std::string& where) const {
  const json* v = member(obj, key);
  if (!v || v->is_null()) return dflt;
  if (!v->is_boolean()) fail(fmt::format("{}.{} must be true or false, got {}", where, key, v->dump()));
  return v->get<bool>();
}

std::string JsonFields::get_string(const json& obj, const char* key, const std::string& where) const {
  const json* v = member(obj, key);
  if (!v || !v->is_string()) fail(fmt::format("{}.{} must be a string", where, key));
  return v->get<std::string>();
}

std::string JsonFields::type_of(const json& obj, const std::string& where) const {
  if (!obj.is_object()) fail(fmt::format("{} must be an object or null, got {}", where, obj.dump().substr(0, 80)));
  return get_string(obj, "type", where);
}

std::string JsonFields::literal_pattern(const json& obj, const std::string& where) const {
  const json* p = member(obj, "pattern");
  if (!p || !p->is_object()) fail(where + ".pattern must be an object {\"String\": ...}");
  if (p->contains("Regex")) fail(where + ".pattern: Regex patterns are not supported (only {\"String\": ...} literals)");
  std::string s = get_string(*p, "String", where + ".pattern");
  if (s.empty()) fail(where + ".pattern.String must not be empty");
  return s;
}

TokenizerJson read_tokenizer_json(std::string_view json_text, const JsonFields& fields) {
  LoadSax sax;
  bool ok = json::sax_parse(json_text.begin(), json_text.end(), &sax);
  if (!ok || !sax.error.empty()) fields.fail(sax.error.empty() ? "not valid JSON" : sax.error);
  return std::move(static_cast<TokenizerJson&>(sax));
}

}  // namespace qs::text
