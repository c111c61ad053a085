// The first frame of a GIF through giflib, as Pillow 12.3's GifImagePlugin loads it: the canvas is the logical
// screen grown to hold the frame, pixels outside the frame hold the transparent index (else 0), a palette that is
// the identity gray ramp (or none) means mode L (value = index), indices past the palette are black, and the
// graphic control extension's transparent index becomes alpha 0.
#include <gif_lib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <fmt/format.h>

#include "media/image_codecs.h"
#include "util/error.h"

namespace qs::media {
namespace {

struct GifSource {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
};

int read_bytes(GifFileType* gif, GifByteType* out, int count) {
  auto* source = static_cast<GifSource*>(gif->UserData);
  const size_t n = std::min(static_cast<size_t>(count), source->bytes.size() - source->offset);
  std::memcpy(out, source->bytes.data() + source->offset, n);
  source->offset += n;
  return static_cast<int>(n);
}

struct GifCloser {
  void operator()(GifFileType* gif) const {
    int error = 0;
    DGifCloseFile(gif, &error);
  }
};
using GifHandle = std::unique_ptr<GifFileType, GifCloser>;

[[noreturn]] void fail(std::string_view what, int error) {
  const char* message = GifErrorString(error);
  throw Error(fmt::format("{}: corrupt or truncated GIF: {}", what, message ? message : "giflib failed"));
}

// Pillow drops a palette that maps every index i to (i, i, i) and decodes the frame as L.
bool is_gray_ramp(const ColorMapObject* map) {
  for (int i = 0; i < map->ColorCount; ++i) {
    const GifColorType& c = map->Colors[i];
    if (c.Red != i || c.Green != i || c.Blue != i) return false;
  }
  return true;
}

// RGBA for each of the 256 indices.
std::vector<uint8_t> colour_table(const ColorMapObject* map, int transparent) {
  std::vector<uint8_t> table(256 * 4, 0);
  const bool gray = map == nullptr || is_gray_ramp(map);
  for (int i = 0; i < 256; ++i) {
    uint8_t* t = &table[i * 4];
    if (gray) {
      t[0] = t[1] = t[2] = static_cast<uint8_t>(i);
    } else if (i < map->ColorCount) {
      t[0] = map->Colors[i].Red, t[1] = map->Colors[i].Green, t[2] = map->Colors[i].Blue;
    }
    t[3] = i == transparent ? 0 : 255;
  }
  return table;
}

// Skips extension blocks up to the first image descriptor; returns the transparent index its graphic control
// extension sets (-1 for none).
int seek_first_image(GifFileType* gif, std::string_view what) {
  int transparent = -1;
  while (true) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) fail(what, gif->Error);
    if (type == IMAGE_DESC_RECORD_TYPE) return transparent;
    if (type == TERMINATE_RECORD_TYPE) throw Error(fmt::format("{}: the GIF holds no image", what));
    if (type != EXTENSION_RECORD_TYPE) continue;
    int code = 0;
    GifByteType* block = nullptr;
    if (DGifGetExtension(gif, &code, &block) == GIF_ERROR) fail(what, gif->Error);
    if (code == GRAPHICS_EXT_FUNC_CODE && block && block[0] >= 4 && (block[1] & 1)) transparent = block[4];
    while (block) {
      if (DGifGetExtensionNext(gif, &block) == GIF_ERROR) fail(what, gif->Error);
    }
  }
}

// The row each decoded line of an interlaced frame belongs to (GIF's four passes).
std::vector<int> line_order(int height, bool interlaced) {
  std::vector<int> order;
  if (!interlaced) {
    for (int y = 0; y < height; ++y) order.push_back(y);
    return order;
  }
  constexpr int kStart[] = {0, 4, 2, 1}, kStep[] = {8, 8, 4, 2};
  for (int pass = 0; pass < 4; ++pass) {
    for (int y = kStart[pass]; y < height; y += kStep[pass]) order.push_back(y);
  }
  return order;
}

}  // namespace

DecodedImage decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits, std::string_view what) {
  GifSource source{bytes};
  int error = 0;
  GifHandle gif(DGifOpen(&source, read_bytes, &error));
  if (!gif) fail(what, error);
  const int transparent = seek_first_image(gif.get(), what);
  if (DGifGetImageDesc(gif.get()) == GIF_ERROR) fail(what, gif->Error);
  const GifImageDesc& frame = gif->Image;
  check_dimensions(frame.Width, frame.Height, limits, what, "GIF frame");
  const int64_t width = std::max<int64_t>(gif->SWidth, int64_t{frame.Left} + frame.Width);
  const int64_t height = std::max<int64_t>(gif->SHeight, int64_t{frame.Top} + frame.Height);
  check_dimensions(width, height, limits, what, "GIF");

  std::vector<uint8_t> indices(static_cast<size_t>(width) * height, transparent >= 0 ? transparent : 0);
  std::vector<GifPixelType> line(frame.Width);
  for (int y : line_order(frame.Height, frame.Interlace)) {
    if (DGifGetLine(gif.get(), line.data(), frame.Width) == GIF_ERROR) fail(what, gif->Error);
    std::memcpy(&indices[(static_cast<size_t>(frame.Top) + y) * width + frame.Left], line.data(), frame.Width);
  }
  const ColorMapObject* map = frame.ColorMap ? frame.ColorMap : gif->SColorMap;
  const std::vector<uint8_t> table = colour_table(map, transparent);
  DecodedImage out{static_cast<int>(width), static_cast<int>(height), transparent >= 0};
  const int channels = out.channels();
  out.pixels.resize(indices.size() * channels);
  for (size_t i = 0; i < indices.size(); ++i) std::memcpy(&out.pixels[i * channels], &table[indices[i] * 4], channels);
  return out;
}

}  // namespace qs::media
