#pragma once
// The memory plan serve sizes its KV pool from, and the context cap it serves (http_server.h).
#include <cstdint>

#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "model/gemma4.h"

namespace qs {

// The plan `qatserve plan --model DIR --device cpu` prints, with the engine's prefill chunk and batch and the
// LoRA adapters' bytes (LoraRegistry::planned_bytes).
MemoryPlan serve_plan(const Gemma4Model& model, const EngineOptions& engine, int image_soft_tokens,
                      uint64_t adapter_bytes);

// Room for max_running contexts of the served length (--max-model-len, else the model's), within the plan; throws
// when the plan leaves nothing for the KV cache.
uint64_t planned_kv_bytes(const MemoryPlan& plan, const Gemma4Model& model, const EngineOptions& engine);

// --max-model-len: a cap at or below the model's own context; throws naming the flag otherwise.
int64_t checked_max_model_len(int64_t requested, const Gemma4TextConfig& text);

}  // namespace qs
