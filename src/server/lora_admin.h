#pragma once
// serve's LoRA routes and model cards (docs/lora.md), as vLLM answers them (vllm/entrypoints/openai/serving_models.py):
//   POST /v1/load_lora_adapter   {"lora_name", "lora_path"}: 200 "Success: LoRA adapter 'NAME' added successfully."
//   POST /v1/unload_lora_adapter {"lora_name"}: 200 "Success: LoRA adapter 'NAME' removed successfully."
// and each served adapter's card in GET /v1/models: {id: NAME, object: "model", created, owned_by, root: DIR,
// parent: the base's id}.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/http_transport.h"
#include "server/lora_registry.h"

namespace qs {

// Errors are ApiErrors (lora_registry.h; a body that is not such an object: 400 naming the field).
HttpResponse load_lora_adapter(LoraRegistry& loras, const Gemma4Model& base, std::string_view body);
HttpResponse unload_lora_adapter(LoraRegistry& loras, std::string_view body);

// The cards of the adapters `loras` serves on the base `base_name`.
nlohmann::ordered_json lora_model_cards(const LoraRegistry& loras, const std::string& base_name, int64_t created);

}  // namespace qs
