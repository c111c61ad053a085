#pragma once
// A request's image budget: how many soft tokens Gemma 4's processor may spend on each image (its max_soft_tokens:
// 70, 140, 280, 560 or 1120). Chosen per image part by OpenAI's `detail` ("low": 70, "high": the server's largest
// allowed, "auto" or absent: the request's budget) and per request by vLLM's `mm_processor_kwargs:
// {"max_soft_tokens": N}` (else the server's default). Errors are ApiError 400s naming the field.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "media/media_input.h"
#include "server/openai_protocol.h"

namespace qs {

// Whether `n` is a budget Gemma4Processor takes.
bool supported_image_soft_tokens(int n);

// An image part's `detail` (the object holding it: a chat part's image_url, a Responses input_image): its budget, or
// 0 for "auto" / absent (the request's). Anything else is a 400 naming `where`.detail (param "messages").
int image_detail_soft_tokens(const nlohmann::json& holder, const MediaOptions& options, const std::string& where);

// The request's budget: mm_processor_kwargs.max_soft_tokens, else options.image_soft_tokens. A budget Gemma 4 does
// not take, one above options.max_image_soft_tokens, or another mm_processor_kwargs key is a 400 (param
// "mm_processor_kwargs").
int request_image_soft_tokens(const nlohmann::json& body, const MediaOptions& options);

// serve's image budgets: `fallback` for images whose request names none, `max` the largest a request may ask.
struct ImageBudgets {
  int fallback = 0, max = 0;
};
// From --image-soft-tokens and --max-image-soft-tokens (0: not given) and the processor's own budget: the default is
// the flag, else the processor's; the largest is the flag, else the default. Throws qs::Error naming the flag when a
// budget is not one Gemma 4 takes or the largest is below the default.
ImageBudgets resolve_image_budgets(int default_flag, int max_flag, int processor_budget);

// Images still without a budget of their own get `soft_tokens`.
void apply_image_soft_tokens(std::vector<media::MediaInput>& media, int soft_tokens);

}  // namespace qs
