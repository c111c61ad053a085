// `qatserve chat`: an interactive multi-turn chat on stdin, with images and clips attached by command.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/media_cache.h"
#include "util/error.h"
#include "util/file.h"

namespace qs::cli {

namespace {

// `chat`'s images and clips: `/image PATH` and `/audio PATH` lines attach a file to the next user message. The
// checkpoint's towers load at the first one; each item is encoded once (the conversation is rendered whole every
// turn, so earlier turns' media come from the cache).
class ChatMedia {
 public:
  ChatMedia(const Gemma4Model& model, std::string dir, const LoraAdapter* lora)
      : model_(model), dir_(std::move(dir)), lora_(lora) {}

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
      encode_media_span(span, *towers_, lora_);  // one adapter for the whole conversation: keys need no salt
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
  const LoraAdapter* lora_;
  std::optional<MediaTowers> towers_;
  MediaEmbeddingCache encoded_{uint64_t{1} << 30};  // a conversation's media: all of them
};

}  // namespace

void add_chat(CLI::App& app, CommandRun& run) {
  auto* cmd = app.add_subcommand("chat", "Interactive multi-turn chat on stdin (an empty line or EOF ends it; "
                                         "`/image PATH`, `/audio PATH` attach a file to the next message)");
  static ModelOptions o;
  static std::string system;
  static std::string lora_dir;
  o.add_to(cmd);
  add_lora_option(cmd, lora_dir);
  cmd->add_option("--system", system, "System prompt");
  cmd->callback([&run] {
    run = [] {
      LoadedModel m = load_model(o);
      const Tokenizer& tok = need_tokenizer(m, o.dir, "chat");
      const Generator gen = m.generator();
      const ConstraintSpec constraint = o.constraint();
      const ChatOptions co = chat_options(o.dir, *m.model, constraint);
      const std::shared_ptr<const LoraAdapter> lora = load_lora(lora_dir, *m.model);  // read once, for every turn
      std::vector<ChatMessage> history;
      if (!system.empty()) history.push_back({"system", system});
      ChatMedia media(*m.model, o.dir, lora.get());
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
        req.lora = lora;
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

}  // namespace qs::cli
