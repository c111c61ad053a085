// libFuzzer target: arbitrary bytes as an uploaded image. decode_image must either throw qs::Error naming the part
// or return an RGB image within the limits, which the bicubic resizes (Pillow's and, for the 12B, torch's) then
// shrink; never crash, leak or hang.
// Limits are small so that inputs declaring large images are refused before decoding, as the server refuses them.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "media/image_decode.h"
#include "media/image_resize.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qs::media::ImageLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;
  limits.max_bytes = 1 << 20;
  qs::media::RgbImage image;
  try {
    image = qs::media::decode_image({data, size}, limits, "fuzz image");
  } catch (const qs::Error& e) {
    if (std::string_view(e.what()).substr(0, 11) != "fuzz image:") {
      std::fprintf(stderr, "error does not name the part: %s\n", e.what());
      std::abort();
    }
    return 0;
  }
  if (image.width <= 0 || image.height <= 0 || image.width > limits.max_side || image.height > limits.max_side ||
      int64_t{image.width} * image.height > limits.max_pixels ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    std::abort();
  }
  for (const auto resize : {qs::media::resize_bicubic, qs::media::resize_bicubic_torch}) {
    const std::vector<uint8_t> small = resize(image.rgb, image.width, image.height, 3, 1 + image.width / 3,
                                              1 + image.height / 2);
    if (small.size() != static_cast<size_t>(1 + image.width / 3) * (1 + image.height / 2) * 3) std::abort();
  }
  return 0;
}
