// `qatserve eval`: perplexity over a text and, against a reference run, KL / top-1 / logit differences.
#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/eval.h"
#include "util/error.h"

namespace qs::cli {

void add_eval(CLI::App& app, CommandRun& run) {
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

}  // namespace qs::cli
