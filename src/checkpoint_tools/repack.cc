#include "checkpoint_tools/repack.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "checkpoint_tools/float_linears.h"
#include "checkpoint_tools/qat_rows.h"
#include "checkpoint_tools/tensor_stream.h"
#include "formats/checkpoint.h"
#include "formats/checkpoint_writer.h"
#include "model/gemma4_tensors.h"
#include "model/gemma4_tower_tensors.h"
#include "quant/qat_grid.h"
#include "quant/w4a16.h"
#include "util/error.h"
#include "util/parallel.h"

namespace qs {
namespace fs = std::filesystem;
namespace {

// Thrown from inside the write when a tensor turns out to be off the grid: the plan assumed it was not.
struct OffGridFound {
  std::string tensor;
};

enum class Action { Copy, Quantize, SplitExperts, Drop };

struct Planned {
  const TensorRef* src;
  const ArchTensor* arch;  // null for tensors outside the text decoder
  Action action;
};

struct Plan {
  std::vector<Planned> items;
  std::map<std::string, std::string> kept;  // quantizable tensors left bf16 -> reason
  std::vector<std::string> notes, dropped, ignore;
};

uint64_t free_bytes(const fs::path& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

std::string quantize_blocker(const ArchTensor& a, const TensorRef& t) {
  if (t.dtype() != DType::BF16)
    return fmt::format("dtype {}: the repack reads bf16 QAT exports", dtype_name(t.dtype()));
  if (a.shape.back() % kQatGroupSize != 0)
    return fmt::format("{} input columns is not a multiple of the group size {}", a.shape.back(), kQatGroupSize);
  return "";
}

void check_against_architecture(const Checkpoint& src, const std::vector<ArchTensor>& arch) {
  for (const auto& a : arch) {
    const TensorRef* t = src.find(a.name);
    if (!t)
      throw Error(fmt::format("{}: tensor '{}' (shape [{}]) is missing; the config's architecture needs it",
                              src.dir().string(), a.name, fmt::join(a.shape, ", ")));
    if (t->shape() != a.shape)
      throw Error(fmt::format("{}: tensor '{}' has shape [{}] but the config implies [{}]", src.dir().string(),
                              a.name, fmt::join(t->shape(), ", "), fmt::join(a.shape, ", ")));
  }
}

// Members of a fused group (q/k/v, gate/up, a layer's experts) must share a scheme, or vLLM refuses the file.
void keep_fused_partners(const std::vector<ArchTensor>& arch, std::map<std::string, std::string>& kept) {
  std::map<std::string, std::string> group_reason;
  for (const auto& a : arch)
    if (!a.fused_group.empty() && kept.count(a.name) && !group_reason.count(a.fused_group))
      group_reason[a.fused_group] = a.name;
  for (const auto& a : arch)
    if (!a.fused_group.empty() && group_reason.count(a.fused_group) && !kept.count(a.name))
      kept[a.name] = fmt::format("vLLM loads it fused with {}, which stays bf16", group_reason[a.fused_group]);
}

Plan make_plan(const Checkpoint& src, const ModelConfig& config, const std::vector<ArchTensor>& arch,
               std::map<std::string, std::string> kept) {
  std::map<std::string, const ArchTensor*> by_name;
  for (const auto& a : arch) by_name[a.name] = &a;
  for (const auto& a : arch)
    if (a.quantized_in_w4a16 && !kept.count(a.name))
      if (auto why = quantize_blocker(a, src.get(a.name)); !why.empty()) kept[a.name] = why;
  keep_fused_partners(arch, kept);

  Plan plan;
  plan.kept = kept;
  auto tolerated = gemma4_tolerated_extras(config);
  const TensorRef& embed = src.get(arch.front().name);
  for (const auto& t : src.tensors()) {
    auto it = by_name.find(t.name());
    const ArchTensor* a = it == by_name.end() ? nullptr : it->second;
    Action action = Action::Copy;
    if (a && a->quantized_in_w4a16 && !kept.count(a->name))
      action = a->role == TensorRole::FusedExperts ? Action::SplitExperts : Action::Quantize;
    if (t.name() == "lm_head.weight" && config.text.tie_word_embeddings && same_tensor_contents(t, embed)) {
      action = Action::Drop;
      plan.dropped.push_back(t.name());
      plan.notes.push_back("dropped lm_head.weight: tie_word_embeddings is true and it is byte-identical to " +
                           embed.name());
    }
    if (!a && std::find(tolerated.begin(), tolerated.end(), t.name()) == tolerated.end() &&
        !is_tower_tensor(t.name()))
      plan.notes.push_back(fmt::format("copied '{}' unchanged: not part of the Gemma 4 text architecture", t.name()));
    plan.items.push_back({&t, a, action});
    bool float_linear = action == Action::Copy && (is_float_linear_weight(t.name(), t.shape()) ||
                                                   (a && (a->role == TensorRole::RouterLinear || kept.count(a->name))));
    if (float_linear && t.name() != "lm_head.weight") plan.ignore.push_back(module_of(t.name()));
  }
  // The tied head is a Linear too: unless ignored, compressed-tensors expects it packed and transformers
  // cannot tie it to the embedding. Google's files list it whether or not lm_head.weight is stored.
  plan.ignore.insert(plan.ignore.begin(), "lm_head");
  return plan;
}

// --- producing output tensors ---------------------------------------------------------------------------

struct ScaleBuffer {
  std::once_flag once;
  std::vector<uint16_t> data;
};

// weight_packed, weight_scale and weight_shape of rows [row_offset, row_offset + rows) of src. The scales are
// computed with the levels and held until weight_scale, written right after weight_packed, takes them.
void add_quantized(std::vector<OutputTensor>& out, const RepackReport& report, const std::string& module,
                   const TensorRef& src, int64_t row_offset, int64_t rows, int64_t cols,
                   std::function<void()> after = {}) {
  const RepackGrid grid = report.grid;
  const std::shared_ptr<std::atomic<uint64_t>> reproduced = report.groups_reproduced;
  auto scales = std::make_shared<ScaleBuffer>();
  int64_t groups = cols / kQatGroupSize, words = cols / kLevelsPerWord;
  Bf16Rows view{src.bytes().data(), cols};
  std::string name = src.name();
  OutputTensor packed{{module + ".weight_packed", DType::I32, {rows, words}}, rows,
                      static_cast<uint64_t>(rows * cols * 2)};
  packed.source = src.bytes().subspan(row_offset * cols * 2, rows * cols * 2);
  packed.fill = [=](int64_t r0, int64_t r1, std::byte* dst) {
    std::call_once(scales->once, [&] { scales->data.resize(rows * groups); });
    if (fit_rows(view, row_offset + r0, row_offset + r1, reinterpret_cast<uint32_t*>(dst),
                 scales->data.data() + r0 * groups, grid, reproduced.get()))
      return;
    throw OffGridFound{name};
  };
  OutputTensor scale{{module + ".weight_scale", DType::BF16, {rows, groups}, 4}, rows};
  scale.fill = [=](int64_t r0, int64_t r1, std::byte* dst) {
    std::memcpy(dst, scales->data.data() + r0 * groups, (r1 - r0) * groups * 2);
  };
  scale.done = [=] {
    std::vector<uint16_t>().swap(scales->data);
    if (after) after();
  };
  std::vector<std::byte> shape(16);
  std::memcpy(shape.data(), &rows, 8);
  std::memcpy(shape.data() + 8, &cols, 8);
  out.push_back(std::move(packed));
  out.push_back(std::move(scale));
  out.push_back(constant_tensor({module + ".weight_shape", DType::I64, {2}}, std::move(shape)));
}

std::vector<OutputTensor> make_outputs(const Plan& plan, RepackReport& report) {
  std::vector<OutputTensor> out;
  for (const auto& item : plan.items) {
    const TensorRef& t = *item.src;
    report.bytes_in += t.nbytes();
    switch (item.action) {
      case Action::Drop: break;
      case Action::Copy:
        out.push_back(copied_tensor(t));
        ++report.tensors_copied;
        break;
      case Action::Quantize:
        add_quantized(out, report, item.arch->module, t, 0, t.shape()[0], t.shape()[1], [t] { t.release(); });
        ++report.tensors_quantized;
        report.groups += t.nbytes() / 2 / kQatGroupSize;
        break;
      case Action::SplitExperts: {
        int64_t E = t.shape()[0], R = t.shape()[1], C = t.shape()[2];
        std::string layer = t.name().substr(0, t.name().find("experts."));
        bool gate_up = t.name().ends_with("gate_up_proj");
        auto release = [t] { t.release(); };
        for (int64_t e = 0; e < E; ++e) {
          std::function<void()> after = e + 1 == E ? release : std::function<void()>{};
          if (gate_up) {
            add_quantized(out, report, expert_module(layer, e, "gate_proj"), t, e * R, R / 2, C);
            add_quantized(out, report, expert_module(layer, e, "up_proj"), t, e * R + R / 2, R / 2, C, after);
          } else {
            add_quantized(out, report, expert_module(layer, e, "down_proj"), t, e * R, R, C, after);
          }
        }
        ++report.tensors_quantized;
        report.groups += t.nbytes() / 2 / kQatGroupSize;
        break;
      }
    }
  }
  return out;
}

// --- scanning, when the optimistic plan met an off-grid tensor -----------------------------------------

std::map<std::string, std::string> scan_all(const Checkpoint& src, const std::vector<ArchTensor>& arch,
                                            bool show_progress) {
  std::map<std::string, std::string> kept;
  uint64_t total = 0;
  for (const auto& a : arch)
    if (a.quantized_in_w4a16) total += src.get(a.name).nbytes();
  Progress progress("scan for off-grid groups", total, show_progress);
  for (const auto& a : arch) {
    if (!a.quantized_in_w4a16) continue;
    const TensorRef& t = src.get(a.name);
    if (quantize_blocker(a, t).empty())
      if (auto off = find_off_grid(Bf16Rows{t.bytes().data(), a.shape.back()}, t.nbytes() / 2 / a.shape.back()))
        kept[a.name] = describe_off_grid(*off);
    t.release();
    progress.advance(t.nbytes());
  }
  progress.finish();
  return kept;
}

std::string side_file_filter_reason(const fs::path& p) {
  std::string n = p.filename().string();
  if (n.ends_with(".safetensors") || n == "model.safetensors.index.json" || n == "config.json" ||
      n == "repack_report.json")
    return "replaced";
  return "";
}

}  // namespace

nlohmann::ordered_json RepackReport::to_json() const {
  nlohmann::ordered_json j;
  j["grid"] = repack_grid_name(grid);
  j["lossless"] = *groups_reproduced == groups;
  j["groups_reproduced"] = groups_reproduced->load();
  j["tensors_quantized"] = tensors_quantized;
  j["tensors_copied"] = tensors_copied;
  j["groups_quantized"] = groups;
  j["bytes_in"] = bytes_in;
  j["bytes_out"] = bytes_out;
  j["compression"] = bytes_out ? double(bytes_in) / bytes_out : 0.0;
  j["seconds"] = seconds;
  j["kept_bf16"] = nlohmann::ordered_json::array();
  for (const auto& k : kept) j["kept_bf16"].push_back({{"tensor", k.name}, {"reason", k.reason}});
  j["dropped"] = dropped;
  j["notes"] = notes;
  return j;
}

RepackReport repack_checkpoint(const RepackOptions& opt) {
  Checkpoint src = Checkpoint::open(opt.src);
  auto config_path = src.config_path();
  if (!config_path) throw Error(fmt::format("{}: no config.json; the repack needs the model's config", opt.src.string()));
  ModelConfig config = read_model_config(*config_path);
  if (config.quantization)
    throw Error(fmt::format("{}: already carries a quantization_config ({}); repack reads bf16 QAT exports",
                            config_path->string(), config.quantization->quant_method));
  for (const auto& t : src.tensors())
    if (t.name().ends_with(".weight_packed"))
      throw Error(fmt::format("{}: tensor '{}' is already packed; repack reads bf16 QAT exports",
                              opt.src.string(), t.name()));
  std::vector<ArchTensor> arch = gemma4_text_tensors(config);
  for (Tower tower : {Tower::Vision, Tower::Audio})  // a tower the file holds is checked whole and packed too
    if (std::any_of(src.tensors().begin(), src.tensors().end(),
                    [&](const TensorRef& t) { return is_tower_tensor(t.name(), tower); }))
      for (ArchTensor& a : gemma4_tower_tensors(config, tower)) arch.push_back(std::move(a));
  check_against_architecture(src, arch);

  Progress timer("repack", 0, false);
  std::map<std::string, std::string> kept;
  for (int attempt = 0;; ++attempt) {
    RepackReport report;
    report.grid = opt.grid;
    Plan plan = make_plan(src, config, arch, kept);
    std::vector<OutputTensor> outputs = make_outputs(plan, report);
    for (const auto& o : outputs) report.bytes_out += o.spec.nbytes();
    uint64_t avail = free_bytes(fs::absolute(opt.dst).parent_path());
    if (avail < report.bytes_out + (64ull << 20))
      throw Error(fmt::format("{}: needs {} of free disk space, {} is free; nothing was written", opt.dst.string(),
                              format_bytes(report.bytes_out), format_bytes(avail)));
    for (const auto& [name, reason] : plan.kept) report.kept.push_back({name, reason});
    report.dropped = plan.dropped;
    report.notes = plan.notes;
    if (opt.grid != RepackGrid::Lossless)
      report.notes.push_back(fmt::format("LOSSY: grid {} re-quantizes every group by a fixed rule; "
                                         "`verify --allow-lossy` counts the groups it does not reproduce",
                                         repack_grid_name(opt.grid)));
    try {
      CheckpointWriter writer(opt.dst, specs_of(outputs), opt.max_shard_bytes);
      Progress progress("repack " + opt.src.filename().string(), report.bytes_in, opt.progress);
      stream_tensors(writer, outputs, progress);
      nlohmann::ordered_json cfg = config.raw;
      cfg["quantization_config"] = w4a16_quantization_config(plan.ignore, kQatGroupSize);
      writer.write_file("config.json", cfg.dump(2) + "\n");
      for (const auto& e : fs::directory_iterator(src.dir()))
        if (e.is_regular_file() && side_file_filter_reason(e.path()).empty())
          writer.copy_file(e.path(), e.path().filename().string());
      report.seconds = timer.elapsed_seconds();
      writer.write_file("repack_report.json", report.to_json().dump(2) + "\n");
      writer.commit();
      progress.finish();
      return report;
    } catch (const OffGridFound& f) {
      if (attempt > 0) throw Error(fmt::format("internal: tensor '{}' was off grid after a full scan", f.tensor));
      if (opt.progress)
        fmt::print(stderr, "\nrepack: '{}' has groups off the QAT grid; scanning every tensor, then writing again\n",
                   f.tensor);
      kept = scan_all(src, arch, opt.progress);
    }
  }
}

}  // namespace qs
