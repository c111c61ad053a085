// WebP through libwebp's animation decoder, as Pillow 12.3 reads every WebP (still or animated): the first frame
// composed on the canvas, RGBA not premultiplied; without an alpha flag Pillow's mode is RGB (alpha dropped).
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>
#include <fmt/format.h>
#include <memory>

#include "media/image_codecs.h"
#include "util/error.h"

namespace qs::media {

DecodedImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what) {
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(bytes.data(), bytes.size(), &features) != VP8_STATUS_OK) {
    throw Error(fmt::format("{}: invalid WebP header", what));
  }
  check_dimensions(features.width, features.height, limits, what, "WebP");
  const WebPData data{bytes.data(), bytes.size()};
  // The decoder allocates its canvas from the container's size, which WebPGetFeatures reported and we checked.
  std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> decoder(WebPAnimDecoderNew(&data, nullptr),
                                                                       WebPAnimDecoderDelete);
  WebPAnimInfo info;
  if (!decoder || !WebPAnimDecoderGetInfo(decoder.get(), &info)) {
    throw Error(fmt::format("{}: corrupt WebP container", what));
  }
  check_dimensions(info.canvas_width, info.canvas_height, limits, what, "WebP");
  uint8_t* frame = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(decoder.get(), &frame, &timestamp)) {
    throw Error(fmt::format("{}: corrupt or truncated WebP image data", what));
  }
  DecodedImage out{static_cast<int>(info.canvas_width), static_cast<int>(info.canvas_height), features.has_alpha != 0};
  const size_t pixels = static_cast<size_t>(info.canvas_width) * info.canvas_height;
  const int channels = out.channels();
  out.pixels.resize(pixels * channels);
  for (size_t i = 0; i < pixels; ++i) std::memcpy(&out.pixels[i * channels], frame + i * 4, channels);
  return out;
}

}  // namespace qs::media
