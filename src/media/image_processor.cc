#include "media/image_processor.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "media/image_resize.h"
#include "util/error.h"
#include "util/json_parse.h"
#include "util/file.h"

namespace qs::media {
namespace {

using json = nlohmann::json;

constexpr int kSupportedSoftTokens[] = {70, 140, 280, 560, 1120};
constexpr int kPilBicubic = 3;

template <typename T>
T get_field(const json& j, const char* key, T fallback, std::string_view source) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(fmt::format("{}: \"{}\" is {}; expected a {}", source, key, it->dump(),
                            std::is_same_v<T, bool> ? "boolean" : "number"));
  }
}

// image_mean / image_std: one number for every channel or a list of three, as HF's normalize accepts.
std::array<float, 3> get_channels(const json& j, const char* key, std::array<float, 3> fallback,
                                  std::string_view source) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_number()) {
    const float v = it->get<float>();
    return {v, v, v};
  }
  if (it->is_array() && it->size() == 3 && (*it)[0].is_number() && (*it)[1].is_number() && (*it)[2].is_number()) {
    return {(*it)[0].get<float>(), (*it)[1].get<float>(), (*it)[2].get<float>()};
  }
  throw Error(fmt::format("{}: \"{}\" is {}; expected a number or a list of 3 numbers", source, key, it->dump()));
}

void check_positive(int value, const char* key, std::string_view source) {
  if (value <= 0 || value > 1024) {
    throw Error(fmt::format("{}: \"{}\" is {}; expected 1..1024", source, key, value));
  }
}

}  // namespace

ImageProcessorOptions parse_image_processor_options(std::string_view json_text, std::string_view source) {
  const json root = parse_json<json>(json_text, source);
  if (!root.is_object()) throw Error(fmt::format("{}: expected a JSON object", source));
  // processor_config.json nests the image processor's settings; preprocessor_config.json holds them at the top.
  const json& j = root.contains("image_processor") ? root["image_processor"] : root;
  if (!j.is_object()) throw Error(fmt::format("{}: \"image_processor\" is not an object", source));
  ImageProcessorOptions o;
  o.do_resize = get_field(j, "do_resize", o.do_resize, source);
  o.do_rescale = get_field(j, "do_rescale", o.do_rescale, source);
  o.rescale_factor = get_field(j, "rescale_factor", o.rescale_factor, source);
  o.do_normalize = get_field(j, "do_normalize", o.do_normalize, source);
  o.image_mean = get_channels(j, "image_mean", o.image_mean, source);
  o.image_std = get_channels(j, "image_std", o.image_std, source);
  o.patch_size = get_field(j, "patch_size", o.patch_size, source);
  o.max_soft_tokens = get_field(j, "max_soft_tokens", o.max_soft_tokens, source);
  o.pooling_kernel_size = get_field(j, "pooling_kernel_size", o.pooling_kernel_size, source);
  if (const int resample = get_field(j, "resample", kPilBicubic, source); resample != kPilBicubic) {
    throw Error(fmt::format("{}: \"resample\" is {}; only 3 (bicubic, the Gemma 4 processor's) is implemented",
                            source, resample));
  }
  if (!get_field(j, "do_convert_rgb", true, source)) {
    throw Error(fmt::format("{}: \"do_convert_rgb\" is false; images are always converted to RGB", source));
  }
  check_positive(o.patch_size, "patch_size", source);
  check_positive(o.pooling_kernel_size, "pooling_kernel_size", source);
  if (std::find(std::begin(kSupportedSoftTokens), std::end(kSupportedSoftTokens), o.max_soft_tokens) ==
      std::end(kSupportedSoftTokens)) {
    throw Error(fmt::format("{}: \"max_soft_tokens\" is {}; expected one of 70, 140, 280, 560, 1120", source,
                            o.max_soft_tokens));
  }
  for (int c = 0; c < 3; ++c) {
    if (o.do_normalize && o.image_std[c] == 0.0f) throw Error(fmt::format("{}: \"image_std\" has a zero", source));
  }
  return o;
}

ImageProcessorOptions read_image_processor_options(const std::filesystem::path& model_dir) {
  // transformers reads processor_config.json's "image_processor" first, then preprocessor_config.json.
  for (const char* name : {"processor_config.json", "preprocessor_config.json"}) {
    const std::filesystem::path path = model_dir / name;
    if (!std::filesystem::exists(path)) continue;
    const std::string text = read_file(path);
    const json parsed = json::parse(text, nullptr, false);  // invalid JSON: parse_... names the file
    if (std::string_view(name) == "processor_config.json" && !parsed.is_discarded() &&
        !parsed.contains("image_processor")) {
      continue;  // a processor_config.json without the image processor's settings (older exports)
    }
    return parse_image_processor_options(text, path.string());
  }
  return ImageProcessorOptions{};
}

std::string processor_config_json(const ImageProcessorOptions& o) {
  const nlohmann::ordered_json image_processor = {
      {"patch_size", o.patch_size},         {"max_soft_tokens", o.max_soft_tokens},
      {"pooling_kernel_size", o.pooling_kernel_size},
      {"do_convert_rgb", true},             {"do_resize", o.do_resize},
      {"resample", kPilBicubic},            {"do_rescale", o.do_rescale},
      {"rescale_factor", o.rescale_factor}, {"do_normalize", o.do_normalize},
      {"image_mean", o.image_mean},         {"image_std", o.image_std},
      {"image_processor_type", "Gemma4ImageProcessor"}};
  const nlohmann::ordered_json config = {{"processor_class", "Gemma4Processor"},
                                         {"image_seq_length", o.max_soft_tokens},
                                         {"image_processor", image_processor}};
  return config.dump(2) + "\n";
}

ResizeTarget aspect_ratio_preserving_size(int height, int width, const ImageProcessorOptions& o) {
  // The Python arithmetic, in the same doubles: sqrt and / are correctly rounded in both.
  const double total_px = static_cast<double>(height) * width;
  const double target_px = static_cast<double>(o.max_patches()) * o.patch_size * o.patch_size;
  const double factor = std::sqrt(target_px / total_px);
  const int side_mult = o.pooling_kernel_size * o.patch_size;
  int64_t target_h = static_cast<int64_t>(std::floor(factor * height / side_mult)) * side_mult;
  int64_t target_w = static_cast<int64_t>(std::floor(factor * width / side_mult)) * side_mult;
  if (target_h == 0 && target_w == 0) {
    throw Error(fmt::format("a {}x{} image resizes to 0x0 (sides must be multiples of {})", width, height, side_mult));
  }
  const int64_t max_side = static_cast<int64_t>(o.max_patches() / (o.pooling_kernel_size * o.pooling_kernel_size)) *
                           side_mult;
  if (target_h == 0) {
    target_h = side_mult;
    target_w = std::min(static_cast<int64_t>(std::floor(static_cast<double>(width) / height)) * side_mult, max_side);
  } else if (target_w == 0) {
    target_w = side_mult;
    target_h = std::min(static_cast<int64_t>(std::floor(static_cast<double>(height) / width)) * side_mult, max_side);
  }
  if (static_cast<double>(target_h) * target_w > target_px) {
    throw Error(fmt::format("resizing a {}x{} image to {}x{} exceeds {} patches", width, height, target_w, target_h,
                            o.max_patches()));
  }
  return {static_cast<int>(target_h), static_cast<int>(target_w)};
}

PreprocessedImage preprocess_image(const RgbImage& image, const ImageProcessorOptions& o) {
  if (image.width <= 0 || image.height <= 0 || image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    throw Error(fmt::format("preprocess_image: a {}x{} image with {} bytes of RGB", image.width, image.height,
                            image.rgb.size()));
  }
  if (o.unified && o.do_normalize)
    throw Error("image processor: \"do_normalize\" is true; the 12B's Gemma4UnifiedImageProcessor normalizes "
                "nothing, and qatserve implements its rescale only");
  int height = image.height, width = image.width;
  std::vector<uint8_t> resized;
  std::span<const uint8_t> pixels = image.rgb;
  if (o.do_resize) {
    const ResizeTarget target = aspect_ratio_preserving_size(height, width, o);
    if (target.height != height || target.width != width) {
      resized = o.unified ? resize_bicubic_torch(image.rgb, width, height, 3, target.width, target.height)
                          : resize_bicubic(image.rgb, width, height, 3, target.width, target.height);
      pixels = resized;
      height = target.height, width = target.width;
    }
  }
  const int p = o.unified ? o.patch_size * o.pooling_kernel_size : o.patch_size;
  if (width % p != 0 || height % p != 0) {
    throw Error(fmt::format("a {}x{} image cannot be cut into {}-pixel patches (do_resize is false)", width, height,
                            p));
  }
  // rescale: float64(pixel) * factor, stored as float32 (numpy), or float32(pixel) * float32(factor) (torch);
  // normalize: (x - mean) / std in float32.
  float levels[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float x = !o.do_rescale ? static_cast<float>(v)
                : o.unified   ? static_cast<float>(v) * static_cast<float>(o.rescale_factor)
                              : static_cast<float>(v * o.rescale_factor);
      if (o.do_normalize) x = (x - o.image_mean[c]) / o.image_std[c];
      levels[c][v] = x;
    }
  }
  const int cols = width / p, rows = height / p;
  PreprocessedImage out;
  out.num_patches = rows * cols;
  out.num_soft_tokens = o.unified ? out.num_patches : out.num_patches / (o.pooling_kernel_size * o.pooling_kernel_size);
  out.pixel_values.reserve(static_cast<size_t>(out.num_patches) * p * p * 3);
  out.position_ids.reserve(static_cast<size_t>(out.num_patches) * 2);
  for (int py = 0; py < rows; ++py) {
    for (int px = 0; px < cols; ++px) {
      for (int y = 0; y < p; ++y) {
        const uint8_t* row = pixels.data() + (static_cast<size_t>(py * p + y) * width + px * p) * 3;
        for (int i = 0; i < p * 3; ++i) out.pixel_values.push_back(levels[i % 3][row[i]]);
      }
      out.position_ids.push_back(px);
      out.position_ids.push_back(py);
    }
  }
  return out;
}

std::string expand_image_placeholder(int num_soft_tokens) {
  std::string text(kBeginOfImage);
  for (int i = 0; i < num_soft_tokens; ++i) text += kImageToken;
  text += kEndOfImage;
  return text;
}

}  // namespace qs::media
