#include "checkpoint_tools/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>

#include "checkpoint_tools/float_linears.h"
#include "checkpoint_tools/qat_rows.h"
#include "formats/checkpoint.h"
#include "formats/model_config.h"
#include "model/gemma4_tensors.h"
#include "quant/qat_grid.h"
#include "quant/w4a16.h"
#include "util/error.h"
#include "util/interrupt.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

class Verifier {
 public:
  Verifier(const VerifyOptions& opt, const Checkpoint& src, const Checkpoint& dst, const ModelConfig& dst_config)
      : opt_(opt), src_(src), dst_(dst), config_(dst_config), group_(dst_config.quantization->group_size()),
        progress_("verify", src.total_tensor_bytes(), opt.progress) {}

  VerifyResult run() {
    const TensorRef* embed = src_.find(config_.text_prefix() + "embed_tokens.weight");
    for (const auto& t : src_.tensors()) {
      throw_if_interrupted();
      verify_source_tensor(t, embed);
      t.release();
      progress_.advance(t.nbytes());
    }
    if (!config_.quantization->ignores("lm_head"))
      fail("module 'lm_head' is not on quantization_config.ignore: compressed-tensors would expect it packed and "
           "transformers could not tie it to the embedding");
    for (const auto& t : dst_.tensors())
      if (!accounted_.count(t.name()))
        fail(fmt::format("DST has tensor '{}', which nothing in SRC accounts for", t.name()));
    progress_.finish();
    result_.seconds = progress_.elapsed_seconds();
    return result_;
  }

 private:
  static float max_error(std::span<const float> values, std::span<const int8_t> levels, float scale) {
    float worst = 0;
    for (size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::fabs(levels[i] * scale - values[i]));
    return worst;
  }

  void lossy(std::string where, float error) {
    std::lock_guard lock(mu_);
    if (result_.lossy_groups++ == 0) result_.first_lossy = std::move(where);
    result_.lossy_max_error = std::max(result_.lossy_max_error, error);
  }

  void fail(std::string what) {
    std::lock_guard lock(mu_);
    ++result_.failures;
    if (result_.first_failures.size() < opt_.max_failures_shown) result_.first_failures.push_back(std::move(what));
  }

  bool packed_in_dst(const std::string& module) const { return dst_.find(module + ".weight_packed") != nullptr; }

  void verify_source_tensor(const TensorRef& t, const TensorRef* embed) {
    std::string module = module_of(t.name());
    bool experts = t.name().ends_with("experts.gate_up_proj") || t.name().ends_with("experts.down_proj");
    std::string layer = experts ? t.name().substr(0, t.name().find("experts.")) : "";
    if (t.name().ends_with(".weight") && packed_in_dst(module)) {
      check_quantized(t, module, 0, t.shape()[0]);
      ++result_.tensors_quantized;
    } else if (experts && packed_in_dst(expert_module(layer, 0, t.name().ends_with("down_proj") ? "down_proj" : "gate_proj"))) {
      check_split_experts(t, layer);
      ++result_.tensors_quantized;
    } else if (const TensorRef* d = dst_.find(t.name())) {
      accounted_.insert(t.name());
      ++result_.tensors_copied;
      if (!same_tensor_contents(*d, t))
        fail(fmt::format("tensor '{}' was copied but differs from SRC ({} [{}] vs {} [{}] or different bytes)",
                         t.name(), dtype_name(d->dtype()), fmt::join(d->shape(), ","), dtype_name(t.dtype()),
                         fmt::join(t.shape(), ",")));
      bool float_linear = is_float_linear_weight(t.name(), t.shape());
      if (float_linear && !config_.quantization->ignores(module))
        fail(fmt::format("module '{}' is stored in {} but is not on quantization_config.ignore: vLLM would look "
                         "for {}.weight_packed",
                         module, dtype_name(t.dtype()), module));
    } else if (t.name() == "lm_head.weight" && config_.text.tie_word_embeddings && embed &&
               same_tensor_contents(*embed, t)) {
      // A redundant tied head, dropped by the repack.
    } else {
      fail(fmt::format("tensor '{}' of SRC is missing from DST", t.name()));
    }
  }

  void check_split_experts(const TensorRef& t, const std::string& layer) {
    int64_t E = t.shape()[0], R = t.shape()[1];
    bool gate_up = t.name().ends_with("gate_up_proj");
    for (int64_t e = 0; e < E; ++e) {
      if (gate_up) {
        check_quantized(t, expert_module(layer, e, "gate_proj"), e * R, R / 2);
        check_quantized(t, expert_module(layer, e, "up_proj"), e * R + R / 2, R / 2);
      } else {
        check_quantized(t, expert_module(layer, e, "down_proj"), e * R, R);
      }
    }
  }

  const TensorRef* dst_part(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    accounted_.insert(name);
    const TensorRef* d = dst_.find(name);
    if (!d) fail(fmt::format("tensor '{}' is missing from DST", name));
    else if (d->dtype() != dtype || d->shape() != shape)
      fail(fmt::format("tensor '{}' is {} [{}]; expected {} [{}]", name, dtype_name(d->dtype()),
                       fmt::join(d->shape(), ","), dtype_name(dtype), fmt::join(shape, ",")));
    else
      return d;
    return nullptr;
  }

  // Rows [row_offset, row_offset + rows) of source tensor t against module's packed levels and scales.
  void check_quantized(const TensorRef& t, const std::string& module, int64_t row_offset, int64_t rows) {
    const int64_t cols = t.shape().back();
    if (t.dtype() != DType::BF16) return fail(fmt::format("tensor '{}' is {}, not bf16", t.name(), dtype_name(t.dtype())));
    if (group_ <= 0 || cols % group_ != 0)
      return fail(fmt::format("module '{}': {} columns do not split into groups of {}", module, cols, group_));
    if (config_.quantization->ignores(module))
      fail(fmt::format("module '{}' is packed but quantization_config.ignore lists it", module));
    const int64_t groups = cols / group_, words = cols / kLevelsPerWord;
    const TensorRef* packed = dst_part(module + ".weight_packed", DType::I32, {rows, words});
    const TensorRef* scale = dst_part(module + ".weight_scale", DType::BF16, {rows, groups});
    const TensorRef* shape = dst_part(module + ".weight_shape", DType::I64, {2});
    if (!packed || !scale || !shape) return;
    if (load_unaligned<int64_t>(shape->bytes().data()) != rows ||
        load_unaligned<int64_t>(shape->bytes().data() + 8) != cols)
      fail(fmt::format("tensor '{}.weight_shape' does not hold [{}, {}]", module, rows, cols));
    Bf16Rows view{t.bytes().data(), cols};
    std::atomic<uint64_t> identical{0};
    ThreadPool::shared().parallel_for(rows, 64, [&](size_t a, size_t b) {
      std::vector<float> values(cols), stored(cols);
      std::vector<int8_t> levels(cols);
      std::vector<uint32_t> words_row(words);
      uint64_t same = 0;
      for (int64_t r = a; r < static_cast<int64_t>(b); ++r) {
        view.load(row_offset + r, values.data());
        std::memcpy(words_row.data(), packed->bytes().data() + r * words * 4, words * 4);
        unpack_int4(words_row, levels);
        for (int64_t g = 0; g < groups; ++g) {
          float s = bf16_to_f32(load_unaligned<uint16_t>(scale->bytes().data() + (r * groups + g) * 2));
          std::span<const float> v(values.data() + g * group_, group_);
          std::span<const int8_t> l(levels.data() + g * group_, group_);
          for (int64_t i = 0; i < group_; ++i) same += round_to_bf16(l[i] * s) == v[i];
          if (group_matches(v, l, s)) continue;
          if (group_nearest_on_scale(v, l, s))
            lossy(fmt::format("module '{}' row {} group {}", module, r, g), max_error(v, l, s));
          else
            fail(fmt::format("module '{}' row {} group {}: scale {} levels [{}] but source values [{}]", module, r, g,
                             s, fmt::join(l, " "), fmt::join(v, " ")));
        }
      }
      identical += same;
    });
    result_.groups_checked += rows * groups;
    result_.values_checked += rows * cols;
    result_.values_bit_identical += identical;
    packed->release();
    scale->release();
  }

  const VerifyOptions& opt_;
  const Checkpoint& src_;
  const Checkpoint& dst_;
  const ModelConfig& config_;
  int64_t group_;
  Progress progress_;
  std::mutex mu_;
  std::set<std::string> accounted_;
  VerifyResult result_;
};

}  // namespace

VerifyResult verify_repack(const VerifyOptions& opt) {
  Checkpoint src = Checkpoint::open(opt.src);
  Checkpoint dst = Checkpoint::open(opt.dst);
  auto dst_config_path = dst.config_path();
  if (!dst_config_path) throw Error(fmt::format("{}: no config.json", opt.dst.string()));
  ModelConfig config = read_model_config(*dst_config_path);
  if (!config.quantization)
    throw Error(fmt::format("{}: no quantization_config; DST is not a W4A16 checkpoint", dst_config_path->string()));
  if (auto why = config.quantization->unsupported_reason(); !why.empty())
    throw Error(fmt::format("{}: quantization_config describes {}", dst_config_path->string(), why));
  VerifyResult r = Verifier(opt, src, dst, config).run();
  r.lossy_allowed = opt.allow_lossy;
  return r;
}

}  // namespace qs
