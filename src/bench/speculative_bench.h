#pragma once
// `bench --speculative`: speculative decoding beside plain decoding through the engine (Generator), and what one
// round costs on the target and the drafter (bench.h: SpeculativeReport).
#include <functional>
#include <string>

#include "bench/bench.h"
#include "model/gemma4.h"

namespace qs {

SpeculativeReport speculative_bench(const Gemma4Model& model, const BenchOptions& o, const ReadBytes& rb,
                                    const std::function<void(const std::string&)>& log);

}  // namespace qs
