// qatserve: one binary, git-style subcommands over the qatserve library.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <numeric>

#include "checkpoint_tools/inspect.h"
#include "checkpoint_tools/merge_lora.h"
#include "checkpoint_tools/repack.h"
#include "checkpoint_tools/synth.h"
#include "checkpoint_tools/verify.h"
#include "formats/checkpoint_writer.h"
#include "media/media_fetch.h"
#include "engine/bench.h"
#include "engine/eval.h"
#include "engine/generator.h"
#include "engine/media_cache.h"
#include "engine/media_prompt.h"
#include "engine/memory_plan.h"
#include "model/gemma4.h"
#include "model/gemma4_assistant.h"
#include "model/lora_adapter.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/json_parse.h"
#include "util/file.h"
#include "util/interrupt.h"
#include "util/progress.h"

namespace {

constexpr const char* kPrecisionHelp =
    "bf16 (default), f32 (every activation in f32), or int8 (opt-in W4A8: the int4 linears take int8 activations; "
    "lossy, see `bench --precision int8` for its logit error)";

constexpr const char* kKvDtypeHelp =
    "KV cache dtype: bf16, int8 (lossy: codes and a scale per position and KV head, about half bf16's bytes; `bench "
    "--kv-dtype bf16,int8` prints its logit error) or f32 (default: f32 at --precision f32, else bf16)";


using namespace qs;

void add_kv_dtype(CLI::App* cmd, std::string& kv_dtype) {
  cmd->add_option("--kv-dtype", kv_dtype, kKvDtypeHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
}

// The model at --precision, its caches in --kv-dtype (empty: the precision's default).
std::unique_ptr<Gemma4Model> load_gemma4(const std::string& dir, const std::string& precision,
                                         const std::string& kv_dtype) {
  auto model = Gemma4Model::load(dir, parse_precision(precision), true);
  if (!kv_dtype.empty()) model->set_kv_dtype(parse_kv_dtype(kv_dtype));
  return model;
}

// `--lora DIR`: a PEFT LoRA adapter on the model (model/lora_adapter.h).
void add_lora_option(CLI::App* cmd, std::string& dir) {
  cmd->add_option("--lora", dir, "PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) "
                                 "applied on top of the model")
      ->check(CLI::ExistingDirectory);
}

std::shared_ptr<const LoraAdapter> load_lora(const std::string& dir, const Gemma4Model& model) {
  if (dir.empty()) return nullptr;
  auto adapter = LoraAdapter::load(dir, model, std::filesystem::path(dir).filename().string());
  fmt::print(stderr, "LoRA adapter {}: {} linears, rank up to {}, {}\n", dir, adapter->weights().size(),
             adapter->max_rank(), format_bytes(adapter->bytes()));
  return adapter;
}

void add_synth(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("synth", "Write a synthetic Gemma 4 checkpoint whose weights sit on the QAT grid");
  static SynthOptions o;
  static std::string format = "bf16", shard = "4G";
  static bool quiet = false;
  cmd->add_option("--preset", o.preset, "Model preset: " + fmt::format("{}", fmt::join(synth_preset_names(), ", ")));
  cmd->add_option("--config", o.config_file, "config.json to build instead of a preset")->check(CLI::ExistingFile);
  cmd->add_option("--format", format, "bf16 (-qat-q4_0-unquantized style) or w4a16 (-qat-w4a16-ct style)")
      ->check(CLI::IsMember({"bf16", "w4a16"}));
  cmd->add_option("--out", o.out, "Output directory (must not exist)")->required();
  cmd->add_option("--seed", o.seed, "Seed: the same seed writes the same bytes");
  cmd->add_option("--tokenizer", o.tokenizer_dir, "Directory whose files are copied into the checkpoint");
  cmd->add_option("--shard-size", shard, "Largest shard, e.g. 4G or 300M");
  // Callbacks, not a flag bound to the optional: unset must stay unset so the format decides.
  cmd->add_flag_callback("--lm-head", [] { o.lm_head = true; }, "Write a redundant lm_head.weight (default: w4a16 only)");
  cmd->add_flag_callback("--no-lm-head", [] { o.lm_head = false; }, "Never write lm_head.weight");
  cmd->add_flag_callback("--towers", [] { o.towers = true; }, "Write the vision/audio towers the config describes "
                         "(default: when it describes any)");
  cmd->add_flag_callback("--no-towers", [] { o.towers = false; }, "Write the text decoder only");
  cmd->add_flag("--towers-bf16", o.towers_bf16, "w4a16: keep the tower linears bf16 (on `ignore`), as a ct export may");
  cmd->add_flag("--towers-only", o.towers_only, "Write the towers and the config only, no text decoder");
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->add_option("--fault-off-grid", o.fault_off_grid, "Plant a group off the grid in this tensor");
  cmd->add_option("--fault-missing", o.fault_missing, "Leave this tensor out");
  cmd->add_flag("--fault-truncate", o.fault_truncate, "Cut the last shard short after writing");
  cmd->callback([&run] {
    run = [] {
      o.format = format == "w4a16" ? CheckpointFormat::W4A16 : CheckpointFormat::Bf16;
      o.max_shard_bytes = parse_byte_size(shard, "--shard-size");
      o.progress = !quiet;
      SynthResult r = synth_checkpoint(o);
      fmt::print("wrote {}: {} tensors, {} in {:.1f} s\n", o.out.string(), r.tensors, format_bytes(r.bytes), r.seconds);
      return 0;
    };
  });
}

void add_repack(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("repack", "Repack a bf16 QAT export into a lossless int4 W4A16 compressed-tensors checkpoint");
  static RepackOptions o;
  static std::string shard = "4G", grid = "lossless";
  static bool quiet = false;
  cmd->add_option("SRC", o.src, "bf16 QAT checkpoint directory")->required();
  cmd->add_option("DST", o.dst, "Output directory (must not exist)")->required();
  cmd->add_option("--shard-size", shard, "Largest output shard, e.g. 4G");
  cmd->add_option("--grid", grid, "lossless (default: the QAT step search), or LOSSY for comparison: textbook "
                  "(step amax/8) or ct-7.5 (compressed-tensors' amax/7.5 rule)")
      ->check(CLI::IsMember({"lossless", "textbook", "ct-7.5"}));
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->callback([&run] {
    run = [] {
      o.max_shard_bytes = parse_byte_size(shard, "--shard-size");
      o.progress = !quiet;
      o.grid = parse_repack_grid(grid);
      RepackReport r = repack_checkpoint(o);
      fmt::print("repacked {} -> {}: {} tensors quantized, {} copied, {} kept bf16; {} -> {} ({:.2f}x) in {:.1f} s\n",
                 o.src.string(), o.dst.string(), r.tensors_quantized, r.tensors_copied, r.kept.size(),
                 format_bytes(r.bytes_in), format_bytes(r.bytes_out), double(r.bytes_in) / r.bytes_out, r.seconds);
      for (const auto& k : r.kept) fmt::print("  kept bf16: {}: {}\n", k.name, k.reason);
      for (const auto& n : r.notes) fmt::print("  note: {}\n", n);
      fmt::print("report: {}/repack_report.json\n", o.dst.string());
      return 0;
    };
  });
}

void add_merge_lora(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("merge-lora", "Merge a PEFT LoRA adapter into a bf16 checkpoint (W + scale * B A, as "
                                               "PEFT's merge_and_unload)");
  static MergeLoraOptions o;
  static bool quiet = false;
  cmd->add_option("BASE", o.base, "bf16 QAT checkpoint directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("ADAPTER", o.adapter, "PEFT LoRA adapter directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("OUT", o.out, "Output directory (must not exist)")->required();
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->callback([&run] {
    run = [] {
      o.progress = !quiet;
      const MergeLoraResult r = merge_lora(o);
      fmt::print("merged {} into {} -> {}: {} linears merged, {} tensors, {} in {:.1f} s\n", o.adapter.string(),
                 o.base.string(), o.out.string(), r.merged, r.tensors, format_bytes(r.bytes), r.seconds);
      return 0;
    };
  });
}

void add_verify(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("verify", "Check, from disk, that DST is a lossless repack of SRC");
  static VerifyOptions o;
  static bool quiet = false;
  cmd->add_option("SRC", o.src, "bf16 QAT checkpoint")->required();
  cmd->add_option("DST", o.dst, "W4A16 checkpoint")->required();
  cmd->add_option("--show", o.max_failures_shown, "How many failures to print");
  cmd->add_flag("--allow-lossy", o.allow_lossy, "Exit 0 for a lossy repack (`repack --grid textbook|ct-7.5`) whose "
                "groups are nearest-level quantizations on their stored scales; the loss is still reported");
  cmd->add_flag("--quiet", quiet, "No progress output");
  cmd->callback([&run] {
    run = [] {
      o.progress = !quiet;
      VerifyResult r = verify_repack(o);
      fmt::print("verify {} against {}: {} quantized tensors ({} groups, {:.2f}% of values bit-identical), {} copied "
                 "tensors, in {:.1f} s\n",
                 o.dst.string(), o.src.string(), r.tensors_quantized, r.groups_checked,
                 r.values_checked ? 100.0 * r.values_bit_identical / r.values_checked : 100.0, r.tensors_copied,
                 r.seconds);
      for (const auto& f : r.first_failures) fmt::print("  FAIL {}\n", f);
      if (r.lossy_groups)
        fmt::print("LOSSY: {} of {} groups not reproduced (first: {}), largest |level x scale - value| {:.6g}{}\n",
                   r.lossy_groups, r.groups_checked, r.first_lossy, r.lossy_max_error,
                   o.allow_lossy ? "" : "; pass --allow-lossy to accept a lossy grid");
      if (r.failures) fmt::print("FAILED: {} problems\n", r.failures);
      else fmt::print("{}\n", r.lossy_groups == 0 ? "OK: lossless" : r.ok() ? "OK: lossy (allowed)" : "FAILED: lossy");
      return r.ok() ? 0 : 1;
    };
  });
}

void add_inspect(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("inspect", "Summarise and validate a checkpoint directory or .safetensors file");
  static InspectOptions o;
  static bool json = false;
  cmd->add_option("PATH", o.path, "Checkpoint directory or .safetensors file")->required();
  cmd->add_flag("--json", json, "Print the report as JSON");
  cmd->add_option("--samples", o.sample_groups, "Groups sampled per tensor in the grid scan");
  cmd->callback([&run] {
    run = [] {
      auto r = inspect_checkpoint(o);
      std::cout << (json ? r.dump(2) + "\n" : format_inspection(r));
      return 0;
    };
  });
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      throw Error(fmt::format("--tokens: '{}' is not a token id (expected comma-separated non-negative integers)", item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (ids.empty()) throw Error("--tokens: no token ids given");
  return ids;
}

// --allowed-media-domains and --media-fetch-timeout: image_url parts given as http(s) URLs (media/media_fetch.h).
struct MediaFetchFlags {
  std::string domains;
  double timeout_seconds = 10;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--allowed-media-domains", domains,
                    "Fetch http(s) image URLs from these hosts only: comma-separated, 'a.com' exactly, '*.b.org' "
                    "its subdomains, '*' any; loopback/private addresses only for hosts listed exactly (default: "
                    "none, URLs are refused)");
    cmd->add_option("--media-fetch-timeout", timeout_seconds,
                    "Seconds one image URL may take, redirects and body included (default 10)")
        ->check(CLI::PositiveNumber);
  }
  media::MediaFetchOptions options() const {
    media::MediaFetchOptions o;
    o.allowed_hosts = media::parse_allowed_media_hosts(domains);
    o.timeout = std::chrono::milliseconds(std::llround(timeout_seconds * 1000));
    return o;
  }
};

// `--messages FILE.json`: {"messages": [...]} in the OpenAI chat format (the server's parser), rendered with the
// checkpoint's chat template and the generation prompt, as the server renders a chat request. Image and audio parts
// (data URLs, or http(s) URLs of allowed hosts) go through the checkpoint's towers, loaded only when the messages hold media.
MediaPrompt messages_prompt(const std::string& file, const Tokenizer& tokenizer, const ChatOptions& options,
                            const Gemma4Model& model, const std::string& model_dir, const MediaFetchFlags& fetch) {
  try {
    nlohmann::json body = read_json_file(file, kMaxRequestJsonDepth);
    if (!body.is_object() || !body.contains("messages"))
      throw Error("expected a JSON object {\"messages\": [...]} (OpenAI chat messages)");
    MediaOptions media_options;
    media_options.images = model.config().has_vision;
    media_options.audio = model.config().has_audio;
    media_options.fetch = fetch.options();
    std::vector<media::MediaInput> media;
    std::vector<ChatMessage> messages = parse_chat_messages(body["messages"], media_options, media);
    std::vector<int32_t> tokens = tokenizer.encode(render_gemma4_chat(messages, options));
    if (media.empty()) return {std::move(tokens), {}};
    return expand_media_prompt(tokens, media, MediaTowers::load(model, model_dir), tokenizer);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--messages {}: not valid JSON: {}", file, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("--messages {}: {}", file, e.what()));
  }
}

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

void add_logits(CLI::App& app, std::function<int()>& run) {
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
        prompt = messages_prompt(messages, tokenizer, options, *model, model_dir, fetch);
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

// `eval`: perplexity over a text and, against a reference run, KL / top-1 / logit differences (engine/eval.h).
void add_eval(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("eval", "Perplexity over a held-out text; KL, top-1 agreement and logit differences "
                                         "against a reference run");
  static std::string model_dir, text_file, tokens_file, precision = "bf16", reference_dir, reference_precision, json;
  static std::string kv_dtype, reference_kv_dtype;
  static std::optional<int64_t> context;
  cmd->add_option("--model", model_dir, "Checkpoint directory")->required();
  auto* t = cmd->add_option("--text", text_file, "Text file, tokenized with the checkpoint's tokenizer.json (BOS added)")
                ->check(CLI::ExistingFile);
  cmd->add_option("--tokens", tokens_file, "Instead of --text: token ids separated by commas or whitespace (no BOS)")
      ->check(CLI::ExistingFile)->excludes(t);
  cmd->add_option("--precision", precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--reference-precision", reference_precision,
                  "Compare with a run at this precision (of --reference-model, or else of --model)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--reference-model", reference_dir,
                  "Compare with this checkpoint (same tokenizer), at --reference-precision or else --precision");
  add_kv_dtype(cmd, kv_dtype);
  cmd->add_option("--reference-kv-dtype", reference_kv_dtype,
                  "Compare with a run whose KV cache has this dtype (of --reference-model, or else of --model)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--context", context, "Tokens per window (default: the model's maximum or 2048, the smaller)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--json", json, "Also write every number as JSON to this file");
  cmd->callback([&run] {
    run = [] {
      if (text_file.empty() && tokens_file.empty()) throw Error("give the held-out text as --text FILE or --tokens FILE");
      auto model = load_gemma4(model_dir, precision, kv_dtype);
      std::vector<int32_t> text;
      if (!tokens_file.empty()) {
        text = read_token_file(tokens_file);
      } else {
        auto tok = std::filesystem::path(model_dir) / "tokenizer.json";
        if (!std::filesystem::exists(tok)) throw Error(fmt::format("{}: no tokenizer.json, which --text needs "
                                                                   "(or give --tokens)", model_dir));
        std::ifstream in(text_file);
        text = Tokenizer::load(tok).encode(std::string(std::istreambuf_iterator<char>(in), {}));
      }
      std::unique_ptr<Gemma4Model> reference;
      EvalLabels labels{fmt::format("{} ({} activations, {} weights, {} KV)", model_dir, precision,
                                    model->int4_weights() ? "int4" : "bf16", kv_dtype_name(model->kv_dtype()))};
      if (!reference_dir.empty() || !reference_precision.empty() || !reference_kv_dtype.empty()) {
        std::string dir = reference_dir.empty() ? model_dir : reference_dir;
        std::string p = reference_precision.empty() ? precision : reference_precision;
        reference = load_gemma4(dir, p, reference_kv_dtype);
        labels.reference = fmt::format("{} ({} activations, {} weights, {} KV)", dir, p,
                                       reference->int4_weights() ? "int4" : "bf16",
                                       kv_dtype_name(reference->kv_dtype()));
      }
      EvalOptions o;
      o.context = context.value_or(std::min<int64_t>(model->config().text.max_position_embeddings_or(2048), 2048));
      o.bos_token_id = static_cast<int32_t>(model->config().text.bos_token_id);
      EvalReport r = run_eval(text, *model, reference.get(), o, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
      std::cout << format_eval_report(r, labels);
      if (!json.empty()) {
        std::ofstream out(json);
        out << eval_report_json(r, labels).dump(2) << "\n";
        if (!out) throw Error(fmt::format("--json: cannot write {}", json));
      }
      return 0;
    };
  });
}

// Speculative decoding flags of generate, chat and serve (engine/speculative.h).
// bench takes a list of --num-speculative-tokens (one row each): token_list receives it.
void add_speculative_options(CLI::App* cmd, std::string& method, SpeculativeConfig& c, std::string& draft_model,
                             std::string& assistant, std::string* token_list = nullptr) {
  cmd->add_option("--speculative", method, "Speculative decoding: none (default), ngram (prompt lookup), draft_model "
                  "(needs --draft-model) or assistant (needs --assistant); the output is exactly the same, only faster")
      ->check(CLI::IsMember({"none", "ngram", "draft_model", "assistant"}));
  if (token_list)
    cmd->add_option("--num-speculative-tokens", *token_list,
                    fmt::format("Draft tokens per round, comma-separated: one row each (default 4, at most {})",
                                kMaxSpeculativeTokens));
  else
    cmd->add_option("--num-speculative-tokens", c.num_speculative_tokens,
                    fmt::format("Draft tokens verified per step (default 4, at most {})", kMaxSpeculativeTokens))
        ->check(CLI::Range(int64_t{1}, kMaxSpeculativeTokens));
  cmd->add_option("--prompt-lookup-min", c.prompt_lookup_min, "ngram: shortest suffix looked up (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--prompt-lookup-max", c.prompt_lookup_max, "ngram: longest suffix looked up (default 4)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--draft-model", draft_model, "A smaller Gemma 4 of the same vocabulary drafting for the model "
                  "(implies --speculative draft_model)")->check(CLI::ExistingDirectory);
  cmd->add_option("--assistant", assistant, "A Gemma 4 assistant drafter checkpoint for the model (implies "
                  "--speculative assistant)")->check(CLI::ExistingDirectory);
}

// --speculative, with --assistant meaning assistant and --draft-model draft_model unless a method is named.
SpeculativeConfig speculative_config_of(const std::string& method, SpeculativeConfig c, const std::string& draft_model,
                                        const std::string& assistant) {
  c.method = method != "none"        ? parse_speculative_method(method)
             : !assistant.empty()    ? SpeculativeMethod::Assistant
             : !draft_model.empty()  ? SpeculativeMethod::DraftModel
                                     : SpeculativeMethod::None;
  if (c.enabled()) c.validate();
  return c;
}

// The chat template's options for `generate --chat` and `chat`: the checkpoint's dialect, and the tools of --tools
// declared in the system turn as the template declares them (so the model is told what it is made to call).
ChatOptions chat_options(const std::string& dir, const Gemma4Model& model, const ConstraintSpec& constraint) {
  ChatOptions co;
  co.dialect = gemma4_chat_dialect_for_checkpoint(dir, model.config().text);
  for (const ToolSpec& t : constraint.tools) co.tools.push_back({t.name, t.description, t.parameters});
  return co;
}

// What `generate` and `chat` share: the model, its tokenizer (when the checkpoint has one) and sampling flags.
struct ModelOptions {
  std::string dir, precision = "bf16", kv_dtype;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string json_schema, tools;
  std::string speculative = "none", draft_model, assistant;
  SpeculativeConfig speculation;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--model", dir, "Checkpoint directory")->required();
    cmd->add_option("--precision", precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
    add_kv_dtype(cmd, kv_dtype);
    cmd->add_option("--max-tokens", max_tokens, "Most tokens to generate");
    cmd->add_option("--temperature", temperature, "0 = greedy (default: generation_config.json)");
    cmd->add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)");
    cmd->add_option("--top-p", top_p, "Nucleus sampling mass");
    cmd->add_option("--min-p", min_p, "Drop tokens below min_p x the top probability");
    cmd->add_option("--seed", seed, "Seed for reproducible sampling");
    cmd->add_option("--stop", stop, "Stop string (repeatable)");
    cmd->add_flag("--ignore-eos", ignore_eos, "Generate past end-of-sequence tokens, up to --max-tokens");
    auto* schema = cmd->add_option("--json-schema", json_schema, "Constrain the output to JSON valid against this "
                                   "JSON Schema file")->check(CLI::ExistingFile);
    cmd->add_option("--tools", tools, "Constrain the output to Gemma 4 tool calls (tool_choice required) of this JSON "
                    "array of OpenAI tools")->check(CLI::ExistingFile)->excludes(schema);
    add_speculative_options(cmd, speculative, speculation, draft_model, assistant);
  }
  SpeculativeConfig speculative_config() const {
    return speculative_config_of(speculative, speculation, draft_model, assistant);
  }
  // The output constraint the flags ask for (none by default).
  ConstraintSpec constraint() const {
    ConstraintSpec spec;
    if (!json_schema.empty()) {
      spec.kind = ConstraintSpec::Kind::JsonSchema;
      spec.schema = read_json_file<nlohmann::ordered_json>(json_schema, kMaxRequestJsonDepth);  // declared order
    } else if (!tools.empty()) {
      spec.kind = ConstraintSpec::Kind::ToolCalls;
      const nlohmann::json list = read_json_file(tools, kMaxRequestJsonDepth);
      if (!list.is_array()) throw Error(fmt::format("{}: expected a JSON array of tools", tools));
      for (const auto& t : list) {
        const auto& f = t.contains("function") ? t["function"] : t;
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
          throw Error(fmt::format("{}: every tool needs function.name", tools));
        spec.tools.push_back({f["name"].get<std::string>(), f.value("description", ""),
                              f.value("parameters", nlohmann::json::object())});
      }
    }
    return spec;
  }
  SamplingParams sampling_from(const GenerationConfig& g) const {
    SamplingParams p = g.default_sampling();
    if (temperature) p.temperature = *temperature;
    if (top_k) p.top_k = *top_k;
    if (top_p) p.top_p = *top_p;
    if (min_p) p.min_p = *min_p;
    if (seed) p.seed = *seed;
    return p;
  }
};

struct LoadedModel {
  std::unique_ptr<Gemma4Model> model;
  std::optional<Tokenizer> tokenizer;
  GenerationConfig generation;
  std::unique_ptr<Gemma4Model> draft_model;    // --draft-model
  std::unique_ptr<Gemma4Assistant> assistant;  // --assistant
  Generator generator() const {
    return Generator(*model, tokenizer ? &*tokenizer : nullptr, generation, draft_model.get(), assistant.get());
  }
};

LoadedModel load_model(const ModelOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel m{load_gemma4(o.dir, o.precision, o.kv_dtype), std::nullopt, read_generation_config(o.dir)};
  std::filesystem::path tok = std::filesystem::path(o.dir) / "tokenizer.json";
  if (std::filesystem::exists(tok)) m.tokenizer = Tokenizer::load(tok);
  if (!o.draft_model.empty()) m.draft_model = Gemma4Model::load(o.draft_model, parse_precision(o.precision), true);
  if (!o.assistant.empty()) m.assistant = Gemma4Assistant::load(o.assistant, *m.model, true);
  make_drafter(o.speculative_config(), *m.model, m.draft_model.get(), 1, m.assistant.get());  // what is missing
  fmt::print(stderr, "loaded {} ({} weights, {} activations, {} KV, {}) in {:.2f} s\n", o.dir,
             m.model->int4_weights() ? "int4" : "bf16", o.precision, kv_dtype_name(m.model->kv_dtype()),
             format_bytes(m.model->weight_bytes()),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return m;
}

const Tokenizer& need_tokenizer(const LoadedModel& m, const std::string& dir, const char* why) {
  if (!m.tokenizer) throw Error(fmt::format("{}: no tokenizer.json, which {} needs", dir, why));
  return *m.tokenizer;
}

void print_speed(const GenerationResult& r, size_t prompt_tokens) {
  std::string speculation;
  if (r.draft_tokens > 0) {
    speculation = fmt::format("; speculative: {} of {} draft tokens accepted ({:.1f}%), by draft position:",
                              r.accepted_tokens, r.draft_tokens, 100.0 * r.accepted_tokens / r.draft_tokens);
    for (size_t i = 0; i < r.draft_tokens_per_pos.size(); ++i)
      speculation += fmt::format(" {}/{}", r.accepted_tokens_per_pos.size() > i ? r.accepted_tokens_per_pos[i] : 0,
                                 r.draft_tokens_per_pos[i]);
  }
  fmt::print(stderr, "\n[{} prompt tokens, {:.1f} tokens/s prefill; {} generated, {:.1f} tokens/s decode; finish: {}{}]\n",
             prompt_tokens, r.prefill_seconds > 0 ? prompt_tokens / r.prefill_seconds : 0.0, r.tokens.size(),
             r.decode_seconds > 0 && r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0.0, r.finish_reason,
             speculation);
}

void add_generate(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams it as it is produced)");
  static ModelOptions o;
  static std::string prompt, tokens, messages;
  static bool chat = false, print_ids = false;
  static MediaFetchFlags fetch;
  static std::string lora_dir;
  o.add_to(cmd);
  add_lora_option(cmd, lora_dir);
  auto* p = cmd->add_option("--prompt", prompt, "Prompt text");
  auto* t = cmd->add_option("--tokens", tokens, "Prompt as comma-separated token ids")->excludes(p);
  cmd->add_option("--messages", messages, "Prompt as {\"messages\": [...]} (OpenAI chat format), rendered with the "
                                          "chat template and the generation prompt")
      ->excludes(p)
      ->excludes(t)
      ->check(CLI::ExistingFile);
  cmd->add_flag("--chat", chat, "Wrap the prompt in the model's chat template as a user turn");
  cmd->add_flag("--print-ids", print_ids, "Print the generated token ids, comma-separated, instead of text");
  fetch.add_to(cmd);
  cmd->callback([&run] {
    run = [] {
      LoadedModel m = load_model(o);
      GenerationRequest req;
      if (!tokens.empty()) {
        req.prompt = parse_token_ids(tokens);
      } else if (!messages.empty()) {
        MediaPrompt prompt = messages_prompt(messages, need_tokenizer(m, o.dir, "--messages"),
                                             chat_options(o.dir, *m.model, o.constraint()), *m.model, o.dir, fetch);
        req.prompt = std::move(prompt.tokens);
        req.media = std::move(prompt.spans);
      } else {
        const Tokenizer& tok = need_tokenizer(m, o.dir, "--prompt");
        std::string text = prompt;
        if (chat) {
          ChatMessage msg{"user", prompt};
          text = render_gemma4_chat(std::span(&msg, 1), chat_options(o.dir, *m.model, o.constraint()));
        } else {
          req.prompt.push_back(m.generation.bos_token_id);
        }
        auto ids = tok.encode(text);
        req.prompt.insert(req.prompt.end(), ids.begin(), ids.end());
      }
      req.max_tokens = o.max_tokens;
      req.sampling = o.sampling_from(m.generation);
      req.stop = o.stop;
      req.ignore_eos = o.ignore_eos;
      req.constraint = o.constraint();
      req.speculative = o.speculative_config();
      req.lora = load_lora(lora_dir, *m.model);
      const Generator gen = m.generator();
      auto stream = [](std::string_view piece) {
        if (!print_ids) {
          fmt::print("{}", piece);
          std::fflush(stdout);
        }
      };
      GenerationResult r = gen.run(req, stream);
      if (print_ids) {
        std::vector<int32_t> ids;
        for (const auto& t : r.tokens) ids.push_back(t.id);
        fmt::print("{}\n", fmt::join(ids, ","));
      }
      print_speed(r, req.prompt.size());
      return 0;
    };
  });
}

// `chat`'s images and clips: `/image PATH` and `/audio PATH` lines attach a file to the next user message. The
// checkpoint's towers load at the first one; each item is encoded once (the conversation is rendered whole every
// turn, so earlier turns' media come from the cache).
class ChatMedia {
 public:
  ChatMedia(const Gemma4Model& model, std::string dir) : model_(model), dir_(std::move(dir)) {}

  // True when `line` was a media command (the file is then attached, or an error printed).
  bool command(const std::string& line) {
    const bool image = line.starts_with("/image "), audio = line.starts_with("/audio ");
    if (!image && !audio) return false;
    const std::string path = line.substr(7);
    try {
      const media::MediaKind kind = image ? media::MediaKind::Image : media::MediaKind::Audio;
      if (image ? !model_.config().has_vision : !model_.config().has_audio)
        throw Error(fmt::format("this model has no {} tower", image ? "vision" : "audio"));
      inputs_.push_back({kind, read_file(path), "", line});
      pending_.push_back(image ? ChatContentPart::Kind::Image : ChatContentPart::Kind::Audio);
      fmt::print(stderr, "[{} attached to the next message]\n", path);
    } catch (const Error& e) {
      fmt::print(stderr, "{}: {}\n", line, e.what());
    }
    return true;
  }

  // The user message of `text` with the media attached since the last one.
  ChatMessage user_message(const std::string& text) {
    ChatMessage msg{"user", text};
    if (pending_.empty()) return msg;
    for (ChatContentPart::Kind kind : pending_) msg.parts.push_back({kind, ""});
    msg.parts.push_back({ChatContentPart::Kind::Text, text});
    pending_.clear();
    return msg;
  }

  // The conversation's prompt tokens and soft tokens.
  MediaPrompt prompt(std::vector<int32_t> tokens, const Tokenizer& tokenizer) {
    if (inputs_.empty()) return {std::move(tokens), {}};
    if (!towers_) towers_ = MediaTowers::load(model_, dir_);
    MediaPrompt p = prepare_media_prompt(tokens, inputs_, *towers_, tokenizer);
    for (MediaSpan& span : p.spans) {
      if (const std::vector<float>* cached = encoded_.find(span.key)) {
        span.embeddings = *cached;
        continue;
      }
      encode_media_span(span, *towers_);
      encoded_.insert(span.key, span.embeddings);
    }
    return p;
  }

  // A turn that failed: its media are not part of the conversation.
  void drop_last(size_t count) { inputs_.resize(inputs_.size() - count); }

 private:
  const Gemma4Model& model_;
  std::string dir_;
  std::vector<media::MediaInput> inputs_;           // every item of the conversation, in order
  std::vector<ChatContentPart::Kind> pending_;      // attached to the next user message
  std::optional<MediaTowers> towers_;
  MediaEmbeddingCache encoded_{uint64_t{1} << 30};  // a conversation's media: all of them
};

void add_chat(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("chat", "Interactive multi-turn chat on stdin (an empty line or EOF ends it; "
                                         "`/image PATH`, `/audio PATH` attach a file to the next message)");
  static ModelOptions o;
  static std::string system;
  o.add_to(cmd);
  cmd->add_option("--system", system, "System prompt");
  cmd->callback([&run] {
    run = [] {
      LoadedModel m = load_model(o);
      const Tokenizer& tok = need_tokenizer(m, o.dir, "chat");
      const Generator gen = m.generator();
      const ConstraintSpec constraint = o.constraint();
      const ChatOptions co = chat_options(o.dir, *m.model, constraint);
      std::vector<ChatMessage> history;
      if (!system.empty()) history.push_back({"system", system});
      ChatMedia media(*m.model, o.dir);
      std::string line;
      while (fmt::print("> "), std::fflush(stdout), std::getline(std::cin, line) && !line.empty()) {
        if (media.command(line)) continue;
        history.push_back(media.user_message(line));
        GenerationRequest req;
        try {
          MediaPrompt prompt = media.prompt(tok.encode(render_gemma4_chat(history, co)), tok);
          req.prompt = std::move(prompt.tokens);
          req.media = std::move(prompt.spans);
        } catch (const Error& e) {  // a file that does not decode: say so, and leave it out of the conversation
          fmt::print(stderr, "{}\n", e.what());
          size_t items = 0;
          for (const ChatContentPart& part : history.back().parts) items += part.kind != ChatContentPart::Kind::Text;
          media.drop_last(items);
          history.pop_back();
          continue;
        }
        req.max_tokens = o.max_tokens;
        req.sampling = o.sampling_from(m.generation);
        req.stop = o.stop;
        req.ignore_eos = o.ignore_eos;
        req.constraint = constraint;
        req.speculative = o.speculative_config();
        GenerationResult r = gen.run(req, [](std::string_view piece) {
          fmt::print("{}", piece);
          std::fflush(stdout);
        });
        print_speed(r, req.prompt.size());
        history.push_back({"assistant", r.text});
      }
      return 0;
    };
  });
}

// `plan`: exit 0 when at least one context of --context tokens fits on the device, 3 when not (the report says
// by how much), 1 on bad input.
void add_plan(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("plan", "Plan device memory: weights by class, runtime reserve, KV cache, contexts that fit");
  cmd->footer("Exit status: 0 when a context of --context tokens fits, 3 when it does not, 1 on bad input.");
  static std::string model_dir, config_file, preset, device, kv_dtype = "bf16", weights;
  static int64_t context = 8192;
  static bool json = false;
  auto* m = cmd->add_option("--model", model_dir, "Checkpoint directory: weights counted from its files");
  auto* c = cmd->add_option("--config", config_file, "config.json to plan from")->excludes(m);
  cmd->add_option("--preset", preset, "Model preset: " + fmt::format("{}", fmt::join(synth_preset_names(), ", ")))
      ->excludes(m)->excludes(c);
  cmd->add_option("--device", device, "tpu-v5e, tpu-v6e, l4, h100, h200, cpu (this machine's RAM) or a size like 48G")
      ->required();
  cmd->add_option("--kv-dtype", kv_dtype, "KV cache dtype as the engine stores it: bf16 (default), int8 (codes and a "
                  "scale per position and KV head) or f32")->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--context", context, "Tokens per sequence (default 8192)")->check(CLI::PositiveNumber);
  cmd->add_option("--weights", weights, "bf16 or w4a16, with --config/--preset (default: w4a16 when the config has a "
                  "quantization_config, else bf16)")->check(CLI::IsMember({"bf16", "w4a16"}))->excludes(m);
  cmd->add_flag("--json", json, "Print the plan as JSON");
  cmd->callback([&run] {
    run = [] {
      if (model_dir.empty() && config_file.empty() && preset.empty())
        throw Error("give the model as --model DIR, --config FILE or --preset NAME");
      ModelConfig config;
      WeightBytes w;
      std::string label;
      if (!model_dir.empty()) {
        Checkpoint ckpt = Checkpoint::open(model_dir);
        auto cfg = ckpt.config_path();
        if (!cfg) throw Error(fmt::format("{}: no config.json, which plan needs for the architecture", model_dir));
        config = read_model_config(*cfg);
        w = weight_bytes_from_checkpoint(ckpt, config);
        label = "checkpoint " + model_dir;
      } else {
        config = preset.empty() ? read_model_config(config_file) : parse_model_config(preset_config_text(preset), "preset " + preset);
        auto format = !weights.empty() ? parse_weight_format(weights)
                      : config.quantization ? WeightFormat::W4A16 : WeightFormat::Bf16;
        w = weight_bytes_from_config(config, format);
        label = preset.empty() ? "config " + config_file : "preset " + preset;
      }
      PlanOptions o;
      o.device = resolve_device(device);
      o.kv_dtype = parse_kv_dtype(kv_dtype);
      MemoryPlan plan = plan_memory(config, w, o);
      std::cout << (json ? memory_plan_json(plan, context, label).dump(2) + "\n" : format_memory_plan(plan, context, label));
      return plan.contexts_that_fit(context) > 0 ? 0 : 3;
    };
  });
}

void add_bench(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("bench", "Prefill and decode tokens/s beside bytes read per token and measured memory "
                                 "bandwidth; with --speculative, decoding with a drafter against plain decoding");
  static BenchOptions o;
  static std::string model_dir, prompts = "128,512,2048", streams = "1,4,8", depths = "0,4096", sweep = "2G", json;
  static std::string paired_sweep = "0";
  static std::string kv_dtypes, fill = "prefill";
  cmd->add_option("--model", model_dir, "Checkpoint directory")->required();
  cmd->add_option("--prompts", prompts, "Prefill lengths, comma-separated (default 128,512,2048)");
  cmd->add_option("--streams", streams, "Sequences decoded together, comma-separated (default 1,4,8)");
  cmd->add_option("--depths", depths, "Cached positions before decoding, comma-separated (default 0,4096)");
  cmd->add_option("--decode-tokens", o.decode_tokens, "Timed decode steps per row (default 32)")->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "Prompt tokens per forward call (default 512)")->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", o.repeat, "Runs per row, median reported (default 1)")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o.threads, "Threads (default: one per core)");
  cmd->add_option("--sweep-size", sweep, "Bandwidth sweep buffer, far past the L3 (default 2G)");
  cmd->add_option("--paired-sweep", paired_sweep, "Also read a buffer of this size (e.g. 256M, past the L3) after "
                  "every timed decode step and report each row's bytes/s against those sweeps, step by step: a "
                  "ratio of one moment on a host whose bandwidth moves (default 0: off)");
  cmd->add_option("--precision", o.precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--kv-dtype", kv_dtypes,
                  "KV cache dtype(s), comma-separated, e.g. bf16,int8: every row once per dtype, the runs alternating "
                  "(A, B, A, B), and each dtype but the precision's default gets its logit error against it "
                  "(default: the precision's, bf16 or f32)");
  cmd->add_option("--kv-error-positions", o.kv_error_positions, "Prompt length of that logit comparison (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--fill", fill, "How depth rows fill their caches: prefill (the model's K/V, default) or random "
                  "(random K/V rows: the same decode work, without a long prefill)")
      ->check(CLI::IsMember({"prefill", "random"}));
  cmd->add_option("--isa", o.isa, "Instruction set of every kernel (linears, attention, gelu/tanh, norms): avx512, avx2 or portable (default: the widest this CPU has)")
      ->check(CLI::IsMember({"avx512", "avx2", "portable"}));
  cmd->add_option("--json", json, "Also write the report as JSON to this file");
  static std::string speculative = "none", spec_tokens = "4", draft_model, assistant;
  add_speculative_options(cmd, speculative, o.speculative, draft_model, assistant, &spec_tokens);
  cmd->add_option("--speculative-prompt", o.speculative_prompt, "--speculative: prompt tokens (one 32-token segment "
                  "repeated, default 128)")->check(CLI::PositiveNumber);
  cmd->add_option("--draft-acceptance", o.draft_acceptance, "--speculative: script the drafts' agreement, to "
                  "measure speed at an acceptance random weights never reach: the drafter runs, then each draft "
                  "token is plain greedy's token at its position with this probability (0 to 1), else another")
      ->check(CLI::Range(0.0, 1.0));
  cmd->callback([&run] {
    run = [] {
      o.model = model_dir;
      o.speculative = speculative_config_of(speculative, o.speculative, draft_model, assistant);
      o.speculative_tokens = parse_count_list(spec_tokens, "--num-speculative-tokens");
      o.draft_model = draft_model;
      o.assistant = assistant;
      o.prompts = prompts.empty() ? std::vector<int64_t>{} : parse_count_list(prompts, "--prompts");
      o.streams = streams.empty() ? std::vector<int64_t>{} : parse_count_list(streams, "--streams");
      o.depths = depths.empty() ? std::vector<int64_t>{} : parse_count_list(depths, "--depths", /*allow_zero=*/true);
      o.sweep_bytes = parse_byte_size(sweep, "--sweep-size");
      o.paired_sweep_bytes = paired_sweep == "0" ? 0 : parse_byte_size(paired_sweep, "--paired-sweep");
      o.kv_dtypes.clear();
      for (size_t pos = 0; !kv_dtypes.empty();) {
        const size_t comma = kv_dtypes.find(',', pos);
        const std::string name = kv_dtypes.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        parse_kv_dtype(name);  // throws naming the accepted ones
        o.kv_dtypes.push_back(name);
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      o.random_fill = fill == "random";
      BenchReport r = run_bench(o, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
      std::cout << format_bench_report(r);
      if (!json.empty()) write_bench_json(r, json);
      return 0;
    };
  });
}

void add_serve(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API (SIGINT/SIGTERM drain and exit)");
  static ServeOptions o;
  static std::string model_dir, kv_memory, api_key_file;
  static double drain_seconds = 10, header_seconds = 10, body_seconds = 30;
  static MediaFetchFlags fetch;
  static uint64_t media_cache_mb = o.media_cache_bytes >> 20;
  static size_t responses_max_mb = o.responses_max_bytes >> 20;
  cmd->add_option("--model", model_dir, "Checkpoint directory (with tokenizer.json)")->required();
  cmd->add_option("--host", o.host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", o.port, "Port (default 8000)")->check(CLI::Range(1, 65535));
  cmd->add_option("--served-model-name", o.served_model_name,
                  "The model id clients send and /v1/models lists; requests naming another get 404 (default: the "
                  "model directory's name, and any name is served)");
  cmd->add_option("--max-model-len", o.max_model_len,
                  "Context cap per request, prompt + max_tokens (default: the model's, at most what the KV pool holds)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o.threads, "Compute threads (default: one per core)")->check(CLI::PositiveNumber);
  auto* key = cmd->add_option("--api-key", o.api_key,
                              "Require 'Authorization: Bearer KEY' (all routes but /health and the page). Visible "
                              "to every user through `ps`: prefer --api-key-file or $QATSERVE_API_KEY");
  cmd->add_option("--api-key-file", api_key_file, "Read the API key from the first line of this file (e.g. a mounted "
                  "secret)")->excludes(key);
  cmd->add_option("--log-format", o.log_format, "text (default) or json: one JSON object per line, for log collectors")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag_callback("--no-ui", [] { o.ui = false; }, "Do not serve the chat page on GET / (then / is 404)");
  cmd->add_option("--max-running", o.max_running, "Sequences decoded together (default 16)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-waiting", o.max_waiting, "Queued sequences before answering 429 (default 64)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--precision", o.precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
  add_kv_dtype(cmd, o.kv_dtype);
  cmd->add_option("--kv-memory", kv_memory, "KV cache pool, e.g. 512M or 4G (default: from `plan --device cpu`)");
  cmd->add_option("--media-cache-mb", media_cache_mb,
                  "MiB of encoded images' and clips' soft tokens kept (least recently used out), so media seen again "
                  "skip their tower (default 64; 0 = off)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  cmd->add_option("--responses-max-entries", o.responses_max_entries,
                  "Responses (POST /v1/responses, store: true) kept in memory for previous_response_id and GET "
                  "/v1/responses/{id}, least recently used out (default 1000; 0 = none kept)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--responses-max-mb", responses_max_mb,
                  "MiB of kept responses' JSON at most, least recently used out (default 64)")
      ->check(CLI::Range(size_t{0}, size_t{1} << 20));
  cmd->add_option("--drain-timeout", drain_seconds,
                  "Seconds SIGINT/SIGTERM lets running and queued requests finish before aborting them (default 10)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-connections", o.max_connections,
                  "Connections held at once, idle ones included; past it a new one gets 503 and is closed (default "
                  "4096, at most what the open-file limit allows)")->check(CLI::PositiveNumber);
  cmd->add_option("--header-timeout", header_seconds,
                  "Seconds a client has to send a request's header, or to start the next one on a kept-alive "
                  "connection, before it is closed (default 10)")->check(CLI::PositiveNumber);
  cmd->add_option("--body-timeout", body_seconds,
                  "Seconds a client has to send a request's body after its header before it is closed (default 30)")
      ->check(CLI::PositiveNumber);
  fetch.add_to(cmd);
  static std::string speculative = "none", draft_model, assistant;
  static SpeculativeConfig speculation;
  add_speculative_options(cmd, speculative, speculation, draft_model, assistant);
  cmd->callback([&run] {
    run = [] {
      o.speculative = speculative_config_of(speculative, speculation, draft_model, assistant);
      o.draft_model = draft_model;
      o.assistant = assistant;
      o.model_dir = model_dir;
      o.media_fetch = fetch.options();
      o.api_key = resolve_api_key(o.api_key, api_key_file, std::getenv("QATSERVE_API_KEY"));
      o.drain_grace = std::chrono::milliseconds(std::llround(drain_seconds * 1000));
      o.header_timeout = std::chrono::milliseconds(std::llround(header_seconds * 1000));
      o.body_timeout = std::chrono::milliseconds(std::llround(body_seconds * 1000));
      if (!kv_memory.empty()) o.kv_memory = parse_byte_size(kv_memory, "--kv-memory");
      o.media_cache_bytes = media_cache_mb << 20;
      o.responses_max_bytes = responses_max_mb << 20;
      return run_server(o);
    };
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qatserve: engine, server and toolchain for Gemma 4 QAT checkpoints"};
  app.require_subcommand(0, 1);
  std::function<int()> run;
  auto* help = app.add_subcommand("help", "Show the commands");
  add_synth(app, run);
  add_repack(app, run);
  add_merge_lora(app, run);
  add_verify(app, run);
  add_inspect(app, run);
  add_logits(app, run);
  add_eval(app, run);
  add_generate(app, run);
  add_chat(app, run);
  add_plan(app, run);
  add_serve(app, run);
  add_bench(app, run);
  const std::string usage = app.help();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!run || help->parsed()) {
    std::cout << usage;
    return argc > 1 && !help->parsed() ? 2 : 0;
  }
  install_interrupt_handlers();
  try {
    return run();
  } catch (const std::exception& e) {
    std::string name = app.get_subcommands().empty() ? "qatserve" : "qatserve " + app.get_subcommands()[0]->get_name();
    fmt::print(stderr, "\n{}: error: {}\n", name, e.what());
    return 1;
  }
}
