#include "server/serve_plan.h"

#include <fmt/format.h>

#include "util/error.h"

namespace qs {

// The plan `qatserve plan --model DIR --device cpu` prints, with the engine's prefill chunk and batch: without
// --kv-memory the KV pool comes from it (memory_plan.h, default_kv_budget), and /metrics sets resident memory
// beside it.
MemoryPlan serve_plan(const Gemma4Model& model, const EngineOptions& engine, int image_soft_tokens,
                      uint64_t adapter_bytes) {
  PlanOptions po;
  po.adapter_bytes = adapter_bytes;
  po.image_soft_tokens = image_soft_tokens;
  po.device = resolve_device("cpu");
  po.prefill_chunk = engine.prefill_chunk;
  po.kv_dtype = model.kv_dtype();
  po.batch = engine.max_running;
  WeightBytes weights = weight_bytes_from_checkpoint(model.checkpoint(), model.config());
  if (model.lm_head().kind == WeightKind::Int4) weights.add_int4_lm_head(model.lm_head().bytes());
  return plan_memory(model.config(), weights, po);
}

// Room for max_running contexts of the served length (--max-model-len, else the model's), within the plan.
uint64_t planned_kv_bytes(const MemoryPlan& plan, const Gemma4Model& model, const EngineOptions& engine) {
  const int64_t context =
      engine.max_context > 0 ? engine.max_context : model.config().text.max_position_embeddings_or(8192);
  const uint64_t bytes = default_kv_budget(plan, engine.max_running, context);
  if (bytes == 0)
    throw Error(fmt::format("the memory plan for this machine ({} bytes: {}) leaves nothing for the KV cache; give "
                            "--kv-memory", plan.device.bytes, plan.device.note));
  return bytes;
}

// --max-model-len: a cap at or below the model's own context.
int64_t checked_max_model_len(int64_t requested, const Gemma4TextConfig& text) {
  if (requested < 0) throw Error(fmt::format("--max-model-len {}: expected a positive number of tokens", requested));
  if (requested > 0 && text.max_position_embeddings > 0 && requested > text.max_position_embeddings)
    throw Error(fmt::format("--max-model-len {} is longer than the model's context (max_position_embeddings {} in "
                            "config.json)", requested, text.max_position_embeddings));
  return requested;
}

}  // namespace qs
