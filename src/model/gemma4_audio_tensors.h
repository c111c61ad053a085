#pragma once
// Every tensor of the Gemma 4 audio tower and embed_audio, as a checkpoint names them (Gemma4ForConditionalGeneration
// keys), with its shape as a bf16 export stores it. The planner sizes the tower from it and the benchmark writes a
// synthetic tower from it; tests hold it to the tensors transformers saves.
#include <cstdint>
#include <string>
#include <vector>

#include "formats/model_config.h"

namespace qs {

struct AudioTensor {
  std::string name;
  std::vector<int64_t> shape;
  // A tower Linear ([out, in], name ends in ".weight"): a w4a16 export packs it (module.weight_packed /
  // weight_scale / weight_shape). The embedder's projection stays bf16, as Google's `ignore` keeps it.
  bool packed_in_w4a16 = false;
};

std::vector<AudioTensor> gemma4_audio_tensors(const Gemma4AudioConfig& audio, int64_t text_hidden);

}  // namespace qs
