// The whole forward pass (prefill then decode steps) with each vector instruction set this CPU has, on synthetic
// models of both Gemma 4 shapes: AVX2 gives AVX-512's logits bit for bit in every precision, as each kernel family
// promises (attention_test, ops_test and linear_test check each family against its reference; the portable
// kernels, which sum in another order, are checked against transformers in transformers_parity_test).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "checkpoint_tools/synth.h"
#include "kernels/isa.h"
#include "model/gemma4.h"
#include "synth_util.h"
#include "test_util.h"

namespace qs {
namespace {

std::vector<float> prefill_and_decode(const Gemma4Model& model) {
  KvCache cache = model.new_cache(64);
  const std::vector<int32_t> prompt = {2, 17, 300, 41, 5, 99, 7, 1000, 3, 12, 250, 64, 8, 19, 77, 31, 400, 6};
  std::vector<float> logits = model.forward(prompt, cache, true);
  for (int32_t id : {42, 7, 511, 90}) {
    const std::vector<float> step = model.forward(std::span(&id, 1), cache, false);
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

TEST(KernelIsa, TheForwardPassGivesTheSameLogitsWithEveryVectorInstructionSet) {
  for (const char* preset : {"e2b-tiny", "26b-a4b-tiny"}) {
    test::TempDir tmp;
    const auto dir = test::synth_quietly({.preset = preset, .format = CheckpointFormat::W4A16, .out = tmp / "m"});
    for (Precision precision : {Precision::F32, Precision::BF16, Precision::Int8}) {
      SCOPED_TRACE(std::string(preset) + " " + std::string(precision_name(precision)));
      const auto model = Gemma4Model::load(dir, precision);
      std::vector<float> widest;
      test::for_each_isa([&] {
        if (kernel_isa() == Isa::Portable) return;
        const std::vector<float> logits = prefill_and_decode(*model);
        if (widest.empty()) widest = logits;
        ASSERT_EQ(logits.size(), widest.size());
        EXPECT_EQ(0, std::memcmp(logits.data(), widest.data(), logits.size() * sizeof(float)));
      });
    }
  }
}

}  // namespace
}  // namespace qs
