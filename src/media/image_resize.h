#pragma once
// Pillow's antialiased bicubic resize (Image.resize(size, Image.BICUBIC) of Pillow 12.3, libImaging/Resample.c) on
// 8-bit interleaved pixels, reproduced to the bit: the Hugging Face Gemma 4 image processor resizes with it, and an
// engine one pixel level off already moves logits by ~1e-3.
#include <cstdint>
#include <span>
#include <vector>

namespace qs::media {

// `channels` (1..4) bytes per pixel, each resampled on its own: Pillow's modes L, RGB and RGBX. (Pillow resizes LA
// and RGBA premultiplied; the processor only ever resizes RGB.) Sizes must be positive; the same size copies.
std::vector<uint8_t> resize_bicubic(std::span<const uint8_t> pixels, int width, int height, int channels,
                                    int out_width, int out_height);

}  // namespace qs::media
