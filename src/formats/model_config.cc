#include "formats/model_config.h"

#include <fmt/format.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "util/error.h"
#include "util/json_parse.h"
#include "util/file.h"

namespace qs {
namespace {

using json = nlohmann::ordered_json;

// Layer count bound: the default layer_types pattern is built per layer, so 10^12 layers must not allocate.
constexpr int64_t kMaxLayers = 65536;

class FieldReader {
 public:
  FieldReader(const json& obj, std::string_view label, std::string scope)
      : obj_(obj), label_(label), scope_(std::move(scope)) {}

  [[noreturn]] void fail(std::string_view field, const std::string& what) const {
    throw Error(fmt::format("{}: field '{}{}' {}", label_, scope_, field, what));
  }
  bool present(std::string_view f) const { return obj_.contains(f) && !obj_[std::string(f)].is_null(); }

  int64_t integer(std::string_view f, std::optional<int64_t> fallback = std::nullopt, int64_t min = 0,
                  int64_t max = INT64_MAX) const {
    if (!present(f)) {
      if (!fallback) fail(f, "is required (an integer) but missing");
      return *fallback;
    }
    const json& v = obj_[std::string(f)];
    if (!v.is_number_integer()) fail(f, fmt::format("must be an integer, got {}", v.dump()));
    int64_t x = v.get<int64_t>();
    if (x < min) fail(f, fmt::format("must be at least {}, got {}", min, x));
    if (x > max) fail(f, fmt::format("must be at most {}, got {}", max, x));
    return x;
  }
  double number(std::string_view f, double fallback) const {
    if (!present(f)) return fallback;
    const json& v = obj_[std::string(f)];
    if (!v.is_number()) fail(f, fmt::format("must be a number, got {}", v.dump()));
    return v.get<double>();
  }
  bool boolean(std::string_view f, bool fallback) const {
    if (!present(f)) return fallback;
    const json& v = obj_[std::string(f)];
    if (!v.is_boolean()) fail(f, fmt::format("must be true or false, got {}", v.dump()));
    return v.get<bool>();
  }
  std::string string(std::string_view f, std::string fallback) const {
    if (!present(f)) return fallback;
    const json& v = obj_[std::string(f)];
    if (!v.is_string()) fail(f, fmt::format("must be a string, got {}", v.dump()));
    return v.get<std::string>();
  }
  const json& at(std::string_view f) const { return obj_[std::string(f)]; }

 private:
  const json& obj_;
  std::string_view label_;
  std::string scope_;
};

std::vector<LayerType> read_layer_types(const FieldReader& r, int64_t layers) {
  std::vector<LayerType> types;
  if (!r.present("layer_types")) {  // transformers' default pattern, last layer forced full
    for (int64_t i = 0; i < layers; ++i)
      types.push_back((i + 1) % 6 == 0 || i == layers - 1 ? LayerType::Full : LayerType::Sliding);
    return types;
  }
  const json& v = r.at("layer_types");
  if (!v.is_array()) r.fail("layer_types", "must be an array of layer type names");
  for (const json& t : v) {
    if (t == "sliding_attention")
      types.push_back(LayerType::Sliding);
    else if (t == "full_attention")
      types.push_back(LayerType::Full);
    else
      r.fail("layer_types", fmt::format("has {}; expected \"sliding_attention\" or \"full_attention\"", t.dump()));
  }
  if (static_cast<int64_t>(types.size()) != layers)
    r.fail("layer_types", fmt::format("has {} entries but num_hidden_layers is {}", types.size(), layers));
  return types;
}

void read_rope(const FieldReader& r, Gemma4TextConfig& c, std::string_view label) {
  if (!r.present("rope_parameters")) return;
  const json& rp = r.at("rope_parameters");
  if (!rp.is_object()) r.fail("rope_parameters", "must be an object keyed by layer type");
  if (rp.contains("sliding_attention")) {
    FieldReader s(rp["sliding_attention"], label, "text_config.rope_parameters.sliding_attention.");
    c.rope_theta_sliding = s.number("rope_theta", c.rope_theta_sliding);
    c.rope_type_sliding = s.string("rope_type", c.rope_type_sliding);
  }
  if (rp.contains("full_attention")) {
    FieldReader f(rp["full_attention"], label, "text_config.rope_parameters.full_attention.");
    c.rope_theta_full = f.number("rope_theta", c.rope_theta_full);
    c.rope_type_full = f.string("rope_type", c.rope_type_full);
    c.partial_rotary_factor_full = f.number("partial_rotary_factor", c.partial_rotary_factor_full);
  }
}

// The decoder of an assistant drafter: every layer reads the target's K/V (transformers sets num_kv_shared_layers
// to num_hidden_layers when the config leaves it 0), and none of the target-only parts.
void validate_assistant_decoder(Gemma4TextConfig& c, const FieldReader& r) {
  if (c.num_kv_shared_layers == 0) c.num_kv_shared_layers = c.num_hidden_layers;
  if (c.num_kv_shared_layers != c.num_hidden_layers)
    r.fail("num_kv_shared_layers", fmt::format("is {}; every layer of an assistant reads the target's K/V ({})",
                                               c.num_kv_shared_layers, c.num_hidden_layers));
  if (c.has_ple()) r.fail("hidden_size_per_layer_input", "must be 0 in an assistant");
  if (c.enable_moe_block) r.fail("enable_moe_block", "must be false in an assistant");
  if (c.use_double_wide_mlp) r.fail("use_double_wide_mlp", "must be false in an assistant");
}

void validate(const Gemma4TextConfig& c, const FieldReader& r, bool assistant) {
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_attention_heads", fmt::format("({}) must be a multiple of num_key_value_heads ({})",
                                              c.num_attention_heads, c.num_key_value_heads));
  if (c.attention_k_eq_v && c.num_attention_heads % c.num_global_key_value_heads != 0)
    r.fail("num_global_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})",
                                                     c.num_global_key_value_heads, c.num_attention_heads));
  if (c.num_kv_shared_layers >= c.num_hidden_layers && c.num_kv_shared_layers > 0 && !assistant)
    r.fail("num_kv_shared_layers", fmt::format("({}) leaves no layer that computes K/V (num_hidden_layers {})",
                                               c.num_kv_shared_layers, c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_kv_shared(l) && c.kv_source(l) < 0 && !assistant)
      r.fail("layer_types", fmt::format("layer {} is KV-shared ({}) but no earlier non-shared layer has that type "
                                        "to share K/V from",
                                        l, layer_type_name(c.layer_types[l])));
  if (c.enable_moe_block && (c.num_experts <= 0 || c.top_k_experts <= 0 || c.top_k_experts > c.num_experts ||
                             c.moe_intermediate_size <= 0))
    r.fail("enable_moe_block", fmt::format("is true but num_experts={}, top_k_experts={}, moe_intermediate_size={} "
                                           "do not describe an MoE block",
                                           c.num_experts, c.top_k_experts, c.moe_intermediate_size));
  if (c.hidden_activation != "gelu_pytorch_tanh")
    r.fail("hidden_activation", fmt::format("is \"{}\"; Gemma 4 uses \"gelu_pytorch_tanh\"", c.hidden_activation));
}

// gemma4_unified's text config (transformers' Gemma4UnifiedTextConfig) has no per-layer embeddings and no MoE
// block: Google's 12B config still carries those fields as 0 / false / null, anything else is refused rather than
// read as a model transformers would build without them.
void check_unified_text_fields(const FieldReader& r) {
  if (r.integer("hidden_size_per_layer_input", 0) != 0)
    r.fail("hidden_size_per_layer_input", "must be 0 or absent: gemma4_unified has no per-layer embeddings");
  if (r.boolean("enable_moe_block", false))
    r.fail("enable_moe_block", "must be false or absent: gemma4_unified has no MoE block");
}

Gemma4TextConfig parse_text_config(const json& t, std::string_view label, const std::string& scope,
                                   ModelFamily family, bool assistant = false) {
  FieldReader r(t, label, scope);
  const bool unified = family == ModelFamily::Gemma4Unified;
  if (unified) check_unified_text_fields(r);
  Gemma4TextConfig c;
  c.vocab_size = r.integer("vocab_size", std::nullopt, 1);
  c.hidden_size = r.integer("hidden_size", std::nullopt, 1);
  c.intermediate_size = r.integer("intermediate_size", std::nullopt, 1);
  c.num_hidden_layers = r.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers);
  c.num_attention_heads = r.integer("num_attention_heads", std::nullopt, 1);
  c.num_key_value_heads = r.integer("num_key_value_heads", std::nullopt, 1);
  c.head_dim = r.integer("head_dim", std::nullopt, 1);
  c.global_head_dim = r.integer("global_head_dim", 512, 1);
  c.attention_k_eq_v = r.boolean("attention_k_eq_v", false);
  c.num_global_key_value_heads = r.integer("num_global_key_value_heads", c.num_key_value_heads, 1);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.sliding_window = r.integer("sliding_window", unified ? 1024 : 512, 1);
  c.layer_types = read_layer_types(r, c.num_hidden_layers);
  read_rope(r, c, label);
  c.final_logit_softcapping = r.number("final_logit_softcapping", 0.0);
  c.hidden_size_per_layer_input = r.integer("hidden_size_per_layer_input", 0);
  c.vocab_size_per_layer_input = unified ? 0 : r.integer("vocab_size_per_layer_input", c.vocab_size);
  c.num_kv_shared_layers = r.integer("num_kv_shared_layers", 0);
  c.use_double_wide_mlp = r.boolean("use_double_wide_mlp", false);
  c.enable_moe_block = r.boolean("enable_moe_block", false);
  if (c.enable_moe_block) {
    c.num_experts = r.integer("num_experts", std::nullopt, 1);
    c.top_k_experts = r.integer("top_k_experts", std::nullopt, 1);
    c.moe_intermediate_size = r.integer("moe_intermediate_size", std::nullopt, 1);
  }
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
  c.max_position_embeddings = r.integer("max_position_embeddings", unified ? 262144 : 0);
  c.hidden_activation = r.string("hidden_activation", c.hidden_activation);
  c.pad_token_id = r.integer("pad_token_id", 0);
  c.bos_token_id = r.integer("bos_token_id", 2);
  if (r.present("eos_token_id")) {
    const json& e = r.at("eos_token_id");
    if (e.is_number_integer()) c.eos_token_ids = {e.get<int64_t>()};
    else if (e.is_array())
      for (const json& x : e) {
        if (!x.is_number_integer()) r.fail("eos_token_id", fmt::format("entries must be integers, got {}", x.dump()));
        c.eos_token_ids.push_back(x.get<int64_t>());
      }
  }
  // transformers' default: gemma4 none, gemma4_unified "vision". "all" (every token bidirectional, a halved
  // window) is an encoder mode no Gemma 4 checkpoint uses; refused rather than run causally.
  const std::string bidirectional = r.string("use_bidirectional_attention", unified ? "vision" : "");
  if (!bidirectional.empty() && bidirectional != "vision")
    r.fail("use_bidirectional_attention", fmt::format("is \"{}\"; qatserve reads null or \"vision\"", bidirectional));
  c.bidirectional_vision = bidirectional == "vision";
  c.vision_blocks_on_all_layers = unified && c.bidirectional_vision;
  if (assistant) validate_assistant_decoder(c, r);
  validate(c, r, assistant);
  return c;
}

Gemma4AssistantConfig parse_assistant_fields(const FieldReader& top, const Gemma4TextConfig& text,
                                             const std::string& model_type) {
  Gemma4AssistantConfig a;
  // transformers' defaults: E2B's hidden size for gemma4_assistant, 12B's for the unified one.
  a.backbone_hidden_size = top.integer("backbone_hidden_size", model_type == "gemma4_assistant" ? 1536 : 3840, 1);
  a.use_ordered_embeddings = top.boolean("use_ordered_embeddings", false);
  a.num_centroids = top.integer("num_centroids", 2048, 1);
  a.centroid_intermediate_top_k = top.integer("centroid_intermediate_top_k", 32, 1);
  if (a.use_ordered_embeddings) {
    if (text.vocab_size % a.num_centroids != 0)
      top.fail("num_centroids", fmt::format("({}) must divide text_config.vocab_size ({}): each centroid owns as many "
                                            "tokens",
                                            a.num_centroids, text.vocab_size));
    if (a.centroid_intermediate_top_k > a.num_centroids)
      top.fail("centroid_intermediate_top_k", fmt::format("({}) exceeds num_centroids ({})",
                                                          a.centroid_intermediate_top_k, a.num_centroids));
  }
  return a;
}

Gemma4VisionConfig parse_vision_config(const FieldReader& top, std::string_view label) {
  FieldReader r(top.at("vision_config"), label, "vision_config.");
  if (!top.at("vision_config").is_object()) top.fail("vision_config", "must be an object");
  Gemma4VisionConfig v;
  v.hidden_size = r.integer("hidden_size", std::nullopt, 1);
  v.intermediate_size = r.integer("intermediate_size", std::nullopt, 1);
  v.num_hidden_layers = r.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers);
  v.num_attention_heads = r.integer("num_attention_heads", std::nullopt, 1);
  v.num_key_value_heads = r.integer("num_key_value_heads", v.num_attention_heads, 1);
  v.head_dim = r.integer("head_dim", v.hidden_size / v.num_attention_heads, 1);
  v.patch_size = r.integer("patch_size", 16, 1, 1024);
  v.pooling_kernel_size = r.integer("pooling_kernel_size", 3, 1, 64);
  v.position_embedding_size = r.integer("position_embedding_size", 10240, 1);
  v.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  v.use_clipped_linears = r.boolean("use_clipped_linears", false);
  v.standardize = r.boolean("standardize", false);
  if (r.present("rope_parameters")) {
    FieldReader rope(r.at("rope_parameters"), label, "vision_config.rope_parameters.");
    v.rope_theta = rope.number("rope_theta", v.rope_theta);
  }
  if (v.num_attention_heads % v.num_key_value_heads != 0)
    r.fail("num_attention_heads", fmt::format("({}) must be a multiple of num_key_value_heads ({})",
                                              v.num_attention_heads, v.num_key_value_heads));
  // The 2-D rotary embedding splits each head in an x half and a y half, each rotated in pairs.
  if (v.head_dim % 4 != 0) r.fail("head_dim", fmt::format("({}) must be a multiple of 4 (2-D rotary)", v.head_dim));
  v.soft_tokens_per_image =
      top.integer("vision_soft_tokens_per_image", r.integer("default_output_length", 280, 1), 1, 1 << 20);
  v.image_token_id = top.integer("image_token_id", -1, -1);
  v.boi_token_id = top.integer("boi_token_id", -1, -1);
  v.eoi_token_id = top.integer("eoi_token_id", -1, -1);
  return v;
}

Gemma4UnifiedVisionConfig parse_unified_vision_config(const FieldReader& top, std::string_view label) {
  if (!top.at("vision_config").is_object()) top.fail("vision_config", "must be an object");
  FieldReader r(top.at("vision_config"), label, "vision_config.");
  Gemma4UnifiedVisionConfig v;
  v.patch_size = r.integer("patch_size", v.patch_size, 1, 1024);
  v.pooling_kernel_size = r.integer("pooling_kernel_size", v.pooling_kernel_size, 1, 64);
  v.mm_embed_dim = r.integer("mm_embed_dim", v.mm_embed_dim, 1, 1 << 20);
  v.mm_posemb_size = r.integer("mm_posemb_size", v.mm_posemb_size, 1, 1 << 20);
  v.rms_norm_eps = r.number("rms_norm_eps", v.rms_norm_eps);
  // Derived in transformers (a read-only property), but Google's config stores it: it must agree.
  if (r.present("model_patch_size") && r.integer("model_patch_size") != v.model_patch_size())
    r.fail("model_patch_size", fmt::format("must be patch_size x pooling_kernel_size = {}", v.model_patch_size()));
  return v;
}

Gemma4UnifiedAudioConfig parse_unified_audio_config(const FieldReader& top, std::string_view label) {
  if (!top.at("audio_config").is_object()) top.fail("audio_config", "must be an object");
  FieldReader r(top.at("audio_config"), label, "audio_config.");
  Gemma4UnifiedAudioConfig a;
  a.audio_embed_dim = r.integer("audio_embed_dim", a.audio_embed_dim, 1, 1 << 20);
  a.rms_norm_eps = r.number("rms_norm_eps", a.rms_norm_eps);
  return a;
}

QuantizationScheme parse_scheme(const std::string& name, const json& g, std::string_view label) {
  std::string scope = "quantization_config.config_groups." + name + ".";
  FieldReader r(g, label, scope);
  QuantizationScheme s;
  s.name = name;
  if (r.present("targets"))
    for (const json& t : r.at("targets")) s.targets.push_back(t.is_string() ? t.get<std::string>() : t.dump());
  s.format = r.string("format", "");
  s.has_input_activations = r.present("input_activations");
  if (!r.present("weights")) r.fail("weights", "is required: qatserve reads weight-quantized schemes");
  FieldReader w(r.at("weights"), label, scope + "weights.");
  s.num_bits = static_cast<int>(w.integer("num_bits", 8, 1));
  s.type = w.string("type", "int");
  s.symmetric = w.boolean("symmetric", true);
  s.group_size = w.present("group_size") ? w.integer("group_size", std::nullopt, -1) : 0;
  s.strategy = w.string("strategy", s.group_size > 0 ? "group" : "channel");
  s.actorder = w.present("actorder") && w.at("actorder").is_string() ? w.at("actorder").get<std::string>() : "";
  return s;
}

CompressedTensorsConfig parse_quantization(const json& q, std::string_view label) {
  FieldReader r(q, label, "quantization_config.");
  CompressedTensorsConfig c;
  c.quant_method = r.string("quant_method", "");
  c.format = r.string("format", "");
  if (r.present("config_groups")) {
    const json& groups = r.at("config_groups");
    if (!groups.is_object()) r.fail("config_groups", "must be an object of schemes");
    for (const auto& [name, g] : groups.items()) c.schemes.push_back(parse_scheme(name, g, label));
  }
  if (r.present("ignore")) {
    const json& ig = r.at("ignore");
    if (!ig.is_array()) r.fail("ignore", "must be an array of module names");
    for (const json& e : ig) {
      if (!e.is_string()) r.fail("ignore", fmt::format("entries must be strings, got {}", e.dump()));
      c.ignore.push_back(e.get<std::string>());
    }
  }
  return c;
}

}  // namespace

std::string_view layer_type_name(LayerType t) {
  return t == LayerType::Full ? "full_attention" : "sliding_attention";
}

int64_t Gemma4TextConfig::kv_source(int64_t l) const { return is_kv_shared(l) ? last_kv_layer(layer_types[l]) : l; }

int64_t Gemma4TextConfig::last_kv_layer(LayerType type) const {
  for (int64_t s = first_shared_layer() - 1; s >= 0; --s)
    if (layer_types[s] == type) return s;
  return -1;
}

int64_t Gemma4TextConfig::layer_kv_heads(int64_t l) const {
  return attention_k_eq_v && is_full(l) ? num_global_key_value_heads : num_key_value_heads;
}

int64_t Gemma4TextConfig::layer_intermediate(int64_t l) const {
  return use_double_wide_mlp && is_kv_shared(l) ? 2 * intermediate_size : intermediate_size;
}

bool CompressedTensorsConfig::ignores(std::string_view module) const {
  for (const auto& e : ignore) {
    if (e.rfind("re:", 0) == 0) {
      try {
        std::regex re(e.substr(3));
        if (std::regex_search(module.begin(), module.end(), re, std::regex_constants::match_continuous)) return true;
      } catch (const std::regex_error&) {
        throw Error(fmt::format("quantization_config.ignore entry '{}' is not a valid regular expression", e));
      }
    } else if (e == module) {
      return true;
    }
  }
  return false;
}

std::string CompressedTensorsConfig::unsupported_reason() const {
  if (quant_method != "compressed-tensors")
    return fmt::format("quant_method \"{}\" (qatserve reads \"compressed-tensors\")", quant_method);
  if (schemes.empty()) return "no config_groups";
  for (const auto& s : schemes) {
    std::string fmt_name = s.format.empty() ? format : s.format;
    if (fmt_name != "pack-quantized")
      return fmt::format("scheme {}: format \"{}\" (qatserve reads \"pack-quantized\")", s.name, fmt_name);
    if (s.num_bits != 4 || s.type != "int" || !s.symmetric)
      return fmt::format("scheme {}: {}-bit {} {} weights (qatserve reads symmetric 4-bit int)", s.name, s.num_bits,
                         s.symmetric ? "symmetric" : "asymmetric", s.type);
    if (s.strategy != "group" || s.group_size <= 0 || s.group_size % 8 != 0)
      return fmt::format("scheme {}: strategy \"{}\" with group_size {} (qatserve reads groups that are a multiple "
                         "of 8 columns)",
                         s.name, s.strategy, s.group_size);
    if (!s.actorder.empty() && s.actorder != "weight")
      return fmt::format("scheme {}: actorder \"{}\" (weight_g_idx is not supported)", s.name, s.actorder);
    if (s.has_input_activations)
      return fmt::format("scheme {}: quantized input activations (qatserve reads W4A16: weights only)", s.name);
    if (s.group_size != schemes.front().group_size)
      return "config groups with different group sizes";
  }
  return "";
}

ModelConfig parse_model_config(std::string_view text, std::string_view label) {
  ModelConfig m;
  m.raw = parse_json<json>(text, label);  // nesting bounded: a recursive dump() (in an error message, or writing
                                         // the config back out) must not overflow the stack on it
  if (!m.raw.is_object()) throw Error(fmt::format("{}: expected a JSON object", label));
  FieldReader top(m.raw, label, "");
  m.model_type = top.string("model_type", "");
  if (m.model_type == "gemma4_unified" || m.model_type == "gemma4_unified_text") m.family = ModelFamily::Gemma4Unified;
  if (m.is_wrapper()) {
    if (!top.present("text_config") || !top.at("text_config").is_object())
      top.fail("text_config", fmt::format("is required for model_type \"{}\" (an object)", m.model_type));
    m.text = parse_text_config(top.at("text_config"), label, "text_config.", m.family);
    m.has_vision = top.present("vision_config");
    m.has_audio = top.present("audio_config");
    if (m.has_vision && m.is_unified()) m.unified_vision = parse_unified_vision_config(top, label);
    else if (m.has_vision) m.vision = parse_vision_config(top, label);
    if (m.has_audio && m.is_unified()) m.unified_audio = parse_unified_audio_config(top, label);
    // The wrapper's eos list (e.g. [1, 106]) is the one generation stops on.
    if (top.present("eos_token_id")) {
      m.text.eos_token_ids.clear();
      const json& e = top.at("eos_token_id");
      if (e.is_array())
        for (const json& x : e) {
          if (!x.is_number_integer())
            top.fail("eos_token_id", fmt::format("entries must be integers, got {}", x.dump()));
          m.text.eos_token_ids.push_back(x.get<int64_t>());
        }
      else if (e.is_number_integer())
        m.text.eos_token_ids.push_back(e.get<int64_t>());
    }
  } else if (m.model_type == "gemma4_text" || m.model_type == "gemma4_unified_text") {
    m.text = parse_text_config(m.raw, label, "", m.family);
  } else if (m.model_type == "gemma4_assistant" || m.model_type == "gemma4_unified_assistant") {
    if (!top.present("text_config") || !top.at("text_config").is_object())
      top.fail("text_config", fmt::format("is required for model_type \"{}\" (an object)", m.model_type));
    m.text = parse_text_config(top.at("text_config"), label, "text_config.", ModelFamily::Gemma4, true);
    m.assistant = parse_assistant_fields(top, m.text, m.model_type);
  } else {
    top.fail("model_type", fmt::format("is \"{}\"; qatserve reads \"gemma4\", \"gemma4_text\", \"gemma4_unified\", "
                                       "\"gemma4_unified_text\", \"gemma4_assistant\" and \"gemma4_unified_assistant\"",
                                       m.model_type));
  }
  if (top.present("quantization_config"))
    m.quantization = parse_quantization(top.at("quantization_config"), label);
  return m;
}

Gemma4AudioConfig parse_audio_config(const ModelConfig& config, std::string_view label) {
  FieldReader top(config.raw, label, "");
  if (!top.present("audio_config") || !top.at("audio_config").is_object())
    top.fail("audio_config", "is required for the audio tower (an object)");
  FieldReader r(top.at("audio_config"), label, "audio_config.");
  Gemma4AudioConfig a;
  a.hidden_size = r.integer("hidden_size", a.hidden_size, 1, 1 << 16);
  a.num_hidden_layers = r.integer("num_hidden_layers", a.num_hidden_layers, 0, 1024);
  a.num_attention_heads = r.integer("num_attention_heads", a.num_attention_heads, 1, a.hidden_size);
  if (a.hidden_size % a.num_attention_heads != 0)
    r.fail("num_attention_heads", fmt::format("must divide hidden_size {}", a.hidden_size));
  if (r.present("subsampling_conv_channels")) {
    const json& v = r.at("subsampling_conv_channels");
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
        v[0].get<int64_t>() < 4 || v[1].get<int64_t>() < 1 || v[0].get<int64_t>() > 1 << 16 ||
        v[1].get<int64_t>() > 1 << 16)
      r.fail("subsampling_conv_channels", fmt::format("must be two channel counts (the first at least 4), got {}",
                                                      v.dump()));
    a.subsampling_conv_channels[0] = v[0].get<int64_t>();
    a.subsampling_conv_channels[1] = v[1].get<int64_t>();
  }
  a.conv_kernel_size = r.integer("conv_kernel_size", a.conv_kernel_size, 1, 1024);
  a.attention_chunk_size = r.integer("attention_chunk_size", a.attention_chunk_size, 1, 1 << 16);
  a.attention_context_left = r.integer("attention_context_left", a.attention_context_left, 1, 1 << 16);
  a.attention_context_right = r.integer("attention_context_right", a.attention_context_right, 0, 1 << 16);
  a.attention_logit_cap = r.number("attention_logit_cap", a.attention_logit_cap);
  if (!(a.attention_logit_cap > 0)) r.fail("attention_logit_cap", "must be positive");
  a.attention_invalid_logits_value = r.number("attention_invalid_logits_value", a.attention_invalid_logits_value);
  a.residual_weight = r.number("residual_weight", a.residual_weight);
  a.rms_norm_eps = r.number("rms_norm_eps", a.rms_norm_eps);
  if (!(a.rms_norm_eps > 0)) r.fail("rms_norm_eps", "must be positive");
  a.gradient_clipping = r.number("gradient_clipping", a.gradient_clipping);
  if (!(a.gradient_clipping > 0)) r.fail("gradient_clipping", "must be positive");
  a.use_clipped_linears = r.boolean("use_clipped_linears", a.use_clipped_linears);
  a.output_proj_dims = r.integer("output_proj_dims", a.output_proj_dims, 1, 1 << 16);
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    r.fail("hidden_act", fmt::format("is \"{}\"; the audio tower implements \"silu\" (\"swish\")", act));
  return a;
}

nlohmann::ordered_json w4a16_quantization_config(const std::vector<std::string>& ignore, int64_t group_size) {
  json weights = {{"actorder", nullptr},   {"block_structure", nullptr}, {"dynamic", false},
                  {"group_size", group_size}, {"num_bits", 4},           {"observer", "memoryless_minmax"},
                  {"observer_kwargs", json::object()}, {"scale_dtype", nullptr}, {"strategy", "group"},
                  {"symmetric", true},     {"type", "int"},              {"zp_dtype", nullptr}};
  json group = {{"format", "pack-quantized"}, {"input_activations", nullptr}, {"output_activations", nullptr},
                {"targets", {"Linear"}},       {"weights", weights}};
  return {{"config_groups", {{"group_0", group}}},
          {"format", "pack-quantized"},
          {"global_compression_ratio", nullptr},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"},
          {"sparsity_config", json::object()},
          {"transform_config", json::object()}};
}

ModelConfig read_model_config(const std::filesystem::path& path) {
  return parse_model_config(read_file(path), path.string());
}

}  // namespace qs
