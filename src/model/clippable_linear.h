#pragma once
// Gemma4ClippableLinear (transformers' modeling_gemma4.py), shared by the vision and the audio tower: a linear whose
// input is clamped to [input_min, input_max] and output to [output_min, output_max], bounds the checkpoint stores
// (infinite when the config does not use clipped linears).

#include <limits>
#include <string>

#include "kernels/linear.h"

namespace qs {

struct ClippableLinear {
  LinearWeight linear;
  std::string module;  // the inner nn.Linear's name in transformers ("...q_proj.linear"), as a LoRA adapter names it
  float input_min = -std::numeric_limits<float>::infinity(), input_max = std::numeric_limits<float>::infinity();
  float output_min = -std::numeric_limits<float>::infinity(), output_max = std::numeric_limits<float>::infinity();
};

}  // namespace qs
