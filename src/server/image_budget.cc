#include "server/image_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

#include "util/error.h"

namespace qs {
namespace {

using json = nlohmann::json;

// Gemma4ImageProcessor's _SUPPORTED_SOFT_TOKENS.
constexpr std::array<int, 5> kBudgets = {70, 140, 280, 560, 1120};

const json* field(const json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

bool supported_image_soft_tokens(int n) { return std::find(kBudgets.begin(), kBudgets.end(), n) != kBudgets.end(); }

int image_detail_soft_tokens(const json& holder, const MediaOptions& options, const std::string& where) {
  const json* detail = holder.is_object() ? field(holder, "detail") : nullptr;
  if (!detail) return 0;
  const std::string value = detail->is_string() ? detail->get<std::string>() : detail->dump();
  if (value == "auto") return 0;
  if (value == "low") return kBudgets.front();
  if (value == "high") return options.max_image_soft_tokens;
  throw ApiError(400, fmt::format("{}.detail is {}; expected \"low\" (70 soft tokens), \"high\" ({}) or \"auto\"",
                                  where, detail->dump(), options.max_image_soft_tokens),
                 "messages");
}

int request_image_soft_tokens(const json& body, const MediaOptions& options) {
  const json* kwargs = field(body, "mm_processor_kwargs");
  if (!kwargs) return options.image_soft_tokens;
  auto bad = [](const std::string& message) -> ApiError { return ApiError(400, message, "mm_processor_kwargs"); };
  if (!kwargs->is_object())
    throw bad(fmt::format("mm_processor_kwargs must be an object, got {}", kwargs->dump()));
  for (const auto& [key, value] : kwargs->items())
    if (key != "max_soft_tokens")
      throw bad(fmt::format("mm_processor_kwargs.{} is not supported; Gemma 4's processor takes max_soft_tokens", key));
  const json* n = field(*kwargs, "max_soft_tokens");
  if (!n) return options.image_soft_tokens;
  const int budget = n->is_number_integer() ? static_cast<int>(std::clamp<int64_t>(n->get<int64_t>(), -1, 1 << 20)) : -1;
  if (!supported_image_soft_tokens(budget))
    throw bad(fmt::format("mm_processor_kwargs.max_soft_tokens is {}; expected one of 70, 140, 280, 560, 1120",
                          n->dump()));
  if (budget > options.max_image_soft_tokens)
    throw bad(fmt::format("mm_processor_kwargs.max_soft_tokens is {}; this server allows at most {} per image "
                          "(serve --max-image-soft-tokens)",
                          budget, options.max_image_soft_tokens));
  return budget;
}

ImageBudgets resolve_image_budgets(int default_flag, int max_flag, int processor_budget) {
  for (auto [flag, value] : {std::pair{"--image-soft-tokens", default_flag}, {"--max-image-soft-tokens", max_flag}})
    if (value != 0 && !supported_image_soft_tokens(value))
      throw Error(fmt::format("{} {}: expected one of 70, 140, 280, 560, 1120", flag, value));
  ImageBudgets b;
  b.fallback = default_flag ? default_flag : processor_budget;
  b.max = max_flag ? max_flag : b.fallback;
  if (b.max < b.fallback)
    throw Error(fmt::format("--max-image-soft-tokens {} is below the default image budget {}{}", b.max, b.fallback,
                            default_flag ? " (--image-soft-tokens)" : " (processor_config.json)"));
  return b;
}

void apply_image_soft_tokens(std::vector<media::MediaInput>& media, int soft_tokens) {
  for (media::MediaInput& m : media)
    if (m.kind == media::MediaKind::Image && m.image_soft_tokens == 0) m.image_soft_tokens = soft_tokens;
}

}  // namespace qs
