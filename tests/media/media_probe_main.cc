// media_probe: src/media's image path from the command line, for the external checks against Pillow and
// transformers (tools/python/check_image_external.py). Raw outputs go to files, a JSON line to stdout; a rejected
// image prints its qs::Error on stderr and exits 1.
//   media_probe resize IN OUT WIDTH HEIGHT CHANNELS OUT_WIDTH OUT_HEIGHT [--torch]   (raw interleaved 8-bit pixels;
//                                                                          --torch: torch's resize, not Pillow's)
//   media_probe decode IMAGE OUT [--mime M] [--max-pixels N] [--max-side N] [--max-bytes N]   (OUT: raw RGB)
//   media_probe preprocess IMAGE OUT_DIR [--config FILE] [--unified]   (pixel_values.f32, position_ids.i32;
//                                                          --unified: the 12B's Gemma4UnifiedImageProcessor)
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "media/image_decode.h"
#include "media/image_processor.h"
#include "media/image_resize.h"
#include "util/error.h"
#include "util/file.h"

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string text = qs::read_file(path);
  return {text.begin(), text.end()};
}

template <typename T>
void write_raw(const std::string& path, const std::vector<T>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
  if (!out) throw qs::Error(path + ": cannot write");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("media_probe: src/media's image decoding, resizing and preprocessing for external checks");
  app.require_subcommand(1);
  std::string in, out, mime, config;
  int width = 0, height = 0, channels = 0, out_width = 0, out_height = 0;
  bool torch = false, unified = false;
  qs::media::ImageLimits limits;

  auto* resize = app.add_subcommand("resize", "Pillow-exact bicubic resize of raw pixels");
  resize->add_option("in", in)->required();
  resize->add_option("out", out)->required();
  resize->add_option("width", width)->required();
  resize->add_option("height", height)->required();
  resize->add_option("channels", channels)->required();
  resize->add_option("out_width", out_width)->required();
  resize->add_option("out_height", out_height)->required();
  resize->add_flag("--torch", torch, "torch's (torchvision's) uint8 resize instead of Pillow's");

  auto* decode = app.add_subcommand("decode", "decode an image to raw RGB");
  decode->add_option("image", in)->required();
  decode->add_option("out", out)->required();
  decode->add_option("--mime", mime);
  decode->add_option("--max-pixels", limits.max_pixels);
  decode->add_option("--max-side", limits.max_side);
  decode->add_option("--max-bytes", limits.max_bytes);

  auto* preprocess = app.add_subcommand("preprocess", "decode and run Gemma 4's image preprocessing");
  preprocess->add_option("image", in)->required();
  preprocess->add_option("out_dir", out)->required();
  preprocess->add_option("--config", config, "processor_config.json or preprocessor_config.json");
  preprocess->add_flag("--unified", unified, "the 12B's Gemma4UnifiedImageProcessor");
  CLI11_PARSE(app, argc, argv);

  try {
    if (*resize) {
      const std::vector<uint8_t> pixels = read_bytes(in);
      const auto resize_fn = torch ? qs::media::resize_bicubic_torch : qs::media::resize_bicubic;
      write_raw(out, resize_fn(pixels, width, height, channels, out_width, out_height));
      return 0;
    }
    const std::vector<uint8_t> bytes = read_bytes(in);
    const qs::media::RgbImage image = qs::media::decode_image(bytes, limits, in, mime);
    if (*decode) {
      write_raw(out, image.rgb);
      std::cout << fmt::format(R"({{"width": {}, "height": {}}})", image.width, image.height) << "\n";
      return 0;
    }
    qs::media::ImageProcessorOptions options =
        config.empty() ? qs::media::ImageProcessorOptions{}
                       : qs::media::parse_image_processor_options(qs::read_file(config), config);
    options.unified = unified;
    const qs::media::PreprocessedImage result = qs::media::preprocess_image(image, options);
    write_raw(out + "/pixel_values.f32", result.pixel_values);
    write_raw(out + "/position_ids.i32", result.position_ids);
    std::cout << fmt::format(R"({{"width": {}, "height": {}, "num_patches": {}, "num_soft_tokens": {}}})",
                             image.width, image.height, result.num_patches, result.num_soft_tokens)
              << "\n";
    return 0;
  } catch (const qs::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
