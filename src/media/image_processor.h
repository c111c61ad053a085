#pragma once
// Gemma 4's image preprocessing exactly as transformers 5.23's Gemma4ImageProcessorPil (the Pillow backend) and
// Gemma4Processor do it: the aspect-ratio-preserving resize to the patch budget (Pillow bicubic, image_resize.h),
// rescale and optional normalize in the processor's float arithmetic, patchify, (x, y) patch positions, the soft
// token count and the text a prompt's image placeholder expands to. The 12B's Gemma4UnifiedImageProcessor (a
// torchvision backend) is a variant: torch's resize, and the k x k patches of a soft token merged into one.
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "media/image_decode.h"

namespace qs::media {

// The image processor's settings (processor_config.json "image_processor", else preprocessor_config.json); the
// defaults are Gemma4ImageProcessorPil's class attributes.
struct ImageProcessorOptions {
  bool do_resize = true;        // resample must be 3 (bicubic): the only filter the processor uses
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = false;
  std::array<float, 3> image_mean{0.0f, 0.0f, 0.0f};
  std::array<float, 3> image_std{1.0f, 1.0f, 1.0f};
  int patch_size = 16;
  int max_soft_tokens = 280;  // one of 70, 140, 280, 560, 1120
  int pooling_kernel_size = 3;
  // Gemma4UnifiedImageProcessor (the 12B, set from the model's config, not the file): torch's bicubic resize on the
  // uint8 image, rescale in float32 (uint8 tensor x float), and patches of patch_size x pooling_kernel_size pixels,
  // each a soft token (patches_merge's raster order: the merged patch is the same pixels, row by row). Normalize is
  // refused (the 12B's processor has it off).
  bool unified = false;

  int max_patches() const { return max_soft_tokens * pooling_kernel_size * pooling_kernel_size; }
};

// Parses the JSON text of either file (`source` names it in errors); absent keys keep the defaults, unsupported
// values (another resample filter, do_convert_rgb false, a max_soft_tokens HF refuses) are errors naming the key.
ImageProcessorOptions parse_image_processor_options(std::string_view json_text, std::string_view source);
// From a checkpoint directory; the defaults when it has neither file.
ImageProcessorOptions read_image_processor_options(const std::filesystem::path& model_dir);
// The text of a processor_config.json holding these settings as its "image_processor" block, with the keys
// transformers' Gemma4Processor saves (checkpoints that `synth` writes carry one, as Google's do).
std::string processor_config_json(const ImageProcessorOptions& options);

struct PreprocessedImage {
  int num_patches = 0;
  // [num_patches, patch_size * patch_size * 3]: patches in row-major order, each its rows of pixels, each pixel
  // R, G, B (HF's layout). HF pads every image to max_patches() rows of zeros; they are left out here. Unified:
  // merged patches, (patch_size * pooling_kernel_size)^2 * 3 values each, padded to max_soft_tokens rows by HF.
  std::vector<float> pixel_values;
  std::vector<int32_t> position_ids;  // [num_patches, 2]: (x = patch column, y = patch row); HF pads with -1
  int num_soft_tokens = 0;            // num_patches / pooling_kernel_size^2
};

struct ResizeTarget {
  int height = 0, width = 0;
};
// get_aspect_ratio_preserving_size: the largest size whose sides are multiples of pooling_kernel_size x
// patch_size and whose patch count fits max_patches(), with the original's aspect ratio.
ResizeTarget aspect_ratio_preserving_size(int height, int width, const ImageProcessorOptions& options);

PreprocessedImage preprocess_image(const RgbImage& image, const ImageProcessorOptions& options);

// Gemma4Processor.replace_image_token: the chat template writes "<|image|>" where an image goes; the processor
// replaces it with the begin marker, one "<|image|>" per soft token and the end marker.
std::string expand_image_placeholder(int num_soft_tokens);
inline constexpr std::string_view kImageToken = "<|image|>";
inline constexpr std::string_view kBeginOfImage = "<|image>";
inline constexpr std::string_view kEndOfImage = "<image|>";

}  // namespace qs::media
