#include "cli/common_flags.h"

#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <cmath>

#include "util/error.h"

namespace qs::cli {

namespace {

constexpr const char* kKvDtypeHelp =
    "KV cache dtype: bf16, int8 (lossy: codes and a scale per position and KV head, about half bf16's bytes; `bench "
    "--kv-dtype bf16,int8` prints its logit error) or f32 (default: f32 at --precision f32, else bf16)";

}  // namespace

void add_kv_dtype(CLI::App* cmd, std::string& kv_dtype) {
  cmd->add_option("--kv-dtype", kv_dtype, kKvDtypeHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
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

void MediaFetchFlags::add_to(CLI::App* cmd) {
  cmd->add_option("--allowed-media-domains", domains,
                  "Fetch http(s) image URLs from these hosts only: comma-separated, 'a.com' exactly, '*.b.org' "
                  "its subdomains, '*' any; loopback/private addresses only for hosts listed exactly (default: "
                  "none, URLs are refused)");
  cmd->add_option("--media-fetch-timeout", timeout_seconds,
                  "Seconds one image URL may take, redirects and body included (default 10)")
      ->check(CLI::PositiveNumber);
}

media::MediaFetchOptions MediaFetchFlags::options() const {
  media::MediaFetchOptions o;
  o.allowed_hosts = media::parse_allowed_media_hosts(domains);
  o.timeout = std::chrono::milliseconds(std::llround(timeout_seconds * 1000));
  return o;
}

void add_speculative_options(CLI::App* cmd, std::string& method, SpeculativeConfig& c, std::string& draft_model,
                             std::string& assistant, std::string* token_list) {
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

SpeculativeConfig speculative_config_of(const std::string& method, SpeculativeConfig c, const std::string& draft_model,
                                        const std::string& assistant) {
  c.method = method != "none"        ? parse_speculative_method(method)
             : !assistant.empty()    ? SpeculativeMethod::Assistant
             : !draft_model.empty()  ? SpeculativeMethod::DraftModel
                                     : SpeculativeMethod::None;
  if (c.enabled()) c.validate();
  return c;
}

}  // namespace qs::cli
