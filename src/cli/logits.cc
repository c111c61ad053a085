// `qatserve logits`: the final logits at every position, written to a .safetensors file.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "formats/checkpoint_writer.h"
#include "model/gemma4_assistant.h"
#include "util/error.h"

namespace qs::cli {

namespace {

struct OutputTensor {
  TensorSpec spec;
  std::span<const std::byte> bytes;
};

// Writes the tensors (`tokens` I32 [T], `logits` F32 [T, vocab], ...) to one .safetensors file, whole or not at all.
void write_logits_file(const std::string& out, const std::vector<OutputTensor>& tensors) {
  std::filesystem::path dst(out), tmp_dir = dst.parent_path() / ("." + dst.filename().string() + ".dir");
  std::filesystem::remove_all(tmp_dir);
  {
    std::vector<TensorSpec> specs;
    for (const OutputTensor& t : tensors) specs.push_back(t.spec);
    CheckpointWriter w(tmp_dir, specs);
    while (const TensorSpec* next = w.current())
      for (const OutputTensor& t : tensors)
        if (t.spec.name == next->name) w.append(t.bytes);
    w.commit();
  }
  std::filesystem::rename(tmp_dir / "model.safetensors", dst);
  std::filesystem::remove_all(tmp_dir);
}

// An assistant's chain of greedy drafts after every position t of `ids`, fed ids[t + 1] (the last row: the target's
// argmax at T - 1) and the target's final-normed hidden state at t: [T, drafts, vocab].
std::vector<float> assistant_chains(const Gemma4Assistant& assistant, const KvCache& cache,
                                    std::span<const int32_t> ids, std::span<const float> logits,
                                    const std::vector<float>& target_hidden, int64_t drafts) {
  const int64_t T = ids.size(), V = assistant.config().text.vocab_size;
  std::vector<int32_t> fed(ids.begin() + 1, ids.end());
  const float* last = logits.data() + (T - 1) * V;
  fed.push_back(static_cast<int32_t>(std::max_element(last, last + V) - last));
  std::vector<int64_t> positions(T);
  std::iota(positions.begin(), positions.end(), 1);
  std::vector<float> chains(T * drafts * V), states = target_hidden;
  for (int64_t k = 0; k < drafts; ++k) {
    AssistantStep step = assistant.step(fed, states, positions, cache);
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(step.logits.data() + t * V, V, chains.data() + (t * drafts + k) * V);
    fed = std::move(step.tokens);
    states = std::move(step.states);
  }
  return chains;
}

}  // namespace

void add_logits(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("logits", "Write the final logits at every position of a token sequence");
  static std::string model_dir, tokens, messages, out, precision = "f32", kv_dtype, assistant_dir, lora_dir;
  static MediaFetchFlags fetch;
  cmd->add_option("--model", model_dir, "Checkpoint directory")->required();
  auto* t = cmd->add_option("--tokens", tokens, "Comma-separated token ids");
  cmd->add_option("--messages", messages, "Instead of --tokens: {\"messages\": [...]} (OpenAI chat format) rendered "
                                          "with the chat template and the generation prompt")
      ->excludes(t)
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", out, "Output .safetensors: 'tokens' I32 [T] and 'logits' F32 [T, vocab]")->required();
  cmd->add_option("--precision", precision, "f32 (reference), bf16 or int8 (opt-in W4A8, lossy)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  fetch.add_to(cmd);
  add_kv_dtype(cmd, kv_dtype);
  cmd->add_option("--assistant", assistant_dir, "Assistant drafter checkpoint: also writes 'assistant_logits' F32 [T, "
                                                "vocab] and 'assistant_chain' F32 [T, 4, vocab]")
      ->check(CLI::ExistingDirectory);
  add_lora_option(cmd, lora_dir);
  cmd->callback([&run] {
    run = [] {
      if (tokens.empty() && messages.empty()) throw Error("give the sequence as --tokens IDS or --messages FILE.json");
      auto model = load_gemma4(model_dir, precision, kv_dtype);
      auto lora = load_lora(lora_dir, *model);
      auto assistant = assistant_dir.empty() ? nullptr : Gemma4Assistant::load(assistant_dir, *model, true);
      MediaPrompt prompt;
      if (!messages.empty()) {
        Tokenizer tokenizer = Tokenizer::load(std::filesystem::path(model_dir) / "tokenizer.json");
        ChatOptions options;
        options.dialect = gemma4_chat_dialect_for_checkpoint(model_dir, model->config().text);
        prompt = messages_prompt(messages, tokenizer, options, *model, model_dir, fetch, lora.get());
      } else {
        prompt.tokens = parse_token_ids(tokens);
      }
      const std::vector<int32_t>& ids = prompt.tokens;
      const int64_t T = static_cast<int64_t>(ids.size()), vocab = model->config().text.vocab_size;
      // With an assistant every row drafts over its own prefix: the sliding layers keep every position.
      KvCache cache = model->new_cache(T, 0, assistant ? T + 1 : 0);
      const std::vector<SoftTokens> soft = prompt.soft_tokens();
      std::vector<float> hidden;
      const SequenceStep step{ids, &cache, LogitsWanted::All, soft, 0, assistant ? &hidden : nullptr, lora.get()};
      std::vector<float> logits = model->forward_batch(std::span(&step, 1));
      std::vector<OutputTensor> tensors{{{"tokens", DType::I32, {T}}, std::as_bytes(std::span(ids))},
                                        {{"logits", DType::F32, {T, vocab}}, std::as_bytes(std::span(logits))}};
      constexpr int64_t kDrafts = 4;
      std::vector<float> chains, first;
      if (assistant) {
        chains = assistant_chains(*assistant, cache, ids, logits, hidden, kDrafts);
        for (int64_t t = 0; t < T; ++t)
          first.insert(first.end(), chains.begin() + t * kDrafts * vocab, chains.begin() + (t * kDrafts + 1) * vocab);
        tensors.push_back({{"assistant_logits", DType::F32, {T, vocab}}, std::as_bytes(std::span(first))});
        tensors.push_back({{"assistant_chain", DType::F32, {T, kDrafts, vocab}}, std::as_bytes(std::span(chains))});
      }
      write_logits_file(out, tensors);
      fmt::print("wrote {}: tokens [{}], logits [{}, {}]{} ({} precision, {} weights)\n", out, T, T, vocab,
                 assistant ? fmt::format(", assistant_logits [{}, {}], assistant_chain [{}, {}, {}]", T, vocab, T,
                                         kDrafts, vocab)
                           : "",
                 precision, model->int4_weights() ? "int4" : "bf16");
      return 0;
    };
  });
}

}  // namespace qs::cli
