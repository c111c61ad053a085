#pragma once
// The prefix cache's second tier: complete KV blocks that leave RAM (evicted from the pool, or still cached when
// the pool is destroyed) are written to a directory, and read back when a later sequence, in this process or a
// later one, starts with the same tokens.
//
// A file holds one block of one layer class (kv_cache.h: full-attention or sliding-window layers): a header that
// says what the block is, its bytes, and a checksum over both:
//   "QSKVBLK1", u32 version, u32 class, u64 identity, u64 adapter, u64 key, u64 parent, u32 block_size, u32 dtype,
//   u64 data bytes, i32 tokens[block_size], data, u64 checksum (of everything before it)
// little-endian, as this machine writes it. `identity` stands for everything that decides the K/V bytes besides
// the tokens: the model (its config and tensors' headers), the activations' precision, the KV dtype and the
// layout (DiskTierOptions::identity, made by the caller); `adapter` for a LoRA adapter (0: none). The tokens are
// the prefix cache's key ids, which already stand for media content (engine.cc, key_media_positions); the key
// chains them with every earlier block's, so a block is trusted only with its key, parent and own tokens equal.
//
// Files live in DIR/<identity as 16 hex digits>/, named <key as 16 hex digits>-<class>.kvb, so two models (or one
// model at two precisions) sharing a directory never read each other's blocks, and each keeps its own bound:
// past `max_bytes` the least recently used files are removed. A file whose header, length or checksum does not
// match is never used: a warning names it and it is removed. A write that fails (a full disk, a missing
// directory) is a warning and a counter, never an error of the request that caused it; it is written to a
// temporary name and renamed, so a reader never sees half a block.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_map>

namespace qs {

struct DiskTierOptions {
  std::filesystem::path dir;
  uint64_t max_bytes = 0;
  uint64_t identity = 0;  // what decides the K/V bytes besides the tokens (see above)
  uint64_t adapter = 0;   // the LoRA adapter's identity; 0: none
  std::function<void(const std::string&)> warn;  // one line per problem; default: stderr
};

// A block as the pool describes it: where it stands in its prefix, and its class's bytes.
struct DiskBlockId {
  uint64_t key = 0, parent = 0;
  std::span<const int32_t> tokens;
  int kv_class = 0;
  int32_t dtype = 0;
};

struct DiskTierStats {
  uint64_t stored = 0;        // blocks written
  uint64_t loaded = 0;        // blocks read back into the pool
  uint64_t rejected = 0;      // files found corrupt, truncated or foreign (removed)
  uint64_t write_errors = 0;  // writes that failed (the block stays only in RAM, if anywhere)
  uint64_t removed = 0;       // files removed to stay within max_bytes
  uint64_t files = 0, bytes = 0;  // held now
};

class KvDiskTier {
 public:
  // Indexes the files already in the directory (the most recently written are used first); creates it if needed.
  // Throws naming the directory only when it cannot be created or listed.
  explicit KvDiskTier(DiskTierOptions options);

  bool contains(uint64_t key, int kv_class) const { return index_.count(file_key(key, kv_class)) > 0; }
  // Writes a block unless it is there already; false (and a warning) when it could not be written.
  bool store(const DiskBlockId& id, std::span<const std::byte> data);
  // Reads a block into `data` (its exact size); false when it is absent or does not match `id` (then it is
  // removed, with a warning).
  bool load(const DiskBlockId& id, std::span<std::byte> data);
  const DiskTierStats& stats() const { return stats_; }
  const std::filesystem::path& directory() const { return dir_; }

 private:
  struct Entry {
    uint64_t bytes = 0, used = 0;  // file size, and the tick of its last write or read
  };
  static std::string file_key(uint64_t key, int kv_class);
  std::filesystem::path path_of(const std::string& name) const { return dir_ / (name + ".kvb"); }
  std::string header(const DiskBlockId& id, uint64_t data_bytes) const;
  void touch(const std::string& name);
  void make_room(uint64_t bytes);
  void forget(const std::string& name);
  void reject(const std::string& name, const std::string& why);
  void warn(const std::string& line) const;

  DiskTierOptions options_;
  std::filesystem::path dir_;
  std::unordered_map<std::string, Entry> index_;
  std::map<uint64_t, std::string> by_use_;  // tick -> file, least recently used first
  uint64_t tick_ = 0;
  bool warned_bound_ = false;  // a block larger than the bound is said once, not for every block
  DiskTierStats stats_;
};

// A 64-bit hash of bytes (FNV-1a's scheme, 8 bytes a step, splitmix64's finaliser): the checksum of the files and
// the identity of what a caller hashes into DiskTierOptions::identity.
uint64_t hash_bytes(std::span<const std::byte> bytes, uint64_t seed = 0);
uint64_t hash_text(std::string_view text, uint64_t seed = 0);

}  // namespace qs
