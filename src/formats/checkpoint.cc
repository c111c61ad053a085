#include "formats/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json_parse.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

// weight_map from the index: tensor name -> shard file name, shards in first-mention order.
std::map<std::string, std::string> read_index(const fs::path& index_path, std::vector<std::string>& shard_order) {
  std::string label = index_path.string();
  nlohmann::json j = read_json_file(index_path);  // nesting bounded: a dump() in an error message recurses
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(fmt::format("{}: expected an object with a 'weight_map' object", label));
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw Error(fmt::format("{}: weight_map['{}'] must be a shard file name, got {}", label, name, file.dump()));
    std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      throw Error(fmt::format("{}: weight_map['{}'] names '{}', which is not a file in this directory", label,
                              name, shard));
    if (std::find(shard_order.begin(), shard_order.end(), shard) == shard_order.end()) shard_order.push_back(shard);
    map.emplace(name, std::move(shard));
  }
  return map;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint c;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    c.dir_ = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    c.single_file_ = true;
    c.shards_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
  } else if (fs::is_directory(path, ec)) {
    c.dir_ = path;
    std::map<std::string, std::string> weight_map;
    std::vector<std::string> shard_names;
    if (fs::exists(path / kIndexName)) {
      weight_map = read_index(path / kIndexName, shard_names);
    } else if (fs::exists(path / "model.safetensors")) {
      shard_names.push_back("model.safetensors");
    } else {
      throw Error(fmt::format("{}: no {} and no model.safetensors in this directory", path.string(), kIndexName));
    }
    for (const auto& name : shard_names) {
      fs::path shard = path / name;
      if (!fs::exists(shard))
        throw Error(fmt::format("{}: the index names shard '{}', which does not exist", (path / kIndexName).string(),
                                name));
      c.shards_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(shard)));
    }
    if (!weight_map.empty()) {
      for (size_t s = 0; s < c.shards_.size(); ++s) {
        for (const auto& t : c.shards_[s]->tensors()) {
          auto it = weight_map.find(t.name);
          if (it == weight_map.end() || it->second != shard_names[s])
            throw Error(fmt::format("{}: tensor '{}' is in {} but the index {}", (path / kIndexName).string(),
                                    t.name, shard_names[s],
                                    it == weight_map.end() ? "does not list it" : "places it in " + it->second));
        }
      }
      for (const auto& [name, shard] : weight_map) {
        size_t s = std::find(shard_names.begin(), shard_names.end(), shard) - shard_names.begin();
        if (!c.shards_[s]->find(name))
          throw Error(fmt::format("{}: the index places tensor '{}' in {}, which does not contain it",
                                  (path / kIndexName).string(), name, shard));
      }
    }
  } else {
    throw Error(fmt::format("{}: no such checkpoint file or directory", path.string()));
  }

  for (const auto& shard : c.shards_)
    for (const auto& t : shard->tensors()) c.tensors_.push_back({shard.get(), &t});
  for (size_t i = 0; i < c.tensors_.size(); ++i) c.by_name_.emplace_back(c.tensors_[i].name(), i);
  std::sort(c.by_name_.begin(), c.by_name_.end());
  for (size_t i = 1; i < c.by_name_.size(); ++i)
    if (c.by_name_[i].first == c.by_name_[i - 1].first)
      throw Error(fmt::format("{}: tensor '{}' appears in two shards", path.string(), c.by_name_[i].first));
  return c;
}

bool same_tensor_contents(const TensorRef& a, const TensorRef& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  constexpr uint64_t kChunk = 64ull << 20;
  for (uint64_t off = 0; off < a.nbytes(); off += kChunk) {
    uint64_t n = std::min(kChunk, a.nbytes() - off);
    bool same = std::memcmp(a.bytes().data() + off, b.bytes().data() + off, n) == 0;
    a.release_bytes(off, off + n);
    b.release_bytes(off, off + n);
    if (!same) return false;
  }
  return true;
}

std::optional<fs::path> Checkpoint::config_path() const {
  fs::path p = dir_ / "config.json";
  if (single_file_ || !fs::exists(p)) return std::nullopt;
  return p;
}

const TensorRef* Checkpoint::find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [](const auto& e, std::string_view n) { return e.first < n; });
  return it != by_name_.end() && it->first == name ? &tensors_[it->second] : nullptr;
}

const TensorRef& Checkpoint::get(std::string_view name) const {
  if (const TensorRef* t = find(name)) return *t;
  throw Error(fmt::format("{}: tensor '{}' is missing", dir_.string(), name));
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes();
  return n;
}

}  // namespace qs
