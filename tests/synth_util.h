#pragma once
// Synthetic checkpoints as test fixtures.
#include <filesystem>

#include "checkpoint_tools/synth.h"

namespace qs::test {

// Writes the checkpoint `o` describes, without progress output; returns its directory.
inline std::filesystem::path synth_quietly(SynthOptions o) {
  o.progress = false;
  synth_checkpoint(o);
  return o.out;
}

}  // namespace qs::test
