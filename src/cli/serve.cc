// `qatserve serve`: the model over the OpenAI-compatible HTTP API (server/http_server.h).
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "engine/memory_plan.h"
#include "server/http_server.h"
#include "server/lora_registry.h"
#include "util/progress.h"

namespace qs::cli {

void add_serve(CLI::App& app, CommandRun& run) {
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
  cmd->add_flag_callback("--no-tool-call-grammar", [] { o.tool_call_grammar = false; },
                         "Under tool_choice auto leave the model's tool calls unconstrained (as vLLM; by default a "
                         "call the model opens names a declared tool with arguments valid against its parameters, "
                         "as llama.cpp's lazy grammar)");
  cmd->add_option("--max-running", o.max_running, "Sequences decoded together (default 16)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-waiting", o.max_waiting, "Queued sequences before answering 429 (default 64)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--precision", o.precision, kPrecisionHelp)->check(CLI::IsMember({"f32", "bf16", "int8"}));
  add_kv_dtype(cmd, o.kv_dtype);
  cmd->add_option("--kv-memory", kv_memory, "KV cache pool, e.g. 512M or 4G (default: from `plan --device cpu`)");
  static std::string prefix_disk_bytes = "8G";
  cmd->add_option("--prefix-cache-dir", o.prefix_cache_dir, "Directory of the prefix cache's disk tier: blocks evicted "
                  "from RAM (and those cached at exit) are written there and read back on a hit, after a restart too "
                  "(default: none)");
  cmd->add_option("--prefix-cache-disk-bytes", prefix_disk_bytes, "Bound of that directory per model, least "
                  "recently used blocks out (default 8G)");
  cmd->add_option("--media-cache-mb", media_cache_mb,
                  "MiB of encoded images' and clips' soft tokens kept (least recently used out), so media seen again "
                  "skip their tower (default 64; 0 = off)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  const auto budgets = CLI::IsMember({70, 140, 280, 560, 1120});
  cmd->add_option("--image-soft-tokens", o.image_soft_tokens,
                  "Soft tokens per image when a request names none (mm_processor_kwargs.max_soft_tokens, or detail): "
                  "70, 140, 280, 560 or 1120 (default: the checkpoint's processor_config.json)")
      ->check(budgets);
  cmd->add_option("--max-image-soft-tokens", o.max_image_soft_tokens,
                  "The largest image budget a request may ask (detail \"high\" gets it); the memory plan reserves the "
                  "vision tower's work for it (default: the default budget)")
      ->check(budgets);
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
  cmd->add_option("--max-body-bytes", o.max_body_bytes,
                  "Largest request body in bytes; a larger one gets 413. Images and audio travel base64-encoded in "
                  "the body, so this bounds what a request can attach (default 8388608, 8 MiB)")
      ->check(CLI::Range(size_t{1} << 10, size_t{1} << 30));
  fetch.add_to(cmd);
  static std::vector<std::string> loras;
  cmd->add_option("--lora", loras, "NAME=DIR: serve the PEFT LoRA adapter in DIR to requests whose model is NAME "
                  "(repeatable; docs/lora.md)")->take_all()->allow_extra_args(false);
  cmd->add_option("--max-loras", o.max_loras, "LoRA adapters loaded at once, --lora and runtime loads together "
                  "(default 1, as vLLM)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-lora-rank", o.max_lora_rank, "The largest LoRA rank an adapter may have; larger ones are "
                  "refused (default 16, as vLLM)")->check(CLI::PositiveNumber);
  cmd->add_flag("--enable-lora-runtime-loading", o.lora_runtime_loading, "Answer POST /v1/load_lora_adapter and "
                "/v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): anyone holding the API key may "
                "then make the server read a directory of its machine");
  cmd->add_option("--kv-events-endpoint", o.kv_events.endpoint,
                  "Publish KV events as vLLM does (BlockStored, BlockRemoved, AllBlocksCleared; ZeroMQ PUB, msgpack) "
                  "on this address, e.g. tcp://*:5557, for prefix-aware routers (default: none)");
  cmd->add_option("--kv-events-topic", o.kv_events.topic, "The topic frame of each KV events message (default empty)");
  cmd->add_option("--kv-events-replay-endpoint", o.kv_events.replay_endpoint,
                  "ZeroMQ ROUTER address answering requests for missed KV event batches, e.g. tcp://*:5558 "
                  "(default: none)");
  cmd->add_option("--kv-events-hash-seed", o.kv_events_hash_seed,
                  "Seed of the block hashes' NONE_HASH, as vLLM's PYTHONHASHSEED (default: $PYTHONHASHSEED, else "
                  "vLLM's \"vllm-none-hash\")");
  static std::string speculative = "none", draft_model, assistant;
  static SpeculativeConfig speculation;
  add_speculative_options(cmd, speculative, speculation, draft_model, assistant);
  cmd->callback([&run] {
    run = [] {
      o.speculative = speculative_config_of(speculative, speculation, draft_model, assistant);
      o.draft_model = draft_model;
      o.assistant = assistant;
      o.model_dir = model_dir;
      o.loras.clear();
      for (const std::string& spec : loras) {
        const ServedAdapter a = parse_lora_module(spec);
        o.loras.emplace_back(a.name, a.dir);
      }
      o.media_fetch = fetch.options();
      o.api_key = resolve_api_key(o.api_key, api_key_file, std::getenv("QATSERVE_API_KEY"));
      o.drain_grace = std::chrono::milliseconds(std::llround(drain_seconds * 1000));
      o.header_timeout = std::chrono::milliseconds(std::llround(header_seconds * 1000));
      o.body_timeout = std::chrono::milliseconds(std::llround(body_seconds * 1000));
      if (!kv_memory.empty()) o.kv_memory = parse_byte_size(kv_memory, "--kv-memory");
      o.prefix_cache_disk_bytes = parse_byte_size(prefix_disk_bytes, "--prefix-cache-disk-bytes");
      o.media_cache_bytes = media_cache_mb << 20;
      o.responses_max_bytes = responses_max_mb << 20;
      return run_server(o);
    };
  });
}

}  // namespace qs::cli
