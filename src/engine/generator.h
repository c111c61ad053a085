#pragma once
// One sequence from prompt to finish, for the command line: prefill, then decode token by token with the sampler,
// stopping on end-of-turn ids, stop token ids, stop strings (never split across tokens) or max_tokens. Text is
// streamed as complete UTF-8. It runs through the same batching engine as the server.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "constrain/constraint_spec.h"
#include "engine/generation_config.h"
#include "engine/media_prompt.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace qs {

class Gemma4Assistant;
class Gemma4Model;
class LoraAdapter;
class Tokenizer;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;        // stop strings (need a tokenizer)
  std::vector<int32_t> stop_token_ids;  // besides the generation config's eos ids
  bool ignore_eos = false;
  ConstraintSpec constraint;  // what the output must obey (src/constrain); None = free text
  std::vector<MediaSpan> media;  // soft tokens in the prompt (engine/media_prompt.h)
  SpeculativeConfig speculative;  // speculative decoding (engine/speculative.h); the output is the same
  std::shared_ptr<const LoraAdapter> lora;  // a LoRA adapter on the model (null: the base alone)
};

struct GenerationResult {
  std::vector<SampledToken> tokens;  // generated, without the token that stopped it
  std::string text;
  std::string finish_reason;         // "stop" or "length"
  double prefill_seconds = 0, decode_seconds = 0;
  // Speculative decoding: steps that verified a draft, the draft tokens verified and those accepted, and the same
  // per draft position.
  uint64_t drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::vector<uint64_t> draft_tokens_per_pos, accepted_tokens_per_pos;
};

class Generator {
 public:
  // draft_model: for SpeculativeMethod::DraftModel (same vocabulary); assistant: for SpeculativeMethod::Assistant.
  Generator(const Gemma4Model& model, const Tokenizer* tokenizer, GenerationConfig generation,
            const Gemma4Model* draft_model = nullptr, const Gemma4Assistant* assistant = nullptr)
      : model_(model), tokenizer_(tokenizer), generation_(std::move(generation)), draft_model_(draft_model),
        assistant_(assistant) {}

  const GenerationConfig& generation_config() const { return generation_; }
  // Benchmarks only: every speculating run's drafter goes through `wrap` (EngineOptions::wrap_drafter).
  void wrap_drafters(DrafterWrapper wrap) { wrap_drafter_ = std::move(wrap); }

  // on_text receives each piece of text as soon as it is final.
  GenerationResult run(const GenerationRequest& request,
                       const std::function<void(std::string_view)>& on_text = {}) const;

 private:
  const Gemma4Model& model_;
  const Tokenizer* tokenizer_;
  GenerationConfig generation_;
  const Gemma4Model* draft_model_;
  const Gemma4Assistant* assistant_;
  DrafterWrapper wrap_drafter_;
};

}  // namespace qs
