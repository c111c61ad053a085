#pragma once
// Antialiased bicubic resizes of 8-bit interleaved pixels, reproduced to the bit: Pillow's (Image.resize(size,
// Image.BICUBIC) of Pillow 12.3, libImaging/Resample.c), with which the Hugging Face Gemma 4 image processor resizes,
// and torch's (torchvision 0.29's resize of a uint8 tensor, BICUBIC, antialias=True, on the CPU: torch 2.15's
// _upsample_bicubic2d_aa in integer arithmetic), with which the 12B's Gemma4UnifiedImageProcessor resizes. An
// engine one pixel level off already moves logits by ~1e-3.
#include <cstdint>
#include <span>
#include <vector>

namespace qs::media {

// `channels` (1..4) bytes per pixel, each resampled on its own: Pillow's modes L, RGB and RGBX. (Pillow resizes LA
// and RGBA premultiplied; the processor only ever resizes RGB.) Sizes must be positive; the same size copies.
std::vector<uint8_t> resize_bicubic(std::span<const uint8_t> pixels, int width, int height, int channels,
                                    int out_width, int out_height);

// The same sizes, as torch resamples: the same kernel and box, but int16 weights with per-axis precision (at most
// 22 bits), the kernel's products in torch's order, and always the horizontal pass first, rounding to 8 bits between.
std::vector<uint8_t> resize_bicubic_torch(std::span<const uint8_t> pixels, int width, int height, int channels,
                                          int out_width, int out_height);

}  // namespace qs::media
