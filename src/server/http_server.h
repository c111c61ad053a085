#pragma once
// `qatserve serve`: the OpenAI-compatible HTTP server over the batching engine (http_transport.h: event-driven, Boost.Beast).
//
//   POST /v1/chat/completions, POST /v1/completions   streaming (SSE) or not; see openai_protocol.h
//   POST /v1/responses                                 OpenAI's Responses API on the chat path (openai_responses.h,
//                                                      responses_output.h); GET and DELETE /v1/responses/{id} and
//                                                      POST /v1/responses/{id}/cancel read the store
//                                                      (response_store.h)
//   POST /v1/messages, POST /v1/messages/count_tokens Anthropic's Messages API, streaming or not, and its error
//                                                      shape; see anthropic_messages_request.h and _response.h
//   POST /v1/audio/transcriptions                      OpenAI's speech-to-text upload (multipart/form-data) as a chat
//                                                      request of the clip, for models with an audio tower
//                                                      (audio_transcriptions.h)
//   GET  /                                             the chat page (chat_page.h), open even with an API key
//                                                      (it asks for the key); absent with --no-ui
//   GET  /v1/models                                    the model: --served-model-name, else its directory's name;
//                                                      once loaded, its context and the chat_template_kwargs it takes;
//                                                      then each LoRA adapter served (lora_admin.h)
//   GET  /props                                        llama.cpp server's: model_alias, model_path, total_slots,
//                                                      and once loaded default_generation_settings.n_ctx and
//                                                      modalities {vision, audio}
//   POST /tokenize, POST /detokenize                   the tokenizer as the server uses it
//   GET  /health                                       503 {"status":"loading"} until a warm-up request has run
//                                                      through the model, then 200 with backend, precision and
//                                                      modalities; always open, even with an API key
//   GET  /metrics                                      Prometheus text (metrics.h)
//   POST /v1/load_lora_adapter, /v1/unload_lora_adapter  vLLM's runtime LoRA API (lora_admin.h), with
//                                                      --enable-lora-runtime-loading only (else 404)
//
// Lifecycle: the server listens before the model loads (so /health can say "loading"), loads the model and the
// tokenizer, starts the engine and runs one 1-token request through it, then reports ready. SIGINT/SIGTERM close
// the listener and the connections waiting for a request, let the engine finish running requests for up to the
// grace period (streams included), abort the rest, and return 0. A client that closes its connection aborts its
// request (streaming or not) at once. Each generation request logs one line on stderr (server_log.h: text or JSON lines).
//
// Threads: the HTTP I/O thread only reads and writes (http_transport.h); a generation request's body is parsed,
// templated and tokenized and its media decoded and preprocessed on a PrepareQueue worker, which submits it to the
// engine (so every refusal, a corrupt image included, is a clean 400 before any response byte, streaming or not);
// the vision and audio towers run on the engine thread when the request is admitted, between steps, and reuse the
// soft tokens of media seen before (--media-cache-mb).
//
// Files: this server (http_server.cc: authentication, dispatch, generation requests, lifecycle) answers over the
// ServingStack it loads (serving_stack.h: model, tokenizer, towers, adapters, engine); the informational routes are
// info_routes.h; the options are serve_options.h.
#include "server/serve_options.h"

namespace qs {

// Runs until SIGINT or SIGTERM (util/interrupt.h must be installed), then drains; returns the exit status.
// Throws qs::Error when it cannot listen or the model cannot be loaded.
int run_server(const ServeOptions& options);

}  // namespace qs
