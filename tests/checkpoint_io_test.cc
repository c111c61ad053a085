#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/checkpoint.h"
#include "formats/checkpoint_writer.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

std::vector<std::byte> pattern(uint64_t n, int seed) {
  std::vector<std::byte> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return v;
}

void write_all(CheckpointWriter& w, const std::vector<TensorSpec>& specs) {
  while (const TensorSpec* t = w.current()) {
    int seed = static_cast<int>(std::find_if(specs.begin(), specs.end(), [&](auto& s) { return s.name == t->name; }) -
                                specs.begin());
    auto bytes = pattern(t->nbytes(), seed);
    // Deliver in two pieces: append must accept a tensor in parts.
    w.append({bytes.data(), bytes.size() / 2});
    w.append({bytes.data() + bytes.size() / 2, bytes.size() - bytes.size() / 2});
  }
}

std::vector<TensorSpec> sample_specs() {
  return {{"a.weight", DType::BF16, {3, 5}},   {"a.scalar", DType::BF16, {1}},  {"b.weight_packed", DType::I32, {4, 2}},
          {"b.weight_shape", DType::I64, {2}}, {"c.flag", DType::BOOL, {3}},    {"d.empty", DType::F32, {0, 4}},
          {"e.big", DType::F32, {64, 16}}};
}

}  // namespace

TEST(CheckpointIO, RoundTripSingleFile) {
  test::TempDir tmp;
  auto specs = sample_specs();
  {
    CheckpointWriter w(tmp / "ckpt", specs);
    write_all(w, specs);
    w.commit();
  }
  Checkpoint c = Checkpoint::open(tmp / "ckpt");
  ASSERT_EQ(c.shards().size(), 1u);
  EXPECT_EQ(c.shards()[0]->metadata().at("format"), "pt");
  ASSERT_EQ(c.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorRef& t = c.get(specs[i].name);
    EXPECT_EQ(t.dtype(), specs[i].dtype);
    EXPECT_EQ(t.shape(), specs[i].shape);
    auto expect = pattern(specs[i].nbytes(), static_cast<int>(i));
    ASSERT_EQ(t.nbytes(), expect.size());
    EXPECT_EQ(std::memcmp(t.bytes().data(), expect.data(), expect.size()), 0) << specs[i].name;
  }
}

TEST(CheckpointIO, HeaderPaddedAndTensorsAligned) {
  test::TempDir tmp;
  auto specs = sample_specs();
  {
    CheckpointWriter w(tmp / "ckpt", specs);
    write_all(w, specs);
    w.commit();
  }
  Checkpoint checkpoint = Checkpoint::open(tmp / "ckpt");  // owns the mapping the reference below points into
  const auto& file = *checkpoint.shards()[0];
  uint64_t header_len;
  std::ifstream in(file.path(), std::ios::binary);
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
  for (const auto& t : file.tensors()) EXPECT_EQ(t.begin % dtype_size(t.dtype), 0u) << t.name;
}

TEST(CheckpointIO, ShardsWithIndex) {
  test::TempDir tmp;
  auto specs = sample_specs();
  {
    CheckpointWriter w(tmp / "ckpt", specs, /*max_shard_bytes=*/2048);
    write_all(w, specs);
    EXPECT_GT(w.shard_count(), 1u);
    w.commit();
  }
  EXPECT_TRUE(std::filesystem::exists(tmp / "ckpt/model.safetensors.index.json"));
  Checkpoint c = Checkpoint::open(tmp / "ckpt");
  EXPECT_GT(c.shards().size(), 1u);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto expect = pattern(specs[i].nbytes(), static_cast<int>(i));
    EXPECT_EQ(std::memcmp(c.get(specs[i].name).bytes().data(), expect.data(), expect.size()), 0);
  }
  std::ifstream idx(tmp / "ckpt/model.safetensors.index.json");
  auto j = nlohmann::json::parse(idx);
  EXPECT_EQ(j["weight_map"].size(), specs.size());
}

TEST(CheckpointIO, UnfinishedWriteLeavesNothing) {
  test::TempDir tmp;
  auto specs = sample_specs();
  {
    CheckpointWriter w(tmp / "ckpt", specs);
    auto bytes = pattern(w.current()->nbytes(), 0);
    w.append(bytes);
    EXPECT_THROW(w.commit(), Error);  // incomplete
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

TEST(CheckpointIO, RefusesExistingDestination) {
  test::TempDir tmp;
  std::filesystem::create_directory(tmp / "ckpt");
  std::ofstream(tmp / "ckpt/keep.txt") << "mine";
  EXPECT_THROW(CheckpointWriter(tmp / "ckpt", sample_specs()), Error);
  EXPECT_TRUE(std::filesystem::exists(tmp / "ckpt/keep.txt"));
}

TEST(CheckpointIO, SingleFileCanBeOpenedDirectly) {
  test::TempDir tmp;
  auto specs = sample_specs();
  {
    CheckpointWriter w(tmp / "ckpt", specs);
    write_all(w, specs);
    w.commit();
  }
  Checkpoint c = Checkpoint::open(tmp / "ckpt/model.safetensors");
  EXPECT_TRUE(c.is_single_file());
  EXPECT_FALSE(c.config_path().has_value());
  EXPECT_EQ(c.tensors().size(), specs.size());
}

}  // namespace qs
