// `qatserve generate`: text from one prompt, streamed as it is produced.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

#include "cli/commands.h"
#include "cli/model_options.h"

namespace qs::cli {

void add_generate(CLI::App& app, CommandRun& run) {
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
      req.lora = load_lora(lora_dir, *m.model);
      if (!tokens.empty()) {
        req.prompt = parse_token_ids(tokens);
      } else if (!messages.empty()) {
        MediaPrompt prompt = messages_prompt(messages, need_tokenizer(m, o.dir, "--messages"),
                                             chat_options(o.dir, *m.model, o.constraint()), *m.model, o.dir, fetch,
                                             req.lora.get());
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

}  // namespace qs::cli
