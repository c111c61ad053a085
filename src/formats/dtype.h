#pragma once
// safetensors dtype strings and element sizes, and the bf16 <-> f32 conversions every layer above uses.
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace qs {

enum class DType : uint8_t { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

std::optional<DType> parse_dtype(std::string_view name);
std::string_view dtype_name(DType t);
size_t dtype_size(DType t);

inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Tensor bytes in a file carry no alignment guarantee: read them through memcpy.
template <typename T>
inline T load_unaligned(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace qs
