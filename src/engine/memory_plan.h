#pragma once
// Memory planning for one device: what the text decoder's weights cost, what the runtime needs besides them,
// and how many contexts of a given length the KV cache can then hold. `qatserve plan` prints it; the server
// sizes its KV pool with the same numbers, so the arithmetic lives here, once.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model_config.h"
#include "model/kv_cache.h"

namespace qs {

class Checkpoint;

// Text-decoder weights by what they do. Norms include every RMSNorm; Other is the per-layer layer_scalar.
enum class WeightClass { Embeddings, PerLayerEmbeddings, Attention, Mlp, Experts, Router, Norms, Other };
inline constexpr size_t kWeightClasses = 8;
std::string_view weight_class_name(WeightClass c);

struct WeightBytes {
  std::array<uint64_t, kWeightClasses> by_class{};
  // Beside the text decoder: the vision/audio towers and their embedders (held once images or audio are read);
  // not loaded: tensors the loader skips (a redundant lm_head copy of the tied embedding, k/v projections of
  // KV-shared layers, anything unknown).
  uint64_t towers = 0, unused = 0;
  // Part of PerLayerEmbeddings: the embed_tokens_per_layer table, gathered a row per token from the memory map.
  // On the cpu only the rows of tokens in use become resident; an accelerator holds it whole.
  uint64_t gathered_by_row = 0;
  // Known once a model is loaded: the int4 repack of a tied embedding that lies on the QAT grid, which the model
  // reads as its LM head (QAT exports' embeddings do); the bf16 table is then only gathered a row per token.
  uint64_t lm_head_int4 = 0;
  std::string source;  // what the numbers were computed from, for the report

  uint64_t& operator[](WeightClass c) { return by_class[static_cast<size_t>(c)]; }
  uint64_t operator[](WeightClass c) const { return by_class[static_cast<size_t>(c)]; }
  uint64_t total() const;  // the text decoder, the tied LM head counted once (it is the embedding)
  uint64_t held() const { return total() + lm_head_int4 + towers; }  // everything the model holds
  // Records the loaded model's int4 LM head of `bytes`, beside the Embeddings class it is made from.
  void add_int4_lm_head(uint64_t bytes);
};

enum class WeightFormat { Bf16, W4A16 };
WeightFormat parse_weight_format(const std::string& name);  // bf16 | w4a16

// From the config alone. bf16: 2 bytes a value. w4a16: each linear the QAT export packs costs in*out/2 (int4)
// + out*(in/group)*2 (bf16 scales) + 16 (the I64[2] weight_shape), as the files store it; everything else bf16.
// The vision and audio towers count as towers (model/gemma4_tower_tensors.h: their linears packed in w4a16 but the
// embedders' projections, as Google's ignore list has them); gemma4_unified's image and audio embedders (no towers)
// count as towers, bf16 in both formats.
WeightBytes weight_bytes_from_config(const ModelConfig& config, WeightFormat format);
// The bytes the checkpoint's tensors actually hold, classified against the architecture (packed int4 modules
// and per-expert tensors included), so a repacked checkpoint plans smaller than its bf16 source.
WeightBytes weight_bytes_from_checkpoint(const Checkpoint& checkpoint, const ModelConfig& config);

// The audio tower (audio_config of E2B/E4B) and embed_audio, apart from the text plan: weights as a checkpoint of
// `format` stores them (w4a16: every tower Linear packed, the embedder's projection bf16, as Google's `ignore`
// keeps it; convolution kernels, norms, clip bounds and the output bias bf16), and the activation peak of encoding
// one clip of `frames` feature frames (f32 buffers: the larger of the subsampling's and the conformer's).
struct AudioTowerPlan {
  uint64_t weights = 0, activations = 0;
  int64_t soft_tokens = 0;  // of the clip: ceil(frames / 4)
};
AudioTowerPlan audio_tower_plan(const Gemma4AudioConfig& audio, int64_t text_hidden, WeightFormat format,
                                int64_t frames);

struct Device {
  std::string name;
  uint64_t bytes = 0;
  bool accelerator = false;  // GPU/TPU: the runtime reserve adds a framework/driver context allowance
  std::string note;
};
// The named presets: tpu-v5e, tpu-v6e, l4, h100, h200 (not cpu, whose size is this machine's).
const std::vector<Device>& device_presets();

// Where this process's cgroup memory limit is read: the cgroup file system's mount point and the text of
// /proc/self/cgroup (which names the process's cgroup in each hierarchy). Tests point `root` at a fake tree.
struct CgroupFiles {
  std::filesystem::path root = "/sys/fs/cgroup";
  std::string self_cgroup;  // "0::/path" (v2) and/or "N:memory:/path" (v1) lines

  // The real ones; $QATSERVE_CGROUP_ROOT, when set, replaces the mount point (for tests of the whole command).
  static CgroupFiles of_this_process();
};
struct MemoryLimit {
  uint64_t bytes = 0;
  std::filesystem::path file;  // the file that set it: the smallest limit of the cgroup and its ancestors
};
// The memory limit a container runtime (Docker, Podman, Kubernetes) put on this process: cgroup v2 `memory.max`
// or v1 `memory.limit_in_bytes` of its cgroup and of every ancestor that the mount shows (a container usually
// sees only its own cgroup, at the root). "max" (v2) means no limit; none found: nullopt. A file that holds
// something else throws naming it.
std::optional<MemoryLimit> cgroup_memory_limit(const CgroupFiles& cgroup);

// A preset name (case-insensitive), "cpu" (MemTotal of `meminfo`, or the cgroup memory limit when that is lower:
// a container's RAM), or a size such as 48G / 48GiB / 512M (binary units; taken as an accelerator of that size).
// Throws naming the presets otherwise. The cpu Device's note says which limit it used.
Device resolve_device(const std::string& spec, const std::filesystem::path& meminfo = "/proc/meminfo",
                      const CgroupFiles& cgroup = CgroupFiles::of_this_process());
uint64_t meminfo_total_bytes(std::string_view meminfo_text, std::string_view label);
// A size such as 512M, 4G or 1.5GiB (binary units). Throws naming `what` (e.g. the flag) when it is not one.
uint64_t parse_byte_size(const std::string& text, std::string_view what);

struct PlanOptions {
  Device device;
  KvDtype kv_dtype = KvDtype::BF16;
  int64_t prefill_chunk = 512;  // tokens run through the model in one prefill step
  int64_t batch = 1;            // sequences decoded together (each needs a logits row)
  int64_t image_soft_tokens = 0;  // the largest image budget requests may ask; 0: the config's soft_tokens_per_image
  uint64_t adapter_bytes = 0;     // LoRA adapters held: plan's --max-loras x lora_adapter_bytes, serve's loaded ones
                                  // plus its free --max-loras slots when adapters load at run time
};

// Per-token KV of the layers that own a cache, as the engine's KvLayout stores it (int8: codes and a scale per KV
// head). KV-shared layers read their donor's cache and add nothing.
struct KvPerToken {
  int64_t sliding_layers = 0, full_layers = 0;  // layers that own a cache
  int64_t shared_layers = 0;                    // KV-shared layers: no cache of their own
  uint64_t sliding_bytes = 0;  // per token, bounded: a sliding layer never holds more than `window` tokens
  uint64_t full_bytes = 0;     // per token, growing with the context
  int64_t window = 0;

  // KV of one sequence of n tokens: full_bytes * n + sliding_bytes * min(n, window).
  uint64_t bytes_for_context(int64_t n) const;
};
KvPerToken kv_per_token(const Gemma4TextConfig& text, KvDtype dtype);

// Runtime reserve, everything besides weights and KV (f32 work buffers, as the engine computes in f32):
//   activations  the forward pass's scratch for one step of (prefill_chunk + batch) rows, each 4 B x (3 x hidden
//                + 2 x the wider of FFN and hidden + 2 x widest query projection + per-layer inputs + K/V values of
//                the owning layers + the widest linear input, packed; with experts also 3 x hidden + experts +
//                2 x top_k x (hidden + expert width)) + the KV bytes per token of a bf16/int8 cache (this step's
//                K/V as the cache stores them); runtime_reserve's comments name each buffer
//   logits       batch x vocab x 4 B
//   fixed        256 MiB: allocator slack, tokenizer, thread stacks, rope tables
//   accelerator  1 GiB on GPU/TPU: CUDA/XLA context, kernel workspaces
//   image        with a vision tower: encoding one image of soft_tokens_per_image (or the largest budget
//                allowed, PlanOptions::image_soft_tokens) x pooling^2 patches, 4 B x
//                (pixels 3 patch^2 + 3 x hidden + queries, keys, values and attention output + 2 x MLP width +
//                the clipped linears' clamped input copies, 3 x the wider of hidden and MLP width) per patch
//   audio        with an audio tower: encoding one clip of kPlannedClipSeconds (audio_tower_plan)
//   adapters     LoRA adapters (PlanOptions::adapter_bytes): a slot is an adapter of the largest rank allowed on
//                every linear and expert parameter an adapter may target (lora_adapter_bytes), as vLLM reserves
//                max_loras slots of max_lora_rank
// Media items are encoded one at a time, so the total holds the larger of image and audio.
inline constexpr int64_t kPlannedClipSeconds = 30, kAudioFramesPerSecond = 100;
struct RuntimeReserve {
  uint64_t activations = 0, logits = 0, fixed = 0, accelerator = 0, image = 0, audio = 0, adapters = 0;
  uint64_t total() const { return activations + logits + fixed + accelerator + std::max(image, audio) + adapters; }
};
RuntimeReserve runtime_reserve(const ModelConfig& config, const PlanOptions& options);
// One LoRA adapter of `rank` on every linear of the text decoder an adapter may target (attention q/k/v/o, MLP
// gate/up/down, the MoE router's projection, the per-layer-embedding projections; model/lora_adapter.h) and of the
// vision and audio towers or the 12B's embedders (PEFT's all-linear on Gemma4ForConditionalGeneration reaches them), A [rank, in] and
// B [out, rank] held in f32 as the engine holds them, and on the MoE experts' gate_up_proj and down_proj (PEFT's
// target_parameters; model/lora_experts.h), rank per expert, as vLLM's MoE LoRA slots reserve them.
uint64_t lora_adapter_bytes(const ModelConfig& config, int64_t rank);
// One image of `soft_tokens` (0: the config's soft_tokens_per_image) through the vision tower.
uint64_t vision_image_activation_bytes(const Gemma4VisionConfig& vision, int64_t soft_tokens = 0);

struct MemoryPlan {
  Device device;
  KvDtype kv_dtype = KvDtype::BF16;
  WeightBytes weights;
  RuntimeReserve reserve;
  KvPerToken kv;
  int64_t max_position_embeddings = 0;
  uint64_t kv_available = 0;  // device - weights - reserve, 0 when that is negative
  bool weights_fit = false;   // weights + reserve <= device

  uint64_t kv_bytes_for_context(int64_t n) const { return kv.bytes_for_context(n); }
  // What the process keeps resident on the cpu besides its KV pool: weights but the row-gathered table, reserve.
  uint64_t cpu_resident_without_kv() const { return weights.held() - weights.gathered_by_row + reserve.total(); }
  // How many sequences of context_len tokens the KV budget holds at once (0 when the weights do not fit).
  int64_t contexts_that_fit(int64_t context_len) const;
  // The longest single context the KV budget holds (not capped at max_position_embeddings).
  int64_t longest_context() const;
};

MemoryPlan plan_memory(const ModelConfig& config, const WeightBytes& weights, const PlanOptions& options);

// The KV pool `serve` takes without --kv-memory: room for `sequences` contexts of `context` tokens, but at most
// half of what the plan leaves for KV. On the cpu device that is MemTotal less weights and reserve, which the OS,
// other processes and the page cache share, and a pool that overcommits RAM pages out under load.
uint64_t default_kv_budget(const MemoryPlan& plan, int64_t sequences, int64_t context);

// The --max-model-len `serve` takes when none is given, and `plan` reports beside its table: the model's own
// context (max_position_embeddings, kDefaultContext when the config states none) when the KV pool serve builds
// holds it for one sequence, else the longest sequence that pool holds. The pool is what serve builds without
// --max-model-len: `kv_budget` bytes (--kv-memory, else default_kv_budget for `sequences` contexts of the model's
// length) split as kv_pool_for_budget splits it, a window of the sliding layers for each of `sequences` sequences
// and the rest to the full layers, in blocks of `block_size` positions. Throws, with the numbers and what to
// change, when the pool holds less than one block of a sequence.
inline constexpr int64_t kDefaultContext = 8192;
struct ContextChoice {
  int64_t tokens = 0;       // the chosen --max-model-len
  uint64_t kv_budget = 0;   // the pool's bytes
  std::string reason;       // why that length, for the log and the report
};
ContextChoice choose_max_model_len(const Gemma4TextConfig& text, const KvLayout& layout, uint64_t kv_budget,
                                   int64_t sequences);
// The same from a plan (its KV dtype, blocks of 16, the budget default_kv_budget gives `sequences` contexts).
ContextChoice choose_max_model_len(const MemoryPlan& plan, const Gemma4TextConfig& text, int64_t sequences);

// The readable table and the JSON of `qatserve plan`, for sequences of `context_len` tokens.
// With a ContextChoice, they also report the --max-model-len serve would choose.
std::string format_memory_plan(const MemoryPlan& plan, int64_t context_len, const std::string& model_label,
                               const ContextChoice* choice = nullptr);
nlohmann::ordered_json memory_plan_json(const MemoryPlan& plan, int64_t context_len, const std::string& model_label,
                                        const ContextChoice* choice = nullptr);

}  // namespace qs
