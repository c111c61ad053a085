#include "server/generation_source.h"

#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/anthropic_messages_response.h"
#include "server/audio_transcriptions.h"
#include "server/json_response.h"
#include "server/responses_output.h"

namespace qs {
namespace {

class GenerationSource : public ResponseSource {
 public:
  GenerationSource(InFlightRequests& requests, const ServedModel& served, std::shared_ptr<Exchange> ex)
      : requests_(requests), served_(served), ex_(std::move(ex)) {}
  ~GenerationSource() override {
    {
      std::lock_guard lock(ex_->mutex);
      ex_->wake = nullptr;
    }
    requests_.source_closed(*ex_, done_);
  }

  void subscribe(std::function<void()> wake) override {
    std::lock_guard lock(ex_->mutex);
    ex_->wake = std::move(wake);
  }

  void client_gone() override { requests_.client_gone(*ex_); }

  // The response's head carries X-Request-Id: the client's, else this request's id.
  SourceStep next() override {
    SourceStep step = next_step();
    if (step.head)
      step.head->headers.emplace_back("X-Request-Id", ex_->client_request_id.empty() ? ex_->id : ex_->client_request_id);
    return step;
  }

 private:
  SourceStep next_step() {
    std::deque<std::pair<size_t, EngineEvent>> batch;
    bool finished;
    {
      std::lock_guard lock(ex_->mutex);
      if (!request_) {  // still being prepared, or refused: nothing has been sent yet
        if (ex_->refusal) return refused(*ex_->refusal);
        if (!ex_->prepared)
          return requests_.abandoning() ? refused(ApiError(503, "the server is shutting down", "", "server_error"))
                                         : SourceStep{};
        start(std::move(*ex_->prepared));
      }
      if (requests_.abandoning()) requests_.abandon_unfinished(*ex_);
      batch.swap(ex_->events);
      finished = ex_->unfinished == 0;
    }
    if (responses_) return responses_step(batch, finished);
    if (messages_) return messages_step(batch, finished);
    if (transcription_) return transcription_step(batch, finished);
    return sse_ ? stream_step(batch, finished) : completion_step(batch, finished);
  }

  void start(CompletionRequest request) {
    request_ = std::move(request);
    responses_ = std::move(ex_->responses);
    if (responses_) return;
    transcription_ = ex_->transcription;
    if (transcription_) results_.resize(1);
    else if (ex_->anthropic)
      messages_.emplace(request_->parsing, ex_->id, answered_model(*request_, served_), request_->prompt_tokens, request_->stream);
    else if (request_->stream) sse_.emplace(*request_, served_, ex_->id, ex_->created);
    else results_.resize(request_->choices.size());
  }

  // Known before any byte of the response was sent, so a clean error status, streaming or not.
  SourceStep refused(const ApiError& error) {
    SourceStep step;
    step.head = error_response(error, ex_->anthropic);
    step.done = done_ = true;
    return step;
  }

  static HttpResponse stream_head(std::string first_events) {
    HttpResponse head;
    head.content_type = "text/event-stream";
    head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    head.body = std::move(first_events);
    return head;
  }

  SourceStep stream_step(std::deque<std::pair<size_t, EngineEvent>>& batch, bool finished) {
    SourceStep step;
    if (!started_) {
      started_ = true;
      step.head = stream_head(sse_->start());
    }
    for (auto& [index, event] : batch) step.data += sse_->event(index, event);
    if (finished) {
      step.data += sse_->finish();
      step.done = done_ = true;
    }
    return step;
  }

  SourceStep completion_step(std::deque<std::pair<size_t, EngineEvent>>& batch, bool finished) {
    for (auto& [index, event] : batch) {
      ChoiceResult& c = results_[index];
      c.text += event.text;
      c.completion_tokens += static_cast<int64_t>(event.tokens.size());
      for (auto& t : event.prompt_logprobs) c.prompt_logprobs.push_back(std::move(t));
      for (auto& t : event.tokens) c.tokens.push_back(std::move(t));
      if (event.finished) {
        c.finish_reason = event.finish_reason.empty() ? "stop" : event.finish_reason;
        c.error = event.error;
        if (event.completion_tokens > 0) c.completion_tokens = event.completion_tokens;
      }
    }
    SourceStep step;
    if (!finished) return step;
    step.done = done_ = true;
    for (const ChoiceResult& c : results_) {
      if (c.finish_reason == "error") {
        step.head = error_response(
            ApiError(500, c.error.empty() ? "generation failed" : c.error, "", "server_error"));
        return step;
      }
    }
    step.head = json_response(
        200, completion_response(*request_, served_, ex_->id, ex_->created, results_));
    return step;
  }

  // Anthropic's Messages (one choice): every event goes through the assembler, streamed as it comes or answered
  // whole (the message, or why generation failed) at the end.
  SourceStep messages_step(std::deque<std::pair<size_t, EngineEvent>>& batch, bool finished) {
    SourceStep step;
    std::string events = started_ ? "" : messages_->start();
    for (auto& [index, event] : batch) events += messages_->event(event);
    if (request_->stream && !started_) step.head = stream_head(std::move(events));
    else if (request_->stream) step.data = std::move(events);
    started_ = true;
    if (!finished) return step;
    step.done = done_ = true;
    if (!request_->stream)
      step.head = messages_->failure() ? error_response(*messages_->failure(), true)
                                       : json_response(200, messages_->message());
    return step;
  }

  // POST /v1/audio/transcriptions (one choice): OpenAI's transcript events as the text comes, or the whole answer
  // (the text, or why generation failed) at the end.
  SourceStep transcription_step(std::deque<std::pair<size_t, EngineEvent>>& batch, bool finished) {
    SourceStep step;
    std::string events;
    ChoiceResult& c = results_[0];
    for (auto& [index, event] : batch) {
      c.text += event.text;
      c.completion_tokens += static_cast<int64_t>(event.tokens.size());
      if (request_->stream && !event.text.empty()) events += transcription_delta_event(event.text);
      if (!event.finished) continue;
      c.finish_reason = event.finish_reason;
      c.error = event.error;
      if (event.completion_tokens > 0) c.completion_tokens = event.completion_tokens;
    }
    const bool failed = c.finish_reason == "error";
    const ApiError failure(500, c.error.empty() ? "generation failed" : c.error, "", "server_error");
    if (request_->stream && finished)
      events += (failed ? sse_frame(error_body(failure))
                        : transcription_done_event(c.text, request_->prompt_tokens, c.completion_tokens)) +
                std::string(kSseDone);
    if (request_->stream && !started_) step.head = stream_head(std::move(events));
    else if (request_->stream) step.data = std::move(events);
    started_ = true;
    if (!finished) return step;
    step.done = done_ = true;
    if (request_->stream) return step;
    if (failed) {
      step.head = error_response(failure);
      return step;
    }
    TranscriptionAnswer answer = transcription_answer(*transcription_, c.text, request_->prompt_tokens,
                                                      c.completion_tokens);
    HttpResponse r;
    r.content_type = std::move(answer.content_type);
    r.body = std::move(answer.body);
    step.head = std::move(r);
    return step;
  }

  // POST /v1/responses (one choice), streaming or not: its writer renders every event (responses_output.h).
  SourceStep responses_step(std::deque<std::pair<size_t, EngineEvent>>& batch, bool finished) {
    SourceStep step;
    std::string data;
    if (!started_) data = responses_->start();
    for (auto& [index, event] : batch) data += responses_->event(event);
    if (responses_->stream()) {
      if (!started_) step.head = stream_head(std::move(data));
      else step.data = std::move(data);
    }
    started_ = true;
    if (!finished) return step;
    step.done = done_ = true;
    if (!responses_->stream()) {
      HttpResponse r;
      r.status = responses_->status();
      r.body = responses_->body();
      step.head = std::move(r);
    }
    return step;
  }

  InFlightRequests& requests_;
  const ServedModel& served_;
  std::shared_ptr<Exchange> ex_;
  std::unique_ptr<ResponsesWriter> responses_;  // POST /v1/responses
  std::optional<CompletionRequest> request_;  // once prepared
  std::optional<MessageAssembler> messages_;  // Anthropic's Messages, streaming or not
  std::optional<TranscriptionFormat> transcription_;  // POST /v1/audio/transcriptions
  std::optional<SseStream> sse_;      // streaming
  std::vector<ChoiceResult> results_;  // not streaming
  bool started_ = false, done_ = false;
};

}  // namespace

std::shared_ptr<ResponseSource> generation_source(InFlightRequests& requests, const ServedModel& served,
                                                  std::shared_ptr<Exchange> ex) {
  return std::make_shared<GenerationSource>(requests, served, std::move(ex));
}

}  // namespace qs
