// LoRA adapters (model/lora_adapter.h) on the e2b_like fixture: what a bad adapter gets (a clear error naming the
// file, field or tensor), that an adapter changes only the sequences that use it (several adapters and the base in
// one batch equal each alone, bit for bit), and that a zero B leaves the base's logits; the same for LoRA on the
// MoE experts (target_parameters) on the moe_like fixture. Exactness against PEFT is ctest lora_external
// (tools/python/check_lora_external.py).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "model/gemma4.h"
#include "model/lora_adapter.h"
#include "test_util.h"

namespace qs {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/fixtures/e2b_like/bf16";
const std::string kLayer = "base_model.model.model.language_model.layers.";

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

Tensor random_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t seed, float scale = 0.05f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return {name, std::move(shape), std::move(v)};
}

void write_safetensors(const std::filesystem::path& path, const std::vector<Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    const uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << text;
  for (const Tensor& t : tensors) f.write(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4);
}

nlohmann::json base_config(nlohmann::json targets, int r = 2) {
  return {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 2 * r}, {"target_modules", std::move(targets)},
          {"use_dora", false}, {"modules_to_save", nullptr}, {"bias", "none"}, {"lora_dropout", 0.05}};
}

// q_proj of layer 0 (e2b_like: hidden 64, 4 heads of 16): A [r, 64], B [64, r].
std::vector<Tensor> q_proj_tensors(int r = 2, uint32_t seed = 1) {
  return {random_tensor(kLayer + "0.self_attn.q_proj.lora_A.weight", {r, 64}, seed),
          random_tensor(kLayer + "0.self_attn.q_proj.lora_B.weight", {64, r}, seed + 1)};
}

std::filesystem::path write_adapter(const test::TempDir& tmp, const std::string& name, const nlohmann::json& config,
                                    const std::vector<Tensor>& tensors) {
  const auto dir = tmp / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "adapter_config.json") << config.dump();
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  return dir;
}

// The model at *Fixture, loaded once per suite, and adapters written for it.
template <const std::filesystem::path* Fixture>
class LoraOn : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Gemma4Model::load(*Fixture, Precision::F32).release(); }
  static void TearDownTestSuite() { delete model_; }
  std::string load_error(const nlohmann::json& config, const std::vector<Tensor>& tensors, int64_t max_rank = 64) {
    const auto dir = write_adapter(tmp_, "adapter", config, tensors);
    return test::error_of([&] { LoraAdapter::load(dir, *model_, "adapter", max_rank); });
  }
  static inline Gemma4Model* model_ = nullptr;
  test::TempDir tmp_;
};
using LoraTest = LoraOn<&kFixture>;

TEST_F(LoraTest, RefusesBadAdaptersNamingWhatIsWrong) {
  const nlohmann::json q = base_config({"q_proj"});
  auto with = [&](const char* field, nlohmann::json value) {
    nlohmann::json c = q;
    c[field] = std::move(value);
    return c;
  };
  EXPECT_NE(load_error(with("use_dora", true), q_proj_tensors()).find("use_dora"), std::string::npos);
  EXPECT_NE(load_error(with("modules_to_save", {"lm_head"}), q_proj_tensors()).find("modules_to_save"),
            std::string::npos);
  EXPECT_NE(load_error(with("target_parameters", {"experts.gate_up_proj"}), q_proj_tensors()).find("target_parameters"),
            std::string::npos);
  EXPECT_NE(load_error(with("peft_type", "IA3"), q_proj_tensors()).find("peft_type"), std::string::npos);
  EXPECT_NE(load_error(with("r", 0), q_proj_tensors()).find("r must be a positive integer"), std::string::npos);
  EXPECT_NE(load_error(with("target_modules", "q_proj[("), q_proj_tensors()).find("not a valid regular expression"),
            std::string::npos);
  // A target the base does not have, and one qatserve does not adapt.
  EXPECT_NE(load_error(base_config({"q_proj", "qkv_proj"}), q_proj_tensors()).find("'qkv_proj' matches no linear"),
            std::string::npos);
  const std::string head = load_error(base_config({"q_proj", "lm_head"}), q_proj_tensors());
  EXPECT_NE(head.find("'lm_head'"), std::string::npos) << head;
  EXPECT_NE(head.find("LM head"), std::string::npos) << head;
  // exclude_modules wins over the targets, as a suffix list (PEFT's rule) or a whole-name regex: an excluded
  // module's tensors are not the adapter's.
  for (const nlohmann::json& excluded : {nlohmann::json::array({"0.self_attn.q_proj"}), nlohmann::json(".*layers\\.0\\..*")})
    EXPECT_NE(load_error(with("exclude_modules", excluded), q_proj_tensors()).find("is excluded by adapter_config.json's exclude_modules"),
              std::string::npos)
        << excluded;
  EXPECT_NE(load_error(with("exclude_modules", "[("), q_proj_tensors()).find("exclude_modules '[(' is not a valid"),
            std::string::npos);
}

TEST_F(LoraTest, RefusesTensorsThatDoNotFitTheBase) {
  // q_proj is targeted in every layer: only layer 0's tensors are given.
  const nlohmann::json layer0 = base_config("model\\.language_model\\.layers\\.0\\.self_attn\\.q_proj");
  std::vector<Tensor> wrong_shape = q_proj_tensors();
  wrong_shape[0] = random_tensor(kLayer + "0.self_attn.q_proj.lora_A.weight", {2, 63}, 3);
  const std::string shape = load_error(layer0, wrong_shape);
  EXPECT_NE(shape.find("tensor " + kLayer + "0.self_attn.q_proj.lora_A.weight has shape [2, 63], expected [2, 64]"),
            std::string::npos) << shape;

  const std::string rank = load_error(base_config("model\\.language_model\\.layers\\.0\\.self_attn\\.q_proj", 8),
                                      q_proj_tensors(8), 4);
  EXPECT_NE(rank.find("rank 8, over the limit of 4 (--max-lora-rank)"), std::string::npos) << rank;

  const std::string missing = load_error(layer0, {q_proj_tensors()[0]});
  EXPECT_NE(missing.find("layers.0.self_attn.q_proj is targeted but its lora_B.weight is missing"), std::string::npos)
      << missing;

  // Layer 5 of e2b_like shares layer 3's K/V: it has no k_proj.
  const std::string shared = load_error(base_config(".*"), {random_tensor(kLayer + "5.self_attn.k_proj.lora_A.weight",
                                                                          {2, 64}, 4)});
  EXPECT_NE(shared.find("layers.5.self_attn.k_proj cannot be adapted"), std::string::npos) << shared;

  std::vector<Tensor> untargeted = q_proj_tensors();
  untargeted.push_back(random_tensor(kLayer + "0.self_attn.o_proj.lora_A.weight", {2, 64}, 5));
  const std::string not_targeted = load_error(layer0, untargeted);
  EXPECT_NE(not_targeted.find("o_proj is not among adapter_config.json's target_modules"), std::string::npos)
      << not_targeted;

  const std::string dora = load_error(layer0, {random_tensor(kLayer + "0.self_attn.q_proj.lora_magnitude_vector", {64},
                                                             6)});
  EXPECT_NE(dora.find("lora_magnitude_vector is no LoRA weight"), std::string::npos) << dora;
}

TEST_F(LoraTest, RefusesMissingAndCorruptFiles) {
  const auto dir = write_adapter(tmp_, "corrupt", base_config({"q_proj"}), q_proj_tensors());
  std::filesystem::resize_file(dir / "adapter_model.safetensors",
                               std::filesystem::file_size(dir / "adapter_model.safetensors") - 4);
  const std::string truncated = test::error_of([&] { LoraAdapter::load(dir, *model_, "corrupt"); });
  EXPECT_NE(truncated.find("adapter_model.safetensors"), std::string::npos) << truncated;

  std::ofstream(dir / "adapter_config.json") << "{\"peft_type\": \"LORA\",";
  const std::string json = test::error_of([&] { LoraAdapter::load(dir, *model_, "corrupt"); });
  EXPECT_NE(json.find("adapter_config.json: not valid JSON"), std::string::npos) << json;

  std::filesystem::remove(dir / "adapter_config.json");
  const std::string none = test::error_of([&] { LoraAdapter::load(dir, *model_, "corrupt"); });
  EXPECT_NE(none.find("no adapter_config.json"), std::string::npos) << none;
}

// The command line: a bad adapter is a non-zero exit naming the tensor, and merge-lora then writes nothing; an int4
// base is refused by merge-lora (a merged weight leaves the QAT grid).
TEST_F(LoraTest, CommandsRefuseBadAdaptersAndWriteNothing) {
  std::vector<Tensor> wrong = q_proj_tensors();
  wrong[1] = random_tensor(kLayer + "0.self_attn.q_proj.lora_B.weight", {65, 2}, 7);
  const auto bad = write_adapter(tmp_, "bad", base_config("model\\.language_model\\.layers\\.0\\.self_attn\\.q_proj"),
                                 wrong);
  const std::string tensor = kLayer + "0.self_attn.q_proj.lora_B.weight has shape [65, 2], expected [64, 2]";
  const test::CliResult logits = test::qatserve("logits --model '" + kFixture.string() + "' --lora '" + bad.string() +
                                                "' --tokens 2,5,9 --out '" + (tmp_ / "l.safetensors").string() + "'");
  EXPECT_NE(logits.exit_code, 0);
  EXPECT_NE(logits.output.find(tensor), std::string::npos) << logits.output;
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "l.safetensors"));

  auto merge_lora = [&](const std::filesystem::path& base, const std::filesystem::path& adapter, const char* out) {
    return test::qatserve("merge-lora --quiet '" + base.string() + "' '" + adapter.string() + "' '" +
                          (tmp_ / out).string() + "'");
  };
  const test::CliResult merge = merge_lora(kFixture, bad, "m");
  EXPECT_NE(merge.exit_code, 0);
  EXPECT_NE(merge.output.find(tensor), std::string::npos) << merge.output;
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "m"));

  const auto good = write_adapter(tmp_, "good", base_config({"q_proj"}), {});
  const auto int4 = kFixture.parent_path() / "w4a16";
  const test::CliResult quantized = merge_lora(int4, good, "q");
  EXPECT_NE(quantized.exit_code, 0);
  EXPECT_NE(quantized.output.find("int4 weights; merge-lora writes a bf16 checkpoint"), std::string::npos)
      << quantized.output;
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "q"));
}

std::vector<float> run(const Gemma4Model& model, std::span<const int32_t> tokens, const LoraAdapter* lora) {
  KvCache cache = model.new_cache(64);
  SequenceStep step{tokens, &cache, LogitsWanted::All};
  step.lora = lora;
  return model.forward_batch(std::span(&step, 1));
}

// The base on p1, adapter a on p2 and b on p3: an all-zero B leaves the base's logits, a and b change theirs, and
// the three in one batch equal each alone, bit for bit.
void expect_batch_equals_each_alone(const Gemma4Model& model, const LoraAdapter& zero, const LoraAdapter& a,
                                    const LoraAdapter& b, const std::vector<int32_t>& p1,
                                    const std::vector<int32_t>& p2, const std::vector<int32_t>& p3) {
  const std::vector<float> base = run(model, p1, nullptr), with_a = run(model, p2, &a),
                           with_b = run(model, p3, &b);
  EXPECT_EQ(run(model, p1, &zero), base) << "B = 0 must leave the base's logits";
  EXPECT_GT(test::max_abs_diff(run(model, p2, nullptr), with_a), 1e-3f) << "adapter a changes nothing";
  EXPECT_GT(test::max_abs_diff(run(model, p3, nullptr), with_b), 1e-3f) << "adapter b changes nothing";

  KvCache c1 = model.new_cache(64), c2 = model.new_cache(64), c3 = model.new_cache(64);
  std::vector<SequenceStep> steps = {{p2, &c2, LogitsWanted::All}, {p1, &c1, LogitsWanted::All},
                                     {p3, &c3, LogitsWanted::All}};
  steps[0].lora = &a, steps[2].lora = &b;
  const std::vector<float> batch = model.forward_batch(steps);
  const int64_t V = model.config().text.vocab_size;
  const auto rows = [&](size_t first, size_t n) { return std::vector<float>(batch.begin() + first * V,
                                                                            batch.begin() + (first + n) * V); };
  EXPECT_EQ(rows(0, p2.size()), with_a);
  EXPECT_EQ(rows(p2.size(), p1.size()), base);
  EXPECT_EQ(rows(p2.size() + p1.size(), p3.size()), with_b);
}

TEST_F(LoraTest, SequencesWithDifferentAdaptersInOneBatchEqualEachAlone) {
  const std::string layer0 = "model\\.language_model\\.layers\\.0\\.self_attn\\.q_proj";
  auto a = LoraAdapter::load(write_adapter(tmp_, "a", base_config(layer0), q_proj_tensors(2, 10)), *model_, "a");
  std::vector<Tensor> all;
  for (int l = 0; l < 8; ++l) {
    all.push_back(random_tensor(kLayer + std::to_string(l) + ".mlp.down_proj.lora_A.weight", {4, l < 4 ? 96 : 192},
                                20 + l));
    all.push_back(random_tensor(kLayer + std::to_string(l) + ".mlp.down_proj.lora_B.weight", {64, 4}, 40 + l));
  }
  auto b = LoraAdapter::load(write_adapter(tmp_, "b", base_config({"down_proj"}, 4), all), *model_, "b");
  std::vector<Tensor> zero_b = q_proj_tensors(2, 60);
  std::fill(zero_b[1].values.begin(), zero_b[1].values.end(), 0.0f);
  auto zero = LoraAdapter::load(write_adapter(tmp_, "zero", base_config(layer0), zero_b), *model_, "zero");

  const std::vector<int32_t> p1 = {2, 17, 300, 41, 9, 77, 120, 5, 64, 33, 210}, p2 = {2, 400, 12, 12, 99, 7},
                             p3 = {2, 250, 251, 8};
  expect_batch_equals_each_alone(*model_, *zero, *a, *b, p1, p2, p3);
}

// LoRA on the MoE experts (target_parameters; model/lora_experts.h) on the moe_like fixture: hidden 64, expert
// width 32, 8 experts, 6 layers. PEFT saves A [experts * r, in] and B [out, r * experts] for each targeted
// parameter; with both targeted, gate_up_proj's under experts.base_layer and down_proj's under experts.
const std::filesystem::path kMoeFixture = std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/fixtures/moe_like/bf16";
constexpr int kExperts = 8, kMoeLayers = 6;

nlohmann::json experts_config(nlohmann::json parameters, nlohmann::json modules = nlohmann::json::array(), int r = 2) {
  nlohmann::json c = base_config(std::move(modules), r);
  c["target_parameters"] = std::move(parameters);
  c["lora_dropout"] = 0.0;  // PEFT's ParamWrapper refuses dropout
  return c;
}

std::vector<Tensor> expert_tensors(int r, uint32_t seed, bool gate_up = true, bool down = true) {
  std::vector<Tensor> out;
  for (int l = 0; l < kMoeLayers; ++l) {
    const std::string m = kLayer + std::to_string(l) + ".experts.";
    const uint32_t s = seed + 4 * l;
    if (gate_up) {
      const std::string g = m + (down ? "base_layer." : "");
      out.push_back(random_tensor(g + "lora_A.weight", {kExperts * r, 64}, s));
      out.push_back(random_tensor(g + "lora_B.weight", {64, r * kExperts}, s + 1));
    }
    if (down) {
      out.push_back(random_tensor(m + "lora_A.weight", {kExperts * r, 32}, s + 2));
      out.push_back(random_tensor(m + "lora_B.weight", {64, r * kExperts}, s + 3));
    }
  }
  return out;
}

using LoraExpertsTest = LoraOn<&kMoeFixture>;

TEST_F(LoraExpertsTest, RefusesExpertTensorsThatDoNotFit) {
  const nlohmann::json both = experts_config({"experts.gate_up_proj", "experts.down_proj"});
  std::vector<Tensor> tensors = expert_tensors(2, 1);
  tensors[0] = random_tensor(kLayer + "0.experts.base_layer.lora_A.weight", {2, 64}, 9);  // one expert's rank only
  const std::string a = load_error(both, tensors);
  EXPECT_NE(a.find("tensor " + kLayer + "0.experts.base_layer.lora_A.weight has shape [2, 64], expected [16, 64] "
                   "(base model.language_model.layers.0.experts.gate_up_proj is [8, 64, 64], rank 2"),
            std::string::npos) << a;

  tensors = expert_tensors(2, 1);
  tensors[3] = random_tensor(kLayer + "0.experts.lora_B.weight", {16, 64}, 9);  // down_proj's B transposed
  const std::string b = load_error(both, tensors);
  EXPECT_NE(b.find("tensor " + kLayer + "0.experts.lora_B.weight has shape [16, 64], expected [64, 16] (base "
                   "model.language_model.layers.0.experts.down_proj is [8, 64, 32]"),
            std::string::npos) << b;

  tensors = expert_tensors(2, 1);
  tensors.pop_back();
  const std::string missing = load_error(both, tensors);
  EXPECT_NE(missing.find("expert parameter model.language_model.layers.5.experts.down_proj is targeted but "
                         "model.language_model.layers.5.experts.lora_B.weight is missing"),
            std::string::npos) << missing;

  const std::string rank = load_error(both, expert_tensors(2, 1), 1);
  EXPECT_NE(rank.find("expert parameter model.language_model.layers.0.experts.gate_up_proj has rank 2, over the limit "
                      "of 1 (--max-lora-rank)"),
            std::string::npos) << rank;

  // Only gate_up_proj targeted: PEFT saves it under experts, so tensors under experts.base_layer fit nothing.
  const std::string nested = load_error(experts_config({"gate_up_proj"}), expert_tensors(2, 1));
  EXPECT_NE(nested.find("module model.language_model.layers.0.experts.base_layer cannot be adapted: the MoE experts "
                        "are parameters in transformers, adapted through target_parameters"),
            std::string::npos) << nested;

  // Expert tensors without target_parameters, a parameter qatserve does not adapt, and target_parameters as a string.
  const std::string untargeted = load_error(base_config({"gate_proj"}), expert_tensors(2, 1, false, true));
  EXPECT_NE(untargeted.find("experts cannot be adapted"), std::string::npos) << untargeted;
  const std::string other = load_error(experts_config({"experts.down_proj", "router.scale"}),
                                       expert_tensors(2, 1, false, true));
  EXPECT_NE(other.find("target_parameters entry 'router.scale' matches no MoE expert parameter of the base model "
                       "(qatserve adapts the experts' gate_up_proj and down_proj"),
            std::string::npos) << other;
  EXPECT_NE(load_error(experts_config("experts.down_proj"), {}).find("target_parameters must be a list"),
            std::string::npos);
  EXPECT_NE(load_error(experts_config(nlohmann::json::array()), {}).find("target_modules and target_parameters are "
                                                                         "both empty"),
            std::string::npos);
}

// Sequences of one call with adapters on the experts, on the experts and a linear, and none, each equal alone.
TEST_F(LoraExpertsTest, SequencesWithDifferentAdaptersInOneBatchEqualEachAlone) {
  auto a = LoraAdapter::load(write_adapter(tmp_, "a", experts_config({"experts.gate_up_proj", "experts.down_proj"}),
                                           expert_tensors(2, 100)),
                             *model_, "a");
  EXPECT_EQ(a->expert_parameters(), 2 * kMoeLayers);
  EXPECT_EQ(a->bytes(), uint64_t(kMoeLayers) * kExperts * 2 * (64 + 64 + 32 + 64) * sizeof(float));
  std::vector<Tensor> b_tensors = expert_tensors(3, 200, false, true);
  for (Tensor& t : q_proj_tensors(3, 300)) b_tensors.push_back(std::move(t));
  const std::string q_proj0 = "model\\.language_model\\.layers\\.0\\.self_attn\\.q_proj";
  auto b = LoraAdapter::load(write_adapter(tmp_, "b", experts_config({"down_proj"}, q_proj0, 3), b_tensors), *model_,
                             "b");
  EXPECT_EQ(b->expert_parameters(), kMoeLayers);
  std::vector<Tensor> zero_b = expert_tensors(2, 400);
  for (Tensor& t : zero_b)
    if (t.name.ends_with("lora_B.weight")) std::fill(t.values.begin(), t.values.end(), 0.0f);
  auto zero = LoraAdapter::load(write_adapter(tmp_, "zero", experts_config({"experts.gate_up_proj",
                                                                            "experts.down_proj"}), zero_b),
                                *model_, "zero");

  const std::vector<int32_t> p1 = {2, 17, 300, 41, 9, 77, 120, 5, 64, 33, 210}, p2 = {2, 300, 12, 12, 99, 7},
                             p3 = {2, 250, 251, 8};
  expect_batch_equals_each_alone(*model_, *zero, *a, *b, p1, p2, p3);
}

}  // namespace
}  // namespace qs
