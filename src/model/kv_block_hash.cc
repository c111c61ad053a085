#include "model/kv_block_hash.h"

#include <openssl/sha.h>

#include <cstdlib>
#include <vector>

namespace qs {
namespace {

// Canonical CBOR (RFC 8949 4.2.1: the shortest head), as cbor2.dumps(..., canonical=True) writes it.
void cbor_head(std::vector<uint8_t>& out, uint8_t major, uint64_t value) {
  const uint8_t m = static_cast<uint8_t>(major << 5);
  if (value < 24) {
    out.push_back(m | static_cast<uint8_t>(value));
    return;
  }
  int bytes = value <= 0xff ? 1 : value <= 0xffff ? 2 : value <= 0xffffffffull ? 4 : 8;
  out.push_back(m | static_cast<uint8_t>(bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27));
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void cbor_int(std::vector<uint8_t>& out, int64_t v) {
  if (v >= 0) cbor_head(out, 0, static_cast<uint64_t>(v));
  else cbor_head(out, 1, static_cast<uint64_t>(-(v + 1)));
}

void cbor_text(std::vector<uint8_t>& out, std::string_view s) {
  cbor_head(out, 3, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

VllmBlockHash sha256(const std::vector<uint8_t>& bytes) {
  VllmBlockHash digest;
  SHA256(bytes.data(), bytes.size(), digest.data());
  return digest;
}

}  // namespace

VllmBlockHash vllm_none_hash(std::string_view seed) {
  std::vector<uint8_t> cbor;
  cbor_text(cbor, seed);
  return sha256(cbor);
}

std::string vllm_default_hash_seed() {
  const char* seed = std::getenv("PYTHONHASHSEED");
  return seed ? seed : "vllm-none-hash";
}

VllmBlockHash vllm_block_hash(const VllmBlockHash& parent, std::span<const int32_t> tokens,
                              std::string_view lora_name) {
  std::vector<uint8_t> cbor;
  cbor.reserve(48 + tokens.size() * 5);
  cbor_head(cbor, 4, 3);  // (parent, tokens, extra keys)
  cbor_head(cbor, 2, parent.size());
  cbor.insert(cbor.end(), parent.begin(), parent.end());
  cbor_head(cbor, 4, tokens.size());
  for (int32_t t : tokens) cbor_int(cbor, t);
  if (lora_name.empty()) {
    cbor.push_back(0xf6);  // null
  } else {
    cbor_head(cbor, 4, 1);
    cbor_text(cbor, lora_name);
  }
  return sha256(cbor);
}

uint64_t vllm_external_hash(const VllmBlockHash& hash) {
  uint64_t v = 0;
  for (size_t i = hash.size() - 8; i < hash.size(); ++i) v = (v << 8) | hash[i];
  return v;
}

}  // namespace qs
