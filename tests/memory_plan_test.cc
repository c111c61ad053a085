// Memory planning: every expected number below is derived by hand from the configs (configs/*.json) and the
// formulas in memory_plan.h, not by calling the code under test a second way.
#include "engine/memory_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "checkpoint_tools/synth.h"
#include "formats/checkpoint.h"
#include "synth_util.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t MiB = 1ull << 20, GiB = 1ull << 30;

ModelConfig preset(const std::string& name) { return parse_model_config(preset_config_text(name), name); }

struct KvCase {
  const char* preset;
  int64_t sliding_layers, full_layers;
  uint64_t sliding_bytes, full_bytes;
  int64_t window;
  uint64_t sliding_heads, full_heads;  // KV heads summed over the owning layers (int8: a scale each for K and V)
};

TEST(MemoryPlan, KvPerTokenOfTheRealConfigsByHand) {
  // Per token an owning layer stores K and V: 2 x kv_heads x head_dim x 2 bytes (bf16).
  const KvCase cases[] = {
      // E2B: layers 0-14 own KV (15-34 are KV-shared): 12 sliding x 1 head x 256, 3 full (4, 9, 14) x 1 x 512.
      {"e2b", 12, 3, 12 * 2 * 1 * 256 * 2, 3 * 2 * 1 * 512 * 2, 512, 12, 3},  // 12288, 6144
      // E4B: layers 0-23 own KV: 20 sliding x 2 heads x 256, 4 full (5, 11, 17, 23) x 2 x 512.
      {"e4b", 20, 4, 20 * 2 * 2 * 256 * 2, 4 * 2 * 2 * 512 * 2, 512, 40, 8},  // 40960, 16384
      // 26B-A4B: no sharing; k_eq_v full layers use num_global_key_value_heads = 2 (V still cached).
      {"26b-a4b", 25, 5, 25 * 2 * 8 * 256 * 2, 5 * 2 * 2 * 512 * 2, 1024, 200, 10},  // 204800, 20480
      // 31B: 50 sliding x 16 x 256, 10 full x 4 x 512.
      {"31b", 50, 10, 50 * 2 * 16 * 256 * 2, 10 * 2 * 4 * 512 * 2, 1024, 800, 40},  // 819200, 81920
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.preset);
    KvPerToken kv = kv_per_token(preset(c.preset).text, KvDtype::BF16);
    EXPECT_EQ(kv.sliding_layers, c.sliding_layers);
    EXPECT_EQ(kv.full_layers, c.full_layers);
    EXPECT_EQ(kv.sliding_bytes, c.sliding_bytes);
    EXPECT_EQ(kv.full_bytes, c.full_bytes);
    EXPECT_EQ(kv.window, c.window);
    EXPECT_EQ(kv.shared_layers, std::string(c.preset) == "e2b" ? 20 : std::string(c.preset) == "e4b" ? 18 : 0);
    // int8: one byte a value plus an f32 scale per position and KV head (kv_cache.h), about half of bf16.
    KvPerToken int8 = kv_per_token(preset(c.preset).text, KvDtype::Int8);
    EXPECT_EQ(int8.sliding_bytes, c.sliding_bytes / 2 + 2 * 4 * c.sliding_heads);
    EXPECT_EQ(int8.full_bytes, c.full_bytes / 2 + 2 * 4 * c.full_heads);
    EXPECT_LT(double(int8.full_bytes) / double(c.full_bytes), 0.51);
  }
  EXPECT_EQ(12288u, cases[0].sliding_bytes);
  EXPECT_EQ(6144u, cases[0].full_bytes);
}

// The 12B (gemma4_unified, Google's config ../shared/configs/gemma-4-12B-it-qat-w4a16-ct.json as preset "12b"):
// 48 layers, 40 sliding (16 heads, 8 KV heads of 256) and 8 full (every 6th: 16 heads and 1 KV head of 512,
// attention_k_eq_v: no v_proj), hidden 3840, MLP 15360 on every layer, no per-layer embeddings, no MoE, no KV sharing.
TEST(MemoryPlan, Unified12BShapesByHand) {
  ModelConfig c = preset("12b");
  KvPerToken kv = kv_per_token(c.text, KvDtype::BF16);
  EXPECT_EQ(kv.sliding_layers, 40);
  EXPECT_EQ(kv.full_layers, 8);
  EXPECT_EQ(kv.shared_layers, 0);
  EXPECT_EQ(kv.window, 1024);
  EXPECT_EQ(kv.sliding_bytes, 40u * 2 * 8 * 256 * 2);  // 327,680
  EXPECT_EQ(kv.full_bytes, 8u * 2 * 1 * 512 * 2);      // 16,384 (V, the raw k projection, still cached)

  WeightBytes bf = weight_bytes_from_config(c, WeightFormat::Bf16);
  WeightBytes q = weight_bytes_from_config(c, WeightFormat::W4A16);
  EXPECT_EQ(bf[WeightClass::Embeddings], 262144ull * 3840 * 2);  // 2,013,265,920, bf16 in both formats
  EXPECT_EQ(q[WeightClass::Embeddings], bf[WeightClass::Embeddings]);
  // Sliding: q [4096,3840], k and v [2048,3840], o [3840,4096]; full: q [8192,3840], k [512,3840], o [3840,8192].
  EXPECT_EQ(bf[WeightClass::Attention], (40ull * 3840 * (4096 + 2048 + 2048 + 4096) + 8ull * 3840 * (8192 + 512 + 8192)) * 2);
  // w4a16 per module out*in/2 + out*(in/32)*2 + 16: q 8,847,376, k and v 4,423,696, o 8,847,376 on sliding layers;
  // q 17,694,736, k 1,105,936, o 17,694,736 on full layers.
  EXPECT_EQ(q[WeightClass::Attention], 40ull * 26542144 + 8ull * 36495408);  // 1,353,649,024
  EXPECT_EQ(bf[WeightClass::Mlp], 48ull * 3 * 15360 * 3840 * 2);            // 16,986,931,200
  EXPECT_EQ(q[WeightClass::Mlp], 48ull * 3 * 33177616);                      // 4,777,576,704
  EXPECT_EQ(bf[WeightClass::PerLayerEmbeddings] + bf[WeightClass::Experts] + bf[WeightClass::Router], 0u);
  EXPECT_EQ(bf[WeightClass::Other], 48u * 2);  // layer_scalar
  // Encoder-free embedders, bf16 in both formats: image LayerNorm 2 x 6912, Linear 3840 x 6912 + 3840, LayerNorm
  // 2 x 3840, position table 1120 x 2 x 3840, LayerNorm 2 x 3840, projection 3840 x 3840; audio projection 3840 x 640.
  const uint64_t embedders = 2ull * 6912 + 3840ull * 6912 + 3840 + 2 * 3840 + 1120ull * 2 * 3840 + 2 * 3840 +
                             3840ull * 3840 + 3840ull * 640;
  EXPECT_EQ(bf.towers, embedders * 2);  // 104,759,808
  EXPECT_EQ(q.towers, bf.towers);
  // About 11.9 B parameters: 23.8 GB in bf16, 8.2 GB as w4a16.
  EXPECT_GT(bf.total(), 23'800'000'000u);
  EXPECT_LT(bf.total(), 23'900'000'000u);
  EXPECT_GT(q.total(), 8'100'000'000u);
  EXPECT_LT(q.total(), 8'200'000'000u);
}

TEST(MemoryPlan, ContextBytesBoundTheSlidingPart) {
  KvPerToken kv = kv_per_token(preset("e2b").text, KvDtype::BF16);
  EXPECT_EQ(kv.bytes_for_context(0), 0u);
  EXPECT_EQ(kv.bytes_for_context(100), 100u * (6144 + 12288));
  EXPECT_EQ(kv.bytes_for_context(512), 512u * (6144 + 12288));
  // Past the window only the full layers grow.
  EXPECT_EQ(kv.bytes_for_context(8192), 6144u * 8192 + 12288u * 512);  // 56,623,104
  EXPECT_EQ(kv.bytes_for_context(131072), 6144u * 131072 + 12288u * 512);
}

TEST(MemoryPlan, E2bWeightsFromConfigBf16AndW4a16) {
  ModelConfig c = preset("e2b");
  WeightBytes bf = weight_bytes_from_config(c, WeightFormat::Bf16);
  WeightBytes q = weight_bytes_from_config(c, WeightFormat::W4A16);

  // Embedding 262144 x 1536, bf16 in both formats (the tied LM head, counted once).
  EXPECT_EQ(bf[WeightClass::Embeddings], 262144ull * 1536 * 2);  // 805,306,368
  EXPECT_EQ(q[WeightClass::Embeddings], bf[WeightClass::Embeddings]);

  // Attention: 28 sliding layers q,o [2048,1536]; 7 full q,o [4096,1536]; k,v on the 12 + 3 owning layers only.
  const uint64_t attn_values = 28ull * 2 * 2048 * 1536 + 12ull * 2 * 256 * 1536 + 7ull * 2 * 4096 * 1536 +
                               3ull * 2 * 512 * 1536;
  EXPECT_EQ(bf[WeightClass::Attention], attn_values * 2);  // 556,793,856

  // MLP: gate, up, down of 6144 x 1536 on layers 0-14 and 12288 x 1536 (double wide) on 15-34.
  EXPECT_EQ(bf[WeightClass::Mlp], (15ull * 3 * 6144 * 1536 + 20ull * 3 * 12288 * 1536) * 2);  // 3,114,270,720
  // w4a16, per module out*in/2 + out*(in/32)*2 + 16: [6144,1536] and [1536,6144] both cost 5,308,432,
  // [12288,1536] and [1536,12288] both 10,616,848.
  EXPECT_EQ(q[WeightClass::Mlp], 15ull * 3 * 5308432 + 20ull * 3 * 10616848);  // 875,890,320

  // Per-layer embeddings: the bf16 table [262144, 35*256] stays bf16; the projections pack.
  const uint64_t table = 262144ull * 8960 * 2;  // 4,697,620,480
  EXPECT_EQ(bf[WeightClass::PerLayerEmbeddings], table + 8960ull * 1536 * 2 + 35ull * 2 * 256 * 1536 * 2);
  // per_layer_model_projection [8960,1536]: 6,881,280 + 860,160 + 16; gate [256,1536] and projection [1536,256]:
  // 196,608 + 24,576 + 16 each.
  EXPECT_EQ(q[WeightClass::PerLayerEmbeddings], table + 7741456ull + 35ull * 2 * 221200);

  // Norms and layer scalars stay bf16; no experts or router in E2B.
  EXPECT_EQ(q[WeightClass::Norms], bf[WeightClass::Norms]);
  EXPECT_EQ(bf[WeightClass::Other], 35u * 2);
  EXPECT_EQ(bf[WeightClass::Experts] + bf[WeightClass::Router], 0u);

  // Plausible totals: about 9.3 GB of bf16 text weights, 4.7 GB of which the PLE table; int4 with a bf16 scale
  // per 32 values is 4.5 bits a weight, so quantized linears shrink 16 / 4.5 = 3.56x.
  EXPECT_GT(bf.total(), 9'000'000'000u);
  EXPECT_LT(bf.total(), 10'000'000'000u);
  const double ratio = double(bf[WeightClass::Mlp] + bf[WeightClass::Attention]) /
                       double(q[WeightClass::Mlp] + q[WeightClass::Attention]);
  EXPECT_NEAR(ratio, 16.0 / 4.5, 0.01);
  // w4a16 still carries 5.5 GB of bf16 tables (embedding and PLE): about 6.56 GB in all.
  EXPECT_GT(q.total(), 6'500'000'000u);
  EXPECT_LT(q.total(), 6'600'000'000u);
}

TEST(MemoryPlan, RuntimeReserveFormula) {
  ModelConfig c = preset("e2b");
  PlanOptions o;
  o.device = resolve_device("16G");
  RuntimeReserve r = runtime_reserve(c, o);
  // (512 + 1) rows x (4 B x (3*1536 + 2*12288 + 2*8*512 + 35*256 + KV values 9216 + packed widest input 12288)
  //   + the KV bytes a token of a bf16 cache, 12*2*256*2 + 3*2*512*2 = 18432).
  EXPECT_EQ(r.activations, 513ull * (4 * (4608 + 24576 + 8192 + 8960 + 9216 + 12288) + 18432));  // 148,663,296
  EXPECT_EQ(r.logits, 262144ull * 4);
  EXPECT_EQ(r.fixed, 256 * MiB);
  EXPECT_EQ(r.accelerator, 1 * GiB);
  o.device = {"cpu", 64 * GiB, false, ""};
  o.batch = 8;
  r = runtime_reserve(c, o);
  EXPECT_EQ(r.accelerator, 0u);
  EXPECT_EQ(r.logits, 8ull * 262144 * 4);
}

TEST(MemoryPlan, ContextsThatFitOnAMadeUpBudget) {
  ModelConfig c = preset("e2b");
  WeightBytes w;
  w[WeightClass::Mlp] = 1000;
  PlanOptions o;
  const uint64_t reserve = runtime_reserve(c, o).total();  // a non-accelerator device
  o.device = {"made-up", 1000 + reserve + 100 * MiB, false, ""};
  MemoryPlan p = plan_memory(c, w, o);
  ASSERT_TRUE(p.weights_fit);
  EXPECT_EQ(p.kv_available, 104857600u);
  // n = 8192: 6144*8192 + 12288*512 = 56,623,104 -> 1.
  EXPECT_EQ(p.contexts_that_fit(8192), 1);
  // n = 1024: 6,291,456 + 6,291,456 = 12,582,912 -> 8 (9 would need 113,246,208).
  EXPECT_EQ(p.contexts_that_fit(1024), 8);
  // n = 256: 256 * 18432 = 4,718,592 -> 22.
  EXPECT_EQ(p.contexts_that_fit(256), 22);
  // Longest: 512 + (104,857,600 - 18432*512) / 6144 = 512 + 15530.
  EXPECT_EQ(p.longest_context(), 16042);
  EXPECT_LE(p.kv_bytes_for_context(16042), p.kv_available);
  EXPECT_GT(p.kv_bytes_for_context(16043), p.kv_available);
  EXPECT_THROW(p.contexts_that_fit(0), Error);

  // One byte short of weights + reserve: nothing fits, and the report says so with the numbers.
  o.device.bytes = 1000 + reserve - 1;
  MemoryPlan tight = plan_memory(c, w, o);
  EXPECT_FALSE(tight.weights_fit);
  EXPECT_EQ(tight.kv_available, 0u);
  EXPECT_EQ(tight.contexts_that_fit(8192), 0);
  EXPECT_NE(format_memory_plan(tight, 8192, "e2b").find("DOES NOT FIT"), std::string::npos);
  EXPECT_FALSE(memory_plan_json(tight, 8192, "e2b")["fits"].get<bool>());
}

// The --max-model-len serve chooses without one, computed here from the config's fields: the owning layers' K/V
// bytes a token (a layer owns a cache unless it is among the last num_kv_shared_layers), blocks of 16 positions,
// the sliding layers given ceil((window - 1) / 16) + 1 blocks a sequence (at most half the budget), the full
// layers the rest.
struct HandChoice {
  int64_t tokens, sliding_blocks, full_blocks;
};
HandChoice choice_by_hand(const Gemma4TextConfig& t, KvDtype dtype, uint64_t budget, int64_t sequences) {
  const uint64_t value_bytes = dtype == KvDtype::F32 ? 4 : dtype == KvDtype::BF16 ? 2 : 1;
  uint64_t full = 0, sliding = 0;
  for (int64_t l = 0; l < t.num_hidden_layers - t.num_kv_shared_layers; ++l) {
    const bool is_full = t.layer_types[l] == LayerType::Full;
    const uint64_t heads = is_full && t.attention_k_eq_v ? t.num_global_key_value_heads : t.num_key_value_heads;
    const uint64_t dim = is_full ? t.global_head_dim : t.head_dim;
    const uint64_t row = heads * dim * value_bytes + (dtype == KvDtype::Int8 ? heads * 4 : 0);
    (is_full ? full : sliding) += 2 * row;
  }
  const int64_t bs = 16, cap = (t.sliding_window - 1 + bs - 1) / bs + 1;
  const uint64_t sliding_block = sliding * bs, full_block = full * bs;
  HandChoice h;
  h.sliding_blocks = int64_t(std::min<uint64_t>(sequences * cap * sliding_block, budget / 2) / sliding_block);
  h.full_blocks = int64_t((budget - h.sliding_blocks * sliding_block) / full_block);
  h.tokens = h.full_blocks * bs;
  if (h.sliding_blocks < cap) h.tokens = std::min(h.tokens, h.sliding_blocks * bs);
  h.tokens = std::min(h.tokens, t.max_position_embeddings);
  return h;
}

TEST(MemoryPlan, MaxModelLenChosenFromTheKvBudget) {
  const ModelConfig c = preset("e2b");
  const Gemma4TextConfig& t = c.text;
  struct Case {
    KvDtype dtype;
    uint64_t budget;
    int64_t sequences, tokens;  // tokens: worked out once by hand below, to hold the helper to
  } cases[] = {
      // bf16: 3 full layers x 2 x 512 x 2 B = 6144 B/token, 12 sliding x 2 x 256 x 2 B = 12288; windows of 33
      // blocks: 4 x 33 x 196,608 B = 25,952,256; (104,857,600 - that) / 98,304 = 802 full blocks = 12,832 tokens.
      {KvDtype::BF16, 100 * MiB, 4, 12832},
      // int8: 3096 and 6240 B/token (codes + a 4-byte scale each for K and V): 1850 full blocks.
      {KvDtype::Int8, 100 * MiB, 4, 29600},
      // 1 GiB for one sequence: 10,856 full blocks, more than the model's 131,072 positions.
      {KvDtype::BF16, GiB, 1, 131072},
  };
  for (const Case& k : cases) {
    const HandChoice h = choice_by_hand(t, k.dtype, k.budget, k.sequences);
    EXPECT_EQ(h.tokens, k.tokens);
    const ContextChoice got =
        choose_max_model_len(t, kv_layout_for_config(t, k.dtype, 16, t.sliding_window), k.budget, k.sequences);
    EXPECT_EQ(got.tokens, h.tokens) << kv_dtype_name(k.dtype) << " " << k.budget;
    EXPECT_EQ(got.kv_budget, k.budget);
    if (h.tokens == t.max_position_embeddings) {
      EXPECT_NE(got.reason.find("max_position_embeddings 131072"), std::string::npos) << got.reason;
    } else {
      EXPECT_NE(got.reason.find(fmt::format("{} blocks of 16 positions", h.full_blocks)), std::string::npos) << got.reason;
      EXPECT_NE(got.reason.find(std::string(kv_dtype_name(k.dtype)) + " KV"), std::string::npos) << got.reason;
    }
  }

  // From a plan: 100 MiB left for KV, of which serve takes half (default_kv_budget) for 4 sequences.
  WeightBytes w;
  w[WeightClass::Mlp] = 1000;
  PlanOptions o;
  o.batch = 4;
  o.device = {"made-up", 1000 + runtime_reserve(c, o).total() + 100 * MiB, false, ""};
  const MemoryPlan plan = plan_memory(c, w, o);
  const ContextChoice from_plan = choose_max_model_len(plan, t, 4);
  EXPECT_EQ(from_plan.kv_budget, 50 * MiB);
  EXPECT_EQ(from_plan.tokens, choice_by_hand(t, KvDtype::BF16, 50 * MiB, 4).tokens);
  EXPECT_EQ(from_plan.tokens, 4304);
  EXPECT_NE(format_memory_plan(plan, from_plan.tokens, "e2b", &from_plan).find("max-model-len serve chooses: 4,304"),
            std::string::npos);
  EXPECT_EQ(memory_plan_json(plan, from_plan.tokens, "e2b", &from_plan)["max_model_len"]["tokens"], 4304);
}

// Too little memory for one block of a sequence, or none left for KV at all: an error with the numbers and what
// to change, never a server with a context of 0.
TEST(MemoryPlan, MaxModelLenTooLittleMemoryIsAClearError) {
  const ModelConfig c = preset("e2b");
  const Gemma4TextConfig& t = c.text;
  EXPECT_EQ(choice_by_hand(t, KvDtype::BF16, 100000, 4).tokens, 0);
  try {
    choose_max_model_len(t, kv_layout_for_config(t, KvDtype::BF16, 16, t.sliding_window), 100000, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("a KV pool of 100000 bytes holds no block"), std::string::npos) << m;
    EXPECT_NE(m.find("98304 bytes for the full-attention layers"), std::string::npos) << m;
    EXPECT_NE(m.find("--kv-memory"), std::string::npos) << m;
  }
  WeightBytes w;
  w[WeightClass::Mlp] = 1000;
  PlanOptions o;
  o.device = {"made-up", 1000 + runtime_reserve(c, o).total(), false, ""};
  const MemoryPlan none = plan_memory(c, w, o);
  try {
    choose_max_model_len(none, t, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves nothing for the KV cache"), std::string::npos) << e.what();
  }
}

// A loaded model's int4 LM head: held beside the bf16 embedding it was made from, which the cpu then only gathers
// a row per token.
TEST(MemoryPlan, Int4LmHeadIsHeldAndTheEmbeddingGathered) {
  ModelConfig c = preset("e2b");
  WeightBytes w;
  w[WeightClass::Embeddings] = 800;
  w[WeightClass::Mlp] = 1000;
  w[WeightClass::PerLayerEmbeddings] = 300;
  w.gathered_by_row = 250;
  w.add_int4_lm_head(225);
  EXPECT_EQ(w.total(), 2100u);
  EXPECT_EQ(w.held(), 2325u);
  EXPECT_EQ(w.gathered_by_row, 1050u);
  PlanOptions o;
  const uint64_t reserve = runtime_reserve(c, o).total();
  o.device = {"made-up", 2325 + reserve + 100 * MiB, false, ""};
  MemoryPlan p = plan_memory(c, w, o);
  EXPECT_EQ(p.kv_available, 100 * MiB);
  EXPECT_EQ(p.cpu_resident_without_kv(), 2325 - 1050 + reserve);
  EXPECT_EQ(memory_plan_json(p, 1024, "e2b")["weights"]["lm_head_int4"], 225);
  EXPECT_NE(format_memory_plan(p, 1024, "e2b").find("int4 LM head"), std::string::npos);
}

TEST(MemoryPlan, DevicePresets) {
  EXPECT_EQ(resolve_device("tpu-v5e").bytes, 16 * GiB);
  EXPECT_EQ(resolve_device("tpu-v6e").bytes, 32 * GiB);
  EXPECT_EQ(resolve_device("l4").bytes, 23034 * MiB);
  EXPECT_EQ(resolve_device("H100").bytes, 81559 * MiB);
  EXPECT_EQ(resolve_device("h200").bytes, 143771 * MiB);
  for (const auto& d : device_presets()) EXPECT_TRUE(d.accelerator) << d.name;
  EXPECT_EQ(resolve_device("48G").bytes, 48 * GiB);
  EXPECT_EQ(resolve_device("48GiB").bytes, 48 * GiB);
  EXPECT_EQ(resolve_device("512M").bytes, 512 * MiB);
  EXPECT_EQ(resolve_device("1.5T").bytes, 1536 * GiB);
  try {
    resolve_device("a100");
    ADD_FAILURE() << "unknown device accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'a100'"), std::string::npos) << m;
    for (const char* n : {"tpu-v5e", "tpu-v6e", "l4", "h100", "h200", "cpu"}) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
  EXPECT_THROW(resolve_device("-4G"), Error);
  EXPECT_THROW(resolve_device("48X"), Error);

  test::TempDir tmp;
  std::ofstream(tmp / "meminfo") << "MemFree:  100 kB\nMemTotal:       65536000 kB\n";
  const CgroupFiles no_cgroup{tmp / "no-cgroup", ""};  // this machine's own limit must not decide the test
  Device cpu = resolve_device("cpu", tmp / "meminfo", no_cgroup);
  EXPECT_EQ(cpu.bytes, 65536000ull * 1024);
  EXPECT_FALSE(cpu.accelerator);
  std::ofstream(tmp / "bad") << "MemFree: 100 kB\n";
  EXPECT_THROW(resolve_device("cpu", tmp / "bad"), Error);
  EXPECT_GT(resolve_device("cpu").bytes, 0u);  // this machine's /proc/meminfo
}

void write_text(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

// A fake cgroup v2 tree as a container sees it: the process's cgroup, its parent's limit (the smaller one wins),
// a sibling's limit that must not count, and "max" (no limit) on the cgroup itself.
TEST(MemoryPlan, CgroupV2MemoryMax) {
  test::TempDir tmp;
  const fs::path root = tmp / "cgroup";
  write_text(root / "kubepods.slice/memory.max", "6442450944\n");          // 6 GiB: the pod
  write_text(root / "kubepods.slice/pod1/memory.max", "max\n");            // the container: none of its own
  write_text(root / "kubepods.slice/other/memory.max", "1073741824\n");    // a sibling: not ours
  const CgroupFiles v2{root, "0::/kubepods.slice/pod1\n"};
  auto limit = cgroup_memory_limit(v2);
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->bytes, 6 * GiB);
  EXPECT_EQ(limit->file, root / "kubepods.slice/memory.max");

  write_text(tmp / "meminfo", "MemTotal:       65536000 kB\n");
  Device cpu = resolve_device("cpu", tmp / "meminfo", v2);
  EXPECT_EQ(cpu.bytes, 6 * GiB);
  EXPECT_NE(cpu.note.find("memory limit"), std::string::npos) << cpu.note;
  EXPECT_NE(cpu.note.find((root / "kubepods.slice/memory.max").string()), std::string::npos) << cpu.note;

  // A limit above the machine's RAM changes nothing: MemTotal is the smaller.
  write_text(root / "kubepods.slice/memory.max", "999999999999999\n");
  cpu = resolve_device("cpu", tmp / "meminfo", v2);
  EXPECT_EQ(cpu.bytes, 65536000ull * 1024);
  EXPECT_NE(cpu.note.find("MemTotal"), std::string::npos) << cpu.note;

  // "max" all the way up, or no cgroup files at all: no limit.
  write_text(root / "kubepods.slice/memory.max", "max\n");
  EXPECT_FALSE(cgroup_memory_limit(v2).has_value());
  EXPECT_FALSE(cgroup_memory_limit(CgroupFiles{tmp / "nothing", "0::/\n"}).has_value());
}

// cgroup v1 (memory controller in its own hierarchy): the process's cgroup line names it; a container that sees
// only its own cgroup at the mount's root finds the file there.
TEST(MemoryPlan, CgroupV1MemoryLimitInBytes) {
  test::TempDir tmp;
  const fs::path root = tmp / "cgroup";
  write_text(root / "memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  write_text(root / "memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  const CgroupFiles v1{root, "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n"};
  auto limit = cgroup_memory_limit(v1);
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->bytes, 2 * GiB);
  EXPECT_EQ(limit->file, root / "memory/docker/abc/memory.limit_in_bytes");

  // The same process seen from inside the container: its cgroup path is not under the mount, the root file is.
  const fs::path inside = tmp / "inside";
  write_text(inside / "memory/memory.limit_in_bytes", "536870912\n");
  limit = cgroup_memory_limit(CgroupFiles{inside, "4:memory:/docker/abc\n"});
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->bytes, 512 * MiB);
}

TEST(MemoryPlan, CgroupFileThatIsNotALimitNamesIt) {
  test::TempDir tmp;
  const fs::path root = tmp / "cgroup";
  write_text(root / "memory.max", "lots\n");
  try {
    cgroup_memory_limit(CgroupFiles{root, "0::/\n"});
    ADD_FAILURE() << "a malformed memory.max was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((root / "memory.max").string()), std::string::npos) << m;
    EXPECT_NE(m.find("'lots'"), std::string::npos) << m;
  }
}

fs::path synth(const test::TempDir& tmp, const std::string& name, const std::string& preset_name, CheckpointFormat f) {
  return test::synth_quietly({.preset = preset_name, .format = f, .out = tmp / name});
}

void expect_same_classes(const WeightBytes& a, const WeightBytes& b) {
  for (size_t i = 0; i < kWeightClasses; ++i)
    EXPECT_EQ(a.by_class[i], b.by_class[i]) << weight_class_name(static_cast<WeightClass>(i));
}

// The vision tower's bytes from its config are the bytes its checkpoints store (transformers' save_pretrained and
// compressed-tensors' packing, tests/fixtures/mm_moe_like: vision only), and one image's encoding is reserved.
TEST(MemoryPlan, VisionTowerCountedFromConfigAsStored) {
  const std::string dir = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/mm_moe_like/";
  for (auto [format, sub] : {std::pair{WeightFormat::Bf16, "bf16"}, std::pair{WeightFormat::W4A16, "w4a16"}}) {
    Checkpoint ckpt = Checkpoint::open(dir + sub);
    ModelConfig c = read_model_config(*ckpt.config_path());
    EXPECT_EQ(weight_bytes_from_config(c, format).towers, weight_bytes_from_checkpoint(ckpt, c).towers) << sub;
  }
  ModelConfig e2b = preset("e2b");  // 280 soft tokens x 9 patches of 768 values through a 768-wide tower
  EXPECT_EQ(runtime_reserve(e2b, PlanOptions{}).image, vision_image_activation_bytes(*e2b.vision));
  EXPECT_EQ(vision_image_activation_bytes(*e2b.vision),
            2520ull * 4 * (768 + 3 * 768 + (2 * 12 + 2 * 12) * 64 + 2 * 3072 + 3 * 3072));
  PlanOptions largest;  // serve --max-image-soft-tokens 1120: four times the patches of the default 280
  largest.image_soft_tokens = 1120;
  EXPECT_EQ(runtime_reserve(e2b, largest).image, 4 * vision_image_activation_bytes(*e2b.vision));
  EXPECT_EQ(runtime_reserve(preset("e2b-tiny"), PlanOptions{}).image, 0u);  // no vision_config
}

// Both towers of the multimodal fixture (transformers' save_pretrained, compressed-tensors' packing): the config
// plan's tower bytes are the bytes each format's file holds.
TEST(MemoryPlan, VisionAndAudioTowersCountedFromConfigAsStored) {
  const std::string dir = std::string(QATSERVE_SOURCE_DIR) + "/tests/fixtures/mm_e2b_like/";
  for (auto [format, sub] : {std::pair{WeightFormat::Bf16, "bf16"}, std::pair{WeightFormat::W4A16, "w4a16"}}) {
    Checkpoint ckpt = Checkpoint::open(dir + sub);
    ModelConfig c = read_model_config(*ckpt.config_path());
    EXPECT_EQ(weight_bytes_from_config(c, format).towers, weight_bytes_from_checkpoint(ckpt, c).towers) << sub;
  }
}

// The real configs' towers by hand. Vision, per layer: q, k, v, o [D, D] (heads x head_dim = D), gate and up
// [I, D], down [D, I]; 4 norms of D, q/k norms of head_dim; E2B/E4B also 7 clipped linears x 4 bf16 scalars. Plus
// the patch projection [D, 768], the position table [2, 10240, D], embed_vision [text hidden, D] (bf16 in both
// formats) and, on 26B/31B, std_bias/std_scale. w4a16 packs a linear as out*in/2 + out*in/32*2 + 16 bytes; 26B's
// down_proj has 4304 inputs, not a multiple of 32, and stays bf16.
TEST(MemoryPlan, TowersOfTheRealConfigsByHand) {
  auto packed = [](uint64_t out, uint64_t in) { return out * in / 2 + out * (in / 32) * 2 + 16; };
  // E2B and E4B: the same 768-wide, 16-layer tower with clipped linears.
  const uint64_t small_norms = (4 * 768 + 2 * 64 + 28) * 2;
  const uint64_t small_bf16 = (768ull * 768 + 2 * 10240 * 768 +
                               16 * (4ull * 768 * 768 + 3ull * 768 * 3072)) * 2 + 16 * small_norms;
  const uint64_t small_w4 = packed(768, 768) + 2ull * 10240 * 768 * 2 +
                            16 * (4 * packed(768, 768) + 2 * packed(3072, 768) + packed(768, 3072)) + 16 * small_norms;
  // The 1152-wide, 27-layer tower of 26B-A4B and 31B, standardized, no clipped linears.
  const uint64_t big_norms = (4 * 1152 + 2 * 72) * 2;
  const uint64_t big_bf16 = (1152ull * 768 + 2 * 10240 * 1152 + 27 * (4ull * 1152 * 1152 + 3ull * 1152 * 4304) +
                             2 * 1152) * 2 + 27 * big_norms;
  const uint64_t big_w4 = packed(1152, 768) + 2ull * 10240 * 1152 * 2 + 2 * 1152 * 2 +
                          27 * (4 * packed(1152, 1152) + 2 * packed(4304, 1152) + 1152ull * 4304 * 2) + 27 * big_norms;
  struct Case {
    const char* preset;
    int64_t text_hidden;
    uint64_t vision_bf16, vision_w4;
    bool audio;
  };
  for (const Case& k : {Case{"e2b", 1536, small_bf16, small_w4, true}, Case{"e4b", 2560, small_bf16, small_w4, true},
                        Case{"26b-a4b", 2816, big_bf16, big_w4, false}, Case{"31b", 5376, big_bf16, big_w4, false}}) {
    ModelConfig c = preset(k.preset);
    const uint64_t embed = uint64_t(k.text_hidden) * c.vision->hidden_size * 2;
    const uint64_t audio_bf16 =
        k.audio ? audio_tower_plan(parse_audio_config(c, "c"), k.text_hidden, WeightFormat::Bf16, 1).weights : 0;
    const uint64_t audio_w4 =
        k.audio ? audio_tower_plan(parse_audio_config(c, "c"), k.text_hidden, WeightFormat::W4A16, 1).weights : 0;
    EXPECT_EQ(weight_bytes_from_config(c, WeightFormat::Bf16).towers, k.vision_bf16 + embed + audio_bf16) << k.preset;
    EXPECT_EQ(weight_bytes_from_config(c, WeightFormat::W4A16).towers, k.vision_w4 + embed + audio_w4) << k.preset;
    // One image of 280 soft tokens = 2520 patches; one 30 s clip (3000 frames) with an audio tower; the larger held.
    RuntimeReserve r = runtime_reserve(c, PlanOptions{});
    const int64_t D = c.vision->hidden_size, I = c.vision->intermediate_size, heads = c.vision->num_attention_heads;
    const int64_t clamped = c.vision->use_clipped_linears ? 3 * I : 0;
    EXPECT_EQ(r.image, 2520ull * 4 * (768 + 3 * D + 4 * heads * c.vision->head_dim + 2 * I + clamped)) << k.preset;
    EXPECT_EQ(r.audio, k.audio ? audio_tower_plan(parse_audio_config(c, "c"), k.text_hidden, WeightFormat::Bf16,
                                                  3000).activations
                               : 0u) << k.preset;
    EXPECT_EQ(r.total(), r.activations + r.logits + r.fixed + r.accelerator + std::max(r.image, r.audio));
  }
  // The E2B audio tower's 30 s clip (benchmarked in BENCHMARKS.md): 55 MiB, below its image's 206 MiB.
  RuntimeReserve e2b = runtime_reserve(preset("e2b"), PlanOptions{});
  EXPECT_EQ(e2b.audio / MiB, 55u);
  EXPECT_GT(e2b.image, e2b.audio);
}

TEST(MemoryPlan, CheckpointDirectoryMatchesTheConfigPlan) {
  test::TempDir tmp;
  ModelConfig c = preset("e2b-tiny");
  Checkpoint bf = Checkpoint::open(synth(tmp, "bf16", "e2b-tiny", CheckpointFormat::Bf16));
  WeightBytes from_files = weight_bytes_from_checkpoint(bf, c);
  expect_same_classes(from_files, weight_bytes_from_config(c, WeightFormat::Bf16));
  EXPECT_EQ(from_files.unused, 0u);
  EXPECT_EQ(from_files.total() + from_files.towers, bf.total_tensor_bytes());

  // The w4a16 checkpoint plans smaller, byte for byte as the config formula says; its lm_head copy of the tied
  // embedding (4096 x 64 bf16) is not loaded and not counted.
  Checkpoint q = Checkpoint::open(synth(tmp, "w4a16", "e2b-tiny", CheckpointFormat::W4A16));
  WeightBytes packed = weight_bytes_from_checkpoint(q, c);
  expect_same_classes(packed, weight_bytes_from_config(c, WeightFormat::W4A16));
  EXPECT_EQ(packed.unused, 4096u * 64 * 2);
  EXPECT_LT(packed.total(), from_files.total());

  // Experts split per expert in the packed checkpoint are still classed as experts.
  ModelConfig moe = preset("26b-a4b-tiny");
  Checkpoint mq = Checkpoint::open(synth(tmp, "moe", "26b-a4b-tiny", CheckpointFormat::W4A16));
  WeightBytes moe_files = weight_bytes_from_checkpoint(mq, moe);
  expect_same_classes(moe_files, weight_bytes_from_config(moe, WeightFormat::W4A16));
  EXPECT_GT(moe_files[WeightClass::Experts], 0u);
  EXPECT_GT(moe_files[WeightClass::Router], 0u);

  // A synthetic multimodal checkpoint: its towers, as written, are the config's, in both formats.
  ModelConfig mm = preset("e2b-mm-tiny");
  for (auto [format, weights] : {std::pair{CheckpointFormat::Bf16, WeightFormat::Bf16},
                                 std::pair{CheckpointFormat::W4A16, WeightFormat::W4A16}}) {
    Checkpoint ckpt = Checkpoint::open(synth(tmp, weights == WeightFormat::Bf16 ? "mm-bf16" : "mm-w4", "e2b-mm-tiny",
                                             format));
    WeightBytes files = weight_bytes_from_checkpoint(ckpt, mm);
    EXPECT_GT(files.towers, 0u);
    EXPECT_EQ(files.towers, weight_bytes_from_config(mm, weights).towers);
  }
}

using test::CliResult;
using test::qatserve;

// `plan --device cpu` in a container: QATSERVE_CGROUP_ROOT points the command at a fake cgroup tree whose limit is
// below any machine's RAM; the plan is sized from it and says so.
TEST(MemoryPlan, CliPlansFromTheContainerLimit) {
  test::TempDir tmp;
  write_text(tmp / "memory.max", "3221225472\n");
  write_text(tmp / "memory/memory.limit_in_bytes", "3221225472\n");  // the same 3 GiB for a v1 machine
  const CliResult plan = qatserve("plan --preset e2b-tiny --device cpu --json",
                                  "QATSERVE_CGROUP_ROOT='" + tmp.path().string() + "'");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const std::string& out = plan.output;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["device"]["bytes"].get<uint64_t>(), 3 * GiB) << out;
  EXPECT_NE(j["device"]["note"].get<std::string>().find("memory limit"), std::string::npos) << out;
}

// Without --context, `plan` reports the --max-model-len serve chooses and plans for it; serve itself refuses, with
// the numbers, a KV pool that holds no block of a sequence.
TEST(MemoryPlan, CliChoosesTheMaxModelLen) {
  const CliResult fits = qatserve("plan --preset e2b --device h100 --weights w4a16 --json");
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  auto j = nlohmann::json::parse(fits.output);
  EXPECT_EQ(j["max_model_len"]["tokens"], 131072) << fits.output;
  EXPECT_EQ(j["context"], 131072);
  EXPECT_NE(j["max_model_len"]["reason"].get<std::string>().find("max_position_embeddings"), std::string::npos);

  // 9 GiB: e2b's w4a16 weights (6.4 GiB) fit, and serve's half of what is left holds less than 131,072 tokens.
  const CliResult text = qatserve("plan --preset e2b --device 9G --weights w4a16 --max-running 4");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("max-model-len serve chooses: "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("all that the KV pool of"), std::string::npos) << text.output;

  const std::string model = std::string(QATSERVE_SOURCE_DIR) + "/models/gemma4-tiny-qat";
  const CliResult tiny = qatserve("serve --model '" + model + "' --kv-memory 1K --port 1");
  EXPECT_EQ(tiny.exit_code, 1) << tiny.output;
  EXPECT_NE(tiny.output.find("a KV pool of 1024 bytes holds no block of a sequence"), std::string::npos) << tiny.output;
}

TEST(MemoryPlan, Cli) {
  CliResult ok = qatserve("plan --preset e2b --device h100 --weights w4a16 --kv-dtype int8 --context 32768 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  auto j = nlohmann::json::parse(ok.output);
  EXPECT_EQ(j["kv"]["dtype"], "int8");
  EXPECT_EQ(j["kv"]["sliding_bytes_per_token"].get<uint64_t>(), 6144u + 12 * 2 * 4);  // bf16's half, + the scales
  EXPECT_EQ(j["kv"]["full_bytes_per_token"].get<uint64_t>(), 3072u + 3 * 2 * 4);
  EXPECT_EQ(j["device"]["bytes"].get<uint64_t>(), 81559 * MiB);
  EXPECT_GT(j["contexts_that_fit"].get<int64_t>(), 100);

  CliResult twelve = qatserve("plan --preset 12b --device l4 --weights w4a16 --context 8192 --json");
  ASSERT_EQ(twelve.exit_code, 0) << twelve.output;
  auto t = nlohmann::json::parse(twelve.output);
  EXPECT_EQ(t["kv"]["sliding_bytes_per_token"].get<uint64_t>(), 327680u);
  EXPECT_EQ(t["kv"]["full_bytes_per_token"].get<uint64_t>(), 16384u);

  CliResult small = qatserve("plan --preset 31b --device l4");
  EXPECT_EQ(small.exit_code, 3) << small.output;
  EXPECT_NE(small.output.find("DOES NOT FIT"), std::string::npos) << small.output;

  CliResult bad = qatserve("plan --preset e2b --device a100");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("tpu-v5e"), std::string::npos) << bad.output;
  EXPECT_EQ(qatserve("plan --device cpu").exit_code, 1);
}

}  // namespace
}  // namespace qs
