// src/media's image path against the committed fixtures of tools/python/make_image_golden.py: Pillow 12.3's decoding
// and bicubic resizing and transformers 5.23's Gemma4ImageProcessorPil (the live comparison is ctest image_external).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "media/image_decode.h"
#include "media/image_processor.h"
#include "media/image_resize.h"
#include "util/error.h"
#include "util/file.h"
#include "test_util.h"

namespace qs::media {
namespace {

using json = nlohmann::json;
const std::string kImages = std::string(QATSERVE_SOURCE_DIR) + "/tests/data/images/";

json golden() {
  std::ifstream in(std::string(QATSERVE_SOURCE_DIR) + "/tests/golden/image_golden.json");
  return json::parse(in);
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  const std::string text = read_file(path);
  return {text.begin(), text.end()};
}

template <typename T>
std::string fnv1a64(const std::vector<T>& values) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(T); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

using qs::test::error_of;

TEST(ImageMedia, DecodesLikePillowAndTransformers) {
  for (const json& g : golden()["images"]) {
    const std::string file = g["file"];
    SCOPED_TRACE(file);
    const RgbImage image = decode_image(file_bytes(kImages + file), ImageLimits{}, file);
    EXPECT_EQ(image.width, g["width"].get<int>());
    EXPECT_EQ(image.height, g["height"].get<int>());
    EXPECT_EQ(fnv1a64(image.rgb), g["rgb_fnv1a64"].get<std::string>());
  }
}

TEST(ImageMedia, ResizesBitExactlyLikePillowBicubic) {
  for (const json& g : golden()["images"]) {
    const std::string file = g["file"];
    const RgbImage image = decode_image(file_bytes(kImages + file), ImageLimits{}, file);
    for (const json& r : g["resizes"]) {
      SCOPED_TRACE(file + " -> " + r["width"].dump() + "x" + r["height"].dump());
      const std::vector<uint8_t> out =
          resize_bicubic(image.rgb, image.width, image.height, 3, r["width"].get<int>(), r["height"].get<int>());
      EXPECT_EQ(fnv1a64(out), r["fnv1a64"].get<std::string>());
    }
  }
}

TEST(ImageMedia, PreprocessesLikeGemma4ImageProcessor) {
  const json all = golden();
  ImageProcessorOptions options;
  options.max_soft_tokens = all["max_soft_tokens"].get<int>();
  for (const json& g : all["images"]) {
    const std::string file = g["file"];
    SCOPED_TRACE(file);
    const PreprocessedImage p = preprocess_image(decode_image(file_bytes(kImages + file), ImageLimits{}, file), options);
    EXPECT_EQ(p.num_patches, g["num_patches"].get<int>());
    EXPECT_EQ(p.num_soft_tokens, g["num_soft_tokens"].get<int>());
    EXPECT_EQ(p.pixel_values.size(), static_cast<size_t>(p.num_patches) * 16 * 16 * 3);
    EXPECT_EQ(fnv1a64(p.pixel_values), g["pixel_values_fnv1a64"].get<std::string>());
    EXPECT_EQ(fnv1a64(p.position_ids), g["position_ids_fnv1a64"].get<std::string>());
    for (size_t i = 0; i < g["first_values"].size(); ++i) EXPECT_EQ(p.pixel_values[i], g["first_values"][i].get<float>());
  }
}

TEST(ImageMedia, TargetSizesMatchTransformers) {
  for (const json& s : golden()["sizes"]) {
    const ResizeTarget t = aspect_ratio_preserving_size(s["height"], s["width"], ImageProcessorOptions{});
    EXPECT_EQ(t.height, s["target_height"].get<int>()) << s.dump();
    EXPECT_EQ(t.width, s["target_width"].get<int>()) << s.dump();
  }
}

TEST(ImageMedia, RejectsBadImagesNamingThePart) {
  for (const json& b : golden()["bad"]) {
    const std::string file = b["file"];
    const std::string message = error_of([&] { decode_image(file_bytes(kImages + "bad/" + file), ImageLimits{}, "messages[0].content[1]"); });
    EXPECT_NE(message.find("messages[0].content[1]"), std::string::npos) << file << ": " << message;
    EXPECT_NE(message.find(b["message"].get<std::string>()), std::string::npos) << file << ": " << message;
  }
  const std::vector<uint8_t> png = file_bytes(kImages + "rgba.png");
  EXPECT_NE(error_of([&] { decode_image({}, ImageLimits{}, "img"); }).find("img: the image is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { decode_image(png, ImageLimits{}, "img", "image/jpeg"); })
                .find("img: declared as \"image/jpeg\" but the bytes are a PNG image"),
            std::string::npos);
  EXPECT_NO_THROW(decode_image(png, ImageLimits{}, "img", "image/png"));
  ImageLimits small;
  small.max_bytes = 100;
  EXPECT_NE(error_of([&] { decode_image(png, small, "img"); }).find("at most 100 are accepted"), std::string::npos);
  small = ImageLimits{};
  small.max_pixels = 29 * 31 - 1;
  EXPECT_NE(error_of([&] { decode_image(png, small, "img"); }).find("29x31 = 899 pixels; at most 898"),
            std::string::npos);
  small = ImageLimits{};
  small.max_side = 30;
  EXPECT_NE(error_of([&] { decode_image(png, small, "img"); }).find("at most 30 pixels a side"), std::string::npos);
}

TEST(ImageMedia, EveryTruncationOfEveryFixtureIsAnErrorNotACrash) {
  for (const json& g : golden()["images"]) {
    const std::vector<uint8_t> bytes = file_bytes(kImages + g["file"].get<std::string>());
    for (size_t n = 0; n < bytes.size(); n += 1 + n / 16) {
      try {
        decode_image(std::span(bytes).first(n), ImageLimits{}, "img");
      } catch (const Error&) {
      }
    }
  }
}

TEST(ImageMedia, ReadsProcessorOptions) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("qatserve-image-options-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_EQ(read_image_processor_options(dir).max_soft_tokens, 280);  // no file: HF's defaults
  std::ofstream(dir / "processor_config.json")
      << R"({"image_processor": {"max_soft_tokens": 560, "patch_size": 16, "pooling_kernel_size": 3,
            "do_normalize": true, "image_mean": 0.5, "image_std": [0.5, 0.25, 2], "resample": 3}})";
  const ImageProcessorOptions o = read_image_processor_options(dir);
  std::ofstream(dir / "processor_config.json") << "{not json";
  EXPECT_NE(error_of([&] { read_image_processor_options(dir); }).find("processor_config.json: not valid JSON"),
            std::string::npos);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(o.max_soft_tokens, 560);
  EXPECT_EQ(o.max_patches(), 560 * 9);
  EXPECT_TRUE(o.do_normalize);
  EXPECT_EQ(o.image_mean[2], 0.5f);
  EXPECT_EQ(o.image_std[1], 0.25f);
  EXPECT_NE(error_of([] { parse_image_processor_options(R"({"max_soft_tokens": 100})", "cfg"); })
                .find("cfg: \"max_soft_tokens\" is 100; expected one of 70, 140, 280, 560, 1120"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_image_processor_options(R"({"resample": 2})", "cfg"); }).find("\"resample\" is 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_image_processor_options(R"({"patch_size": "x"})", "cfg"); })
                .find("\"patch_size\" is \"x\"; expected a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_image_processor_options(R"({"image_mean": [1, 2]})", "cfg"); })
                .find("\"image_mean\" is [1,2]"),
            std::string::npos);
}

TEST(ImageMedia, ExpandsThePlaceholderAsTheProcessor) {
  EXPECT_EQ(expand_image_placeholder(2), "<|image><|image|><|image|><image|>");
}

}  // namespace
}  // namespace qs::media
