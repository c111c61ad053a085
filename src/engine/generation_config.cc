#include "engine/generation_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"
#include "util/json_parse.h"
#include "util/file.h"

namespace qs {
namespace {

using json = nlohmann::json;

// Gemma 4's ids: <bos> 2, <pad> 0, and the config.json pair <eos> 1, <turn|> 106.
constexpr int32_t kGemma4Bos = 2, kGemma4Pad = 0;
const std::vector<int32_t> kGemma4ConfigEos = {1, 106};

class Fields {
 public:
  Fields(const json& obj, std::string_view label) : obj_(obj), label_(label) {}

  [[noreturn]] void fail(std::string_view field, const std::string& what) const {
    throw Error(fmt::format("{}: field '{}' {}", label_, field, what));
  }
  const json* get(std::string_view f) const {
    auto it = obj_.find(std::string(f));
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  int32_t token_id(const json& v, std::string_view f) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(f, fmt::format("must be a token id (an integer >= 0), got {}", v.dump()));
    return v.get<int32_t>();
  }
  void read(std::string_view f, int32_t& out) const {
    if (const json* v = get(f)) out = token_id(*v, f);
  }
  void read(std::string_view f, float& out) const {
    if (const json* v = get(f)) {
      if (!v->is_number()) fail(f, fmt::format("must be a number, got {}", v->dump()));
      out = v->get<float>();
    }
  }
  void read(std::string_view f, bool& out) const {
    if (const json* v = get(f)) {
      if (!v->is_boolean()) fail(f, fmt::format("must be true or false, got {}", v->dump()));
      out = v->get<bool>();
    }
  }
  void read_count(std::string_view f, int32_t& out) const {
    if (const json* v = get(f)) {
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > INT32_MAX)
        fail(f, fmt::format("must be an integer >= 0, got {}", v->dump()));
      out = v->get<int32_t>();
    }
  }
  // A single id or a list of ids, as transformers writes eos_token_id.
  void read_ids(std::string_view f, std::vector<int32_t>& out) const {
    const json* v = get(f);
    if (!v) return;
    out.clear();
    if (!v->is_array()) {
      out.push_back(token_id(*v, f));
      return;
    }
    for (const json& id : *v) out.push_back(token_id(id, f));
    if (out.empty()) fail(f, "must list at least one token id, got []");
  }

 private:
  const json& obj_;
  std::string_view label_;
};

json parse_object(std::string_view text, std::string_view label) {
  json j = parse_json<json>(text, label);
  if (!j.is_object()) throw Error(fmt::format("{}: expected a JSON object", label));
  return j;
}

}  // namespace

bool GenerationConfig::is_eos(int32_t id) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), id) != eos_token_ids.end();
}

SamplingParams GenerationConfig::default_sampling() const {
  SamplingParams p;
  p.temperature = do_sample ? temperature : 0.0f;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repetition_penalty;
  return p;
}

GenerationConfig gemma4_release_generation_config() {
  GenerationConfig g;
  g.eos_token_ids = {1, 106, 50};
  g.do_sample = true;
  g.temperature = 1.0f;
  g.top_k = 64;
  g.top_p = 0.95f;
  return g;
}

GenerationConfig parse_generation_config(std::string_view json_text, std::string_view label) {
  json j = parse_object(json_text, label);
  Fields f(j, label);
  GenerationConfig g;
  g.bos_token_id = kGemma4Bos;
  g.pad_token_id = kGemma4Pad;
  g.eos_token_ids = kGemma4ConfigEos;
  f.read("bos_token_id", g.bos_token_id);
  f.read("pad_token_id", g.pad_token_id);
  f.read_ids("eos_token_id", g.eos_token_ids);
  f.read("do_sample", g.do_sample);
  f.read("temperature", g.temperature);
  f.read_count("top_k", g.top_k);
  f.read("top_p", g.top_p);
  f.read("min_p", g.min_p);
  f.read("repetition_penalty", g.repetition_penalty);
  if (const json* v = f.get("max_new_tokens")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 1)
      f.fail("max_new_tokens", fmt::format("must be an integer >= 1, got {}", v->dump()));
    g.max_new_tokens = v->get<int64_t>();
  }
  try {
    g.default_sampling().validate();  // its messages name the parameter, which is also the field's name
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", label, e.what()));
  }
  return g;
}

GenerationConfig read_generation_config(const std::filesystem::path& checkpoint_dir) {
  auto path = checkpoint_dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return gemma4_release_generation_config();
  return parse_generation_config(read_file(path), path.string());
}

}  // namespace qs
