#include "kernels/isa.h"

#include <fmt/format.h>

#include <atomic>

#include "util/error.h"

namespace qs {
namespace {

constexpr Isa kAll[] = {Isa::Avx512, Isa::Avx2, Isa::Portable};

Isa widest() {
  for (Isa isa : kAll)
    if (cpu_has(isa)) return isa;
  return Isa::Portable;
}

// Read on every kernel call (a relaxed load), written only by set_kernel_isa; initialised on first use, so that
// kernels run from other files' static initialisers see the CPU's choice too.
std::atomic<Isa>& chosen() {
  static std::atomic<Isa> isa{widest()};
  return isa;
}

}  // namespace

bool cpu_has(Isa isa) {
  __builtin_cpu_init();  // may run before libgcc's own initialiser has (from static initialisers)
  switch (isa) {
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Portable: return true;
  }
  return false;
}

std::vector<Isa> cpu_isas() {
  std::vector<Isa> isas;
  for (Isa isa : kAll)
    if (cpu_has(isa)) isas.push_back(isa);
  return isas;
}

Isa kernel_isa() { return chosen().load(std::memory_order_relaxed); }

void set_kernel_isa(Isa isa) {
  if (!cpu_has(isa)) throw Error(fmt::format("this CPU cannot run the {} kernels", isa_name(isa)));
  chosen() = isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Portable: return "portable";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : kAll)
    if (name == isa_name(isa)) return isa;
  throw Error(fmt::format("instruction set '{}': expected avx512, avx2 or portable", name));
}

}  // namespace qs
