#pragma once
// Every tensor of the Gemma 4 vision and audio towers and their embedders, as a checkpoint names them
// (Gemma4ForConditionalGeneration keys), with its shape as a bf16 export stores it: synth writes them, repack packs
// their linears, inspect and the planner count them, tests hold them to the tensors transformers saves. The loaders
// (gemma4_vision.cc, gemma4_audio_load.cc) read the same names.
#include <vector>

#include "formats/model_config.h"
#include "model/gemma4_tensors.h"

namespace qs {

// A tower Linear ([out, in], role Linear) is quantized_in_w4a16: a w4a16 export packs it (module.weight_packed /
// weight_scale / weight_shape); the embedders' projections stay bf16, as Google's `ignore` keeps them. Clip bounds
// of clipped linears are role ClipBound (scalars), position tables, convolution kernels, biases and scales
// role TowerParameter.
std::vector<ArchTensor> gemma4_vision_tensors(const Gemma4VisionConfig& vision, int64_t text_hidden);
std::vector<ArchTensor> gemma4_audio_tensors(const Gemma4AudioConfig& audio, int64_t text_hidden);

enum class Tower { Vision, Audio };
// (model.vision_embedder: the 12B's image embedder as its files name it.)
inline constexpr const char* kVisionTensorPrefixes[] = {"model.vision_tower.", "model.embed_vision.",
                                                        "model.vision_embedder."};
inline constexpr const char* kAudioTensorPrefixes[] = {"model.audio_tower.", "model.embed_audio."};
// Whether a checkpoint key belongs to a tower (or its embedder), and to which.
bool is_tower_tensor(const std::string& name);
bool is_tower_tensor(const std::string& name, Tower tower);

// The towers the config describes (vision_config, audio_config), in that order.
std::vector<ArchTensor> gemma4_tower_tensors(const ModelConfig& config);
std::vector<ArchTensor> gemma4_tower_tensors(const ModelConfig& config, Tower tower);

}  // namespace qs
