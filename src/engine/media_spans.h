#pragma once
// Where a request's images and clips sit in its prompt, as the engine handles them: checked at submit, keyed for
// the prefix cache, kept whole inside prefill chunks, and handed to each step as soft tokens.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/media_prompt.h"
#include "model/gemma4.h"

namespace qs {

// Spans ascending, not overlapping, inside the prompt, each encoded (whole rows) or prepared for a tower the engine
// has; else why not.
std::optional<std::string> check_media(const EngineRequest& request, int64_t hidden, const MediaTowers* towers);

// Prefix-cache keys that see media content: each placeholder position of a span gets an id drawn from the span's
// content key and its index in the span. The model reads the soft tokens there, never the id, so the keys alone
// change: the same image in a later turn reuses its cached blocks, two different images never share one (their ids
// differ at every position of the span).
void key_media_positions(std::span<const MediaSpan> media, std::vector<int32_t>& tokens, int64_t key_vocab);

// A prefill chunk [start, start + n) ends outside every span: before one that starts inside it, or else (a span
// begun before the chunk, after an adopted prefix) after the span's end. Returns the chunk's length.
int64_t chunk_outside_media(std::span<const MediaSpan> media, int64_t start, int64_t n);

// The soft tokens of a step over positions [start, start + n), as the model takes them (views of the spans').
std::vector<SoftTokens> step_soft_tokens(std::span<const MediaSpan> media, int64_t start, int64_t n, int64_t hidden);

}  // namespace qs
