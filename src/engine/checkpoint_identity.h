#pragma once
// What stands for a checkpoint's contents in the prefix cache's disk tier (kv_disk_tier.h): blocks written by one
// model are never read by another.
#include <cstdint>

namespace qs {

class Checkpoint;

// A hash of config.json, every tensor's name, dtype and shape, and samples of its bytes: its first, middle and last
// 4 KiB (not all of it: the per-layer embedding table, gigabytes read a row per token, would become resident).
// Two checkpoints that differ only outside those samples of every tensor would share an identity; a retrained,
// requantized or repacked one differs in every tensor.
uint64_t checkpoint_identity(const Checkpoint& checkpoint);

}  // namespace qs
