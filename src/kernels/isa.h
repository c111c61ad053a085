#pragma once
// The instruction set every CPU kernel family runs with: the linears (bf16, int4 and W4A8's VNNI), attention,
// gelu/tanh (and the logit soft-cap, a tanh), and the row operations of ops.h (dots, scaled adds, bf16 rounding).
// One process-wide choice: the widest this CPU has, unless a test or benchmark picks a narrower one. AVX-512 and
// AVX2 give the same bits in every family; the portable path differs where its order or its tanh does (ops.h,
// linear.h).
#include <string_view>
#include <vector>

namespace qs {

enum class Isa { Avx512, Avx2, Portable };  // Avx512: F, BW and VL; Avx2: with FMA

bool cpu_has(Isa isa);
std::vector<Isa> cpu_isas();  // those this CPU has, widest first
Isa kernel_isa();
void set_kernel_isa(Isa isa);  // throws when the CPU lacks it
const char* isa_name(Isa isa);
Isa parse_isa(std::string_view name);  // avx512 | avx2 | portable; throws naming the choices

}  // namespace qs
