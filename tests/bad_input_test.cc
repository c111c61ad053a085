// Malformed inputs: every broken safetensors file, checkpoint directory, config.json and command line must
// end in a qs::Error (for the CLI: a non-zero exit and one error line) whose message names the file and the
// tensor or field and says what was expected. Never a crash, never a half-written output.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"
#include "test_util.h"
#include "util/error.h"

namespace qs {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

// ---- helpers --------------------------------------------------------------------------------------------

// A safetensors file image: u64 little-endian `declared` header length, then `header`, then `data`.
Bytes image_with_length(uint64_t declared, std::string_view header, std::string_view data = {}) {
  Bytes out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((declared >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

// A file image whose length field tells the truth about `header`.
Bytes image(std::string_view header, std::string_view data = {}) {
  return image_with_length(header.size(), header, data);
}

Bytes raw(std::string_view bytes) {
  Bytes out(bytes.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void write_file(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_text(const fs::path& path, std::string_view text) {
  write_file(path, {reinterpret_cast<const std::byte*>(text.data()), text.size()});
}

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return raw(s);
}

// Checks that `message` starts with "<label>:" and contains every needle.
void expect_message(const std::string& message, std::string_view label, std::initializer_list<std::string_view> needles) {
  EXPECT_EQ(message.rfind(std::string(label) + ":", 0), 0u) << "error does not start with the file name: " << message;
  for (std::string_view n : needles)
    EXPECT_NE(message.find(n), std::string::npos) << "error lacks \"" << n << "\": " << message;
}

using qs::test::error_of;

// JSON nested `depth` arrays deep: error messages that print such a value must not recurse on it.
std::string deep_array(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// ---- safetensors: one table of broken files, each read from memory and from disk ------------------------

struct BadFile {
  std::string name;
  Bytes file;
  std::vector<std::string> needles;  // what the message must say, besides naming the file
};

void PrintTo(const BadFile& c, std::ostream* os) { *os << c.name; }

std::vector<BadFile> bad_files() {
  const std::string w_u8_4 = R"("w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  return {
      {"Empty", {}, {"file is 0 bytes", "8-byte header length"}},
      {"ShorterThan8Bytes", raw(std::string_view("\x02\x00\x00", 3)), {"file is 3 bytes", "8-byte header length"}},
      {"HeaderLengthPastEnd", image_with_length(64, "{}"), {"header length 64", "runs past the end of the 10-byte file"}},
      {"HeaderLengthOverLimit", image_with_length(100'000'001, "{}"), {"header length 100000001", "limit of 100000000"}},
      {"HeaderLengthHuge", image_with_length(UINT64_MAX, "{}"), {"header length 18446744073709551615", "limit"}},
      {"NonUtf8Header", image("{\"w\xff\":1}"), {"not valid UTF-8"}},
      {"OverlongUtf8Header", image("{\"\xc0\xaf\":1}"), {"not valid UTF-8"}},
      {"SurrogateUtf8Header", image("{\"\xed\xa0\x80\":1}"), {"not valid UTF-8"}},
      {"NonJsonHeader", image(R"({"w":{"dtype":)"), {"header is not valid JSON"}},
      {"HeaderIsArray", image("[1,2]"), {"header must be a JSON object"}},
      {"HeaderIsString", image(R"("w")"), {"header must be a JSON object"}},
      {"DuplicateTensorNames",
       image(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
             "abcd"),
       {"tensor 'w' twice"}},
      {"EntryNotAnObject", image(R"({"w":[0,4]})", "abcd"), {"tensor 'w' must be an object"}},
      {"EntryWithoutOffsets", image(R"({"w":{"dtype":"U8","shape":[4]}})", "abcd"), {"tensor 'w' has no 'data_offsets'"}},
      {"UnknownDtype", image(R"({"w":{"dtype":"Q4_0","shape":[4],"data_offsets":[0,4]}})", "abcd"),
       {"tensor 'w'", "unknown dtype \"Q4_0\""}},
      {"DtypeNotAString", image(R"({"w":{"dtype":8,"shape":[4],"data_offsets":[0,4]}})", "abcd"),
       {"tensor 'w'", "unknown dtype 8"}},
      {"NegativeShapeEntry", image(R"({"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", "abcd"),
       {"tensor 'w' shape entry", "non-negative integer", "-4"}},
      {"FloatShapeEntry", image(R"({"w":{"dtype":"U8","shape":[2.5,2],"data_offsets":[0,4]}})", "abcd"),
       {"tensor 'w' shape entry", "non-negative integer", "2.5"}},
      {"ShapeNotAnArray", image(R"({"w":{"dtype":"U8","shape":4,"data_offsets":[0,4]}})", "abcd"),
       {"tensor 'w' shape must be an array"}},
      {"OffsetsNotAPair", image(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[4]}})", "abcd"),
       {"tensor 'w' data_offsets must be [begin, end]"}},
      {"NegativeOffset", image(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[-1,3]}})", "abcd"),
       {"tensor 'w' data_offsets[0]", "non-negative integer"}},
      {"OffsetsEndBeforeBegin", image(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "abcd"),
       {"tensor 'w'", "end before begin"}},
      {"DtypeShapeDisagreeWithLength", image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "abcdefgh"),
       {"tensor 'w' holds 8 bytes but dtype F32 and shape [3] need 12"}},
      {"OverlappingOffsets",
       image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
             "abcdef"),
       {"tensor 'b' starts at byte 2", "previous tensor ends at 4"}},
      {"GappedOffsets",
       image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
             "abcde"),
       {"tensor 'b' starts at byte 3", "previous tensor ends at 2"}},
      {"FirstTensorNotAtZero", image(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[1,5]}})", "abcde"),
       {"tensor 'w' starts at byte 1", "ends at 0"}},
      {"TruncatedData", image("{" + w_u8_4 + "}", "abc"), {"tensors cover 4 bytes but the data buffer holds 3", "truncated"}},
      {"TrailingBytes", image("{" + w_u8_4 + "}", "abcde"), {"tensors cover 4 bytes but the data buffer holds 5", "trailing"}},
      {"ShapeProductOverflowsBytes",
       image(R"({"w":{"dtype":"I64","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}})"),
       {"tensor 'w' shape", "overflows"}},
      {"ShapeProductOverflowsBytesWithoutZero",
       image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
       {"tensor 'w' shape", "overflows"}},
      // 2^62 x 2 elements of one byte fit a u64 byte count, but not TensorEntry::numel()'s int64.
      {"ShapeElementCountOverflowsBeforeAZero",
       image(R"({"w":{"dtype":"U8","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})"),
       {"tensor 'w' shape", "overflows"}},
      {"ShapeEntryPastInt64", image(R"({"w":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})"),
       {"tensor 'w' shape entry is too large"}},
      {"MetadataNonStringValue", image(R"({"__metadata__":{"format":"pt","n":1}})"),
       {"__metadata__['n'] must be a string, got 1"}},
      {"MetadataNestedValue", image(R"({"__metadata__":{"format":{"a":"b"}}})"), {"__metadata__['format'] must be a string"}},
      {"MetadataNotAnObject", image(R"({"__metadata__":["format","pt"]})"), {"__metadata__ must be an object"}},
      // Printing a million-deep value into the message would overflow the stack.
      {"DeeplyNestedDtype",
       image(R"({"w":{"dtype":)" + deep_array(1'000'000) + R"(,"shape":[0],"data_offsets":[0,0]}})"), {"nest"}},
      {"DeeplyNestedMetadata", image(R"({"__metadata__":{"k":)" + deep_array(1'000'000) + "}}"), {"nest"}},
  };
}

class SafetensorsBadInput : public ::testing::TestWithParam<BadFile> {};

TEST_P(SafetensorsBadInput, ParseNamesLabelAndProblem) {
  const BadFile& c = GetParam();
  std::string message = error_of([&] { parse_safetensors(c.file, "bad.safetensors"); });
  expect_message(message, "bad.safetensors", {});
  for (const auto& n : c.needles) EXPECT_NE(message.find(n), std::string::npos) << "lacks \"" << n << "\": " << message;
}

TEST_P(SafetensorsBadInput, OpenNamesPathAndProblem) {
  const BadFile& c = GetParam();
  test::TempDir tmp;
  fs::path path = tmp / "bad.safetensors";
  write_file(path, c.file);
  std::string message = error_of([&] { SafetensorsFile::open(path); });
  expect_message(message, path.string(), {});
  for (const auto& n : c.needles) EXPECT_NE(message.find(n), std::string::npos) << "lacks \"" << n << "\": " << message;
}

INSTANTIATE_TEST_SUITE_P(All, SafetensorsBadInput, ::testing::ValuesIn(bad_files()),
                         [](const auto& info) { return info.param.name; });

TEST(SafetensorsBadInput, OpenMissingFileAndDirectory) {
  test::TempDir tmp;
  expect_message(error_of([&] { SafetensorsFile::open(tmp / "absent.safetensors"); }), (tmp / "absent.safetensors").string(),
                 {"cannot open"});
  expect_message(error_of([&] { SafetensorsFile::open(tmp.path()); }), tmp.path().string(), {"not a regular file"});
}

// ---- safetensors: valid but unusual files read correctly ------------------------------------------------

// Writers that emit tensors in arbitrary order leave an I64 at an odd offset; the reader must memcpy.
TEST(SafetensorsInput, UnalignedI64ReadsCorrectly) {
  const int64_t values[2] = {-3, 0x0102030405060708};
  std::string data = "\x11\x22\x33";  // three U8 bytes push the I64 to an odd address
  data.append(reinterpret_cast<const char*>(values), sizeof values);
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("a.weight_shape":{"dtype":"I64","shape":[2],"data_offsets":[3,19]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // buffer 8-aligned as the reference writer leaves it
  Bytes file = image(header, data);

  test::TempDir tmp;
  write_file(tmp / "odd.safetensors", file);
  SafetensorsFile f = SafetensorsFile::open(tmp / "odd.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const TensorEntry* t = f.find("a.weight_shape");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::I64);
  std::span<const std::byte> bytes = f.data(*t);
  ASSERT_EQ(bytes.size(), 16u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(bytes.data()) % alignof(int64_t), 0u) << "test meant an unaligned tensor";
  EXPECT_EQ(load_unaligned<int64_t>(bytes.data()), values[0]);
  EXPECT_EQ(load_unaligned<int64_t>(bytes.data() + 8), values[1]);
  EXPECT_EQ(std::to_integer<int>(f.data(*f.find("b"))[2]), 0x33);

  // The whole image at an odd address: the header length itself is read unaligned too.
  Bytes shifted(file.size() + 1);
  std::memcpy(shifted.data() + 1, file.data(), file.size());
  SafetensorsHeader h = parse_safetensors(std::span(shifted).subspan(1), "shifted");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[1].name, "a.weight_shape");
  EXPECT_EQ(load_unaligned<int64_t>(shifted.data() + 1 + h.data_start + h.tensors[1].begin + 8), values[1]);
}

TEST(SafetensorsInput, ScalarEmptyAndNoTensorsAreValid) {
  SafetensorsHeader h = parse_safetensors(
      image(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"BF16","shape":[0,7],"data_offsets":[4,4]}})",
            "abcd"),
      "ok");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "s");
  EXPECT_EQ(h.tensors[0].numel(), 1);
  EXPECT_EQ(h.tensors[1].numel(), 0);
  EXPECT_TRUE(parse_safetensors(image("{}        "), "ok").tensors.empty());
}

// ---- checkpoint directories -----------------------------------------------------------------------------

std::string u8_tensor(std::string_view name, int begin, int n) {
  return fmt::format(R"("{}":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}})", name, n, begin, begin + n);
}

// A shard holding 2-byte U8 tensors with these names.
void write_shard(const fs::path& path, std::initializer_list<std::string_view> names) {
  std::string header = "{", data;
  int offset = 0;
  for (std::string_view n : names) {
    if (offset) header += ",";
    header += u8_tensor(n, offset, 2);
    data += "xy";
    offset += 2;
  }
  write_file(path, image(header + "}", data));
}

void write_index(const fs::path& dir, const nlohmann::json& weight_map) {
  write_text(dir / "model.safetensors.index.json", nlohmann::json{{"metadata", {}}, {"weight_map", weight_map}}.dump());
}

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

class CheckpointBadInput : public ::testing::Test {
 protected:
  test::TempDir tmp;
  fs::path dir = tmp / "ckpt";
  std::string index = (dir / "model.safetensors.index.json").string();
  void SetUp() override { fs::create_directories(dir); }
  std::string open_error() { return error_of([&] { Checkpoint::open(dir); }); }
};

TEST_F(CheckpointBadInput, ValidShardedCheckpointOpens) {
  write_shard(dir / kShard1, {"a", "b"});
  write_shard(dir / kShard2, {"c"});
  write_index(dir, {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}});
  Checkpoint c = Checkpoint::open(dir);
  EXPECT_EQ(c.tensors().size(), 3u);
  EXPECT_EQ(c.get("c").file->path(), dir / kShard2);
}

TEST_F(CheckpointBadInput, IndexNamesMissingShard) {
  write_shard(dir / kShard1, {"a"});
  write_index(dir, {{"a", kShard1}, {"b", kShard2}});
  expect_message(open_error(), index, {std::string("shard '") + kShard2 + "'", "does not exist"});
}

TEST_F(CheckpointBadInput, IndexEntryWhoseShardLacksTheTensor) {
  write_shard(dir / kShard1, {"a"});
  write_shard(dir / kShard2, {"c"});
  write_index(dir, {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}});
  expect_message(open_error(), index, {"tensor 'b'", kShard1, "does not contain it"});
}

TEST_F(CheckpointBadInput, TensorInShardButNotInIndex) {
  write_shard(dir / kShard1, {"a", "stray"});
  write_index(dir, {{"a", kShard1}});
  expect_message(open_error(), index, {"tensor 'stray'", kShard1, "does not list it"});
}

TEST_F(CheckpointBadInput, SameTensorInTwoShards) {
  write_shard(dir / kShard1, {"a", "b"});
  write_shard(dir / kShard2, {"b", "c"});
  write_index(dir, {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}});
  expect_message(open_error(), index, {"tensor 'b'", kShard1, kShard2});
}

TEST_F(CheckpointBadInput, NeitherIndexNorModelSafetensors) {
  write_text(dir / "config.json", "{}");
  expect_message(open_error(), dir.string(), {"no model.safetensors.index.json and no model.safetensors"});
}

TEST_F(CheckpointBadInput, IndexIsNotJson) {
  write_shard(dir / kShard1, {"a"});
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": )");
  expect_message(open_error(), index, {"not valid JSON"});
}

TEST_F(CheckpointBadInput, IndexWithoutWeightMap) {
  write_shard(dir / kShard1, {"a"});
  write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_message(open_error(), index, {"'weight_map'"});
}

TEST_F(CheckpointBadInput, IndexEntryNotAFileName) {
  write_shard(dir / kShard1, {"a"});
  write_index(dir, {{"a", 7}});
  expect_message(open_error(), index, {"weight_map['a']", "shard file name"});
  write_index(dir, {{"a", "../" + std::string(kShard1)}});
  expect_message(open_error(), index, {"weight_map['a']", "not a file in this directory"});
}

TEST_F(CheckpointBadInput, IndexDeeplyNested) {
  write_shard(dir / kShard1, {"a"});
  write_text(dir / "model.safetensors.index.json", R"({"weight_map":{"a":)" + deep_array(1'000'000) + "}}");
  expect_message(open_error(), index, {"nest"});
}

TEST_F(CheckpointBadInput, BrokenShardIsNamed) {
  write_file(dir / kShard1, image(fmt::format("{{{}}}", u8_tensor("a", 0, 4)), "ab"));
  write_index(dir, {{"a", kShard1}});
  expect_message(open_error(), (dir / kShard1).string(), {"truncated"});
}

TEST_F(CheckpointBadInput, NoSuchPath) {
  expect_message(error_of([&] { Checkpoint::open(tmp / "absent"); }), (tmp / "absent").string(), {"no such"});
}

// ---- config.json ----------------------------------------------------------------------------------------

nlohmann::ordered_json base_config() {
  std::ifstream in(fs::path(QATSERVE_SOURCE_DIR) / "configs" / "e2b-tiny.json");
  return nlohmann::ordered_json::parse(in);
}

std::string config_error(const nlohmann::ordered_json& j) {
  return error_of([&] { parse_model_config(j.dump(), "cfg.json"); });
}

TEST(ConfigBadInput, BaseConfigParses) {
  ModelConfig m = parse_model_config(base_config().dump(), "cfg.json");
  EXPECT_EQ(m.text.num_hidden_layers, 8);
}

TEST(ConfigBadInput, MissingRequiredFieldIsNamed) {
  for (const char* field : {"hidden_size", "vocab_size", "num_hidden_layers", "head_dim", "num_key_value_heads"}) {
    auto j = base_config();
    j["text_config"].erase(field);
    expect_message(config_error(j), "cfg.json", {std::string("'text_config.") + field + "'", "required"});
  }
  auto text = base_config()["text_config"];  // text-only layout: fields at the top level
  text.erase("hidden_size");
  expect_message(config_error(text), "cfg.json", {"field 'hidden_size'", "required"});
}

TEST(ConfigBadInput, WrongTypeIsNamed) {
  auto j = base_config();
  j["text_config"]["hidden_size"] = "64";
  expect_message(config_error(j), "cfg.json", {"'text_config.hidden_size'", "must be an integer", "\"64\""});
  j = base_config();
  j["text_config"]["num_attention_heads"] = 0;
  expect_message(config_error(j), "cfg.json", {"'text_config.num_attention_heads'", "at least 1"});
}

TEST(ConfigBadInput, LayerTypesLengthDisagrees) {
  auto j = base_config();
  j["text_config"]["layer_types"].erase(0);
  expect_message(config_error(j), "cfg.json", {"'text_config.layer_types'", "7 entries", "num_hidden_layers is 8"});
  j = base_config();
  j["text_config"]["layer_types"][3] = "local_attention";
  expect_message(config_error(j), "cfg.json", {"'text_config.layer_types'", "\"local_attention\""});
}

// Without layer_types the default pattern is built per layer: 10^12 layers must be an error, not an allocation.
TEST(ConfigBadInput, AbsurdLayerCountIsRejected) {
  auto j = base_config();
  j["text_config"].erase("layer_types");
  j["text_config"]["num_hidden_layers"] = 1'000'000'000'000;
  expect_message(config_error(j), "cfg.json", {"'text_config.num_hidden_layers'", "at most"});
}

TEST(ConfigBadInput, KvSharedLayerWithoutDonor) {
  auto j = base_config();  // layers 4..7 share K/V; no full-attention layer before them to borrow from
  j["text_config"]["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                                     "sliding_attention", "full_attention",    "sliding_attention", "full_attention"};
  expect_message(config_error(j), "cfg.json", {"'text_config.layer_types'", "layer 5 is KV-shared (full_attention)"});
  j = base_config();
  j["text_config"]["num_kv_shared_layers"] = 8;
  expect_message(config_error(j), "cfg.json", {"'text_config.num_kv_shared_layers'", "no layer"});
}

TEST(ConfigBadInput, UnknownModelType) {
  auto j = base_config();
  j["model_type"] = "llama";
  expect_message(config_error(j), "cfg.json", {"'model_type'", "\"llama\"", "gemma4"});
  j.erase("model_type");
  expect_message(config_error(j), "cfg.json", {"'model_type'"});
}

TEST(ConfigBadInput, WrapperWithoutTextConfig) {
  auto j = base_config();
  j.erase("text_config");
  expect_message(config_error(j), "cfg.json", {"'text_config'", "required"});
}

TEST(ConfigBadInput, EosTokenIdsMustBeIntegers) {
  auto j = base_config();
  j["eos_token_id"] = {1, "106"};
  expect_message(config_error(j), "cfg.json", {"'eos_token_id'", "\"106\""});
  j = base_config();
  j["text_config"]["eos_token_id"] = {"1"};
  expect_message(config_error(j), "cfg.json", {"'text_config.eos_token_id'"});
}

TEST(ConfigBadInput, NotJsonOrNotAnObject) {
  expect_message(error_of([] { parse_model_config("{\"model_type\": ", "cfg.json"); }), "cfg.json", {"not valid JSON"});
  expect_message(error_of([] { parse_model_config("[]", "cfg.json"); }), "cfg.json", {"JSON object"});
  expect_message(error_of([] { parse_model_config(R"({"model_type":)" + deep_array(1'000'000) + "}", "cfg.json"); }),
                 "cfg.json", {"nest"});
}

// ---- command line ---------------------------------------------------------------------------------------

using test::CliResult;
using test::qatserve;

std::string quoted(const fs::path& p) { return fmt::format("'{}'", p.string()); }

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class CliBadInput : public ::testing::Test {
 protected:
  test::TempDir tmp;
  void synth(const fs::path& out, const std::string& extra = "") {
    CliResult r = qatserve("synth --preset e2b-tiny --quiet --out " + quoted(out) + " " + extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
};

TEST_F(CliBadInput, RepackOfTruncatedShardLeavesNothing) {
  synth(tmp / "src", "--fault-truncate");
  CliResult r = qatserve("repack --quiet " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find((tmp / "src" / "model.safetensors").string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  EXPECT_EQ(entries(tmp.path()), std::vector<std::string>{"src"}) << "no dst and no .dst.partial-* may remain";
}

TEST_F(CliBadInput, RepackOfCheckpointMissingATensorLeavesNothing) {
  const std::string missing = "model.language_model.layers.3.mlp.down_proj.weight";
  synth(tmp / "src", "--fault-missing " + missing);
  CliResult r = qatserve("repack --quiet " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'" + missing + "'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("missing"), std::string::npos) << r.output;
  EXPECT_EQ(entries(tmp.path()), std::vector<std::string>{"src"}) << "no dst and no .dst.partial-* may remain";
}

TEST_F(CliBadInput, RepackRefusesExistingDestination) {
  synth(tmp / "src");
  fs::create_directories(tmp / "dst");
  write_text(tmp / "dst" / "keep.txt", "precious");
  CliResult r = qatserve("repack --quiet " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already exists"), std::string::npos) << r.output;
  EXPECT_EQ(entries(tmp / "dst"), std::vector<std::string>{"keep.txt"});
  Bytes kept = read_file(tmp / "dst" / "keep.txt");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(kept.data()), kept.size()), "precious");
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"dst", "src"}));
}

TEST_F(CliBadInput, VerifyNamesModuleRowAndGroupOfAFlippedPackedByte) {
  synth(tmp / "src");
  CliResult r = qatserve("repack --quiet " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string module = "model.language_model.layers.0.self_attn.q_proj";
  fs::path shard = tmp / "dst" / "model.safetensors";
  Bytes file = read_file(shard);
  SafetensorsHeader h = parse_safetensors(file, shard.string());
  auto t = std::find_if(h.tensors.begin(), h.tensors.end(), [&](auto& e) { return e.name == module + ".weight_packed"; });
  ASSERT_NE(t, h.tensors.end());
  ASSERT_EQ(t->dtype, DType::I32);
  ASSERT_EQ(t->shape.size(), 2u);
  const int64_t words_per_row = t->shape[1], group = read_model_config(tmp / "dst" / "config.json").quantization->group_size();
  ASSERT_GT(group, 0);
  const int64_t row = t->shape[0] / 2, word = words_per_row - 1;  // 8 int4 levels per I32 word
  file[h.data_start + t->begin + (row * words_per_row + word) * 4 + 1] ^= std::byte{0xff};
  write_file(shard, file);

  r = qatserve("verify --quiet " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::string expected = "FAIL module '" + module + "' row " + std::to_string(row) + " group " + std::to_string(word * 8 / group);
  EXPECT_NE(r.output.find(expected), std::string::npos) << "expected \"" << expected << "\" in:\n" << r.output;
  EXPECT_NE(r.output.find("FAILED: 1 problem"), std::string::npos) << r.output;
}

TEST_F(CliBadInput, VerifyOfALossyGridExitsOneUnlessAllowed) {
  synth(tmp / "src");
  CliResult r = qatserve("repack --quiet --grid textbook " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("LOSSY: grid textbook"), std::string::npos) << r.output;
  r = qatserve("verify --quiet " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("groups not reproduced"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pass --allow-lossy"), std::string::npos) << r.output;
  r = qatserve("verify --quiet --allow-lossy " + quoted(tmp / "src") + " " + quoted(tmp / "dst"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("OK: lossy (allowed)"), std::string::npos) << r.output;
  r = qatserve("repack --quiet --grid amax8 " + quoted(tmp / "src") + " " + quoted(tmp / "dst2"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--grid"), std::string::npos) << r.output;
}

TEST_F(CliBadInput, EvalNamesItsBadInput) {
  synth(tmp / "src");
  std::ofstream(tmp / "ids.txt") << "5, 6\n99999999\n";
  CliResult r = qatserve("eval --model " + quoted(tmp / "src") + " --tokens " + quoted(tmp / "ids.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("token 3 of the text (counting from 1) is id 99999999"), std::string::npos)
      << r.output;
  std::ofstream(tmp / "bad.txt") << "5 six\n";
  r = qatserve("eval --model " + quoted(tmp / "src") + " --tokens " + quoted(tmp / "bad.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("item 2 'six' is not a token id"), std::string::npos) << r.output;
  r = qatserve("eval --model " + quoted(tmp / "src") + " --text " + quoted(tmp / "bad.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no tokenizer.json, which --text needs"), std::string::npos) << r.output;
  r = qatserve("eval --model " + quoted(tmp / "src"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--text FILE or --tokens FILE"), std::string::npos) << r.output;
}

// The operator's --tools / --json-schema files (and --messages, read the same way) get the server's bound on nesting:
// a clear error, not a stack overflow in the chat template or the schema compiler.
TEST_F(CliBadInput, GenerateRefusesJsonFilesNestedTooDeep) {
  synth(tmp / "src");
  std::ofstream(tmp / "deep.json") << std::string(100000, '[') << std::string(100000, ']');
  for (const char* flag : {"--tools", "--json-schema"}) {
    CliResult r = qatserve("generate --model " + quoted(tmp / "src") + " --tokens 5,6 --max-tokens 2 " + flag + " " +
                           quoted(tmp / "deep.json"));
    EXPECT_EQ(r.exit_code, 1) << flag << ": " << r.output;
    EXPECT_NE(r.output.find("deep.json: JSON nests more than 128 levels deep"), std::string::npos) << r.output;
  }
}

TEST_F(CliBadInput, ServeNamesABadKvMemory) {
  for (const char* size : {"12Q", "lots", "0"}) {
    CliResult r = qatserve(fmt::format("serve --model {} --kv-memory {}", quoted(tmp / "absent"), size));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find(fmt::format("--kv-memory '{}'", size)), std::string::npos) << r.output;
  }
}

TEST_F(CliBadInput, InspectOfTruncatedFileFails) {
  synth(tmp / "src", "--fault-truncate");
  for (const fs::path& p : {tmp / "src" / "model.safetensors", tmp / "src"}) {
    CliResult r = qatserve("inspect " + quoted(p));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find((tmp / "src" / "model.safetensors").string() + ":"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  }
}

TEST_F(CliBadInput, InspectOfGarbageFileFails) {
  write_text(tmp / "junk.safetensors", "this is not a safetensors file at all");
  CliResult r = qatserve("inspect " + quoted(tmp / "junk.safetensors"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find((tmp / "junk.safetensors").string() + ":"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace qs
