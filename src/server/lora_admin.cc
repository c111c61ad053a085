#include "server/lora_admin.h"

#include <fmt/format.h>

#include "server/openai_protocol.h"
#include "server/request_fields.h"

namespace qs {
namespace {

using json = nlohmann::json;
using namespace request_fields;

std::string string_field(const json& body, const char* name) {
  const json* v = find(body, name);
  return v ? as_string(*v, name) : std::string();
}

HttpResponse text_response(const std::string& text) {
  HttpResponse res;
  res.content_type = "text/plain; charset=utf-8";
  res.body = text;
  return res;
}

}  // namespace

HttpResponse load_lora_adapter(LoraRegistry& loras, const Gemma4Model& base, std::string_view body) {
  const json j = parse_json_body(body);
  const std::string name = string_field(j, "lora_name");
  loras.load(name, string_field(j, "lora_path"), base);
  return text_response(fmt::format("Success: LoRA adapter '{}' added successfully.", name));
}

HttpResponse unload_lora_adapter(LoraRegistry& loras, std::string_view body) {
  const json j = parse_json_body(body);
  const std::string name = string_field(j, "lora_name");
  if (name.empty()) bad("lora_name", "'lora_name' must be provided.");
  loras.unload(name);
  return text_response(fmt::format("Success: LoRA adapter '{}' removed successfully.", name));
}

nlohmann::ordered_json lora_model_cards(const LoraRegistry& loras, const std::string& base_name, int64_t created) {
  nlohmann::ordered_json cards = nlohmann::ordered_json::array();
  for (const ServedAdapter& a : loras.list()) {
    nlohmann::ordered_json card;
    card["id"] = a.name;
    card["object"] = "model";
    card["created"] = created;
    card["owned_by"] = "qatserve";
    card["root"] = a.dir.string();
    card["parent"] = base_name;
    cards.push_back(std::move(card));
  }
  return cards;
}

}  // namespace qs
