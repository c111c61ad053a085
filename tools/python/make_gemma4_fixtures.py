#!/usr/bin/env python3
"""make_gemma4_fixtures.py: external reference fixtures for the C++ Gemma 4 forward pass.

Builds tiny random Gemma 4 text models with Hugging Face transformers (pinned 5.23.0, CPU) and writes, per model,
tests/fixtures/<name>/:
  bf16/                  the model as Google's `-qat-q4_0-unquantized` export stores it: Gemma4ForConditionalGeneration
                         (`model.language_model.*`), bf16 safetensors, Google-style config.json, generation_config.json.
                         Every Linear weight Google's w4a16 export quantizes sits exactly on the QAT grid
                         (groups of 32 input columns = bf16(level x step), level in -8..7, step bf16).
  w4a16/                 the same weights in compressed-tensors pack-quantized W4A16 form, packed by the
                         compressed-tensors package itself; experts split into experts.{e}.{gate,up,down}_proj
                         (hf_test_defaults keeps its fused bf16 experts: its down_proj has in=16).
  reference.safetensors  tokens I32 [T]; logits_f32 / logits_bf16 F32 [T, vocab] (eager attention, eager experts);
                         greedy_f32 I32 [32] (+ greedy_f32_nocache only if it differed, which fails the run).
  meta.json              config summary, sensitivity, logit statistics, versions.

Usage (from the repository root):
  .venv/bin/python tools/python/make_gemma4_fixtures.py            # regenerate all fixtures and verify them
  .venv/bin/python tools/python/make_gemma4_fixtures.py --verify    # only re-verify the fixtures on disk
  .venv/bin/python tools/python/make_gemma4_fixtures.py --only e2b_like
unified_like is the 12B's family (gemma4_unified: Gemma4UnifiedForConditionalGeneration, the same tensor names); its
verification also loads its weights into Gemma4ForConditionalGeneration and requires identical logits.
Deterministic on one machine: fixed seeds, CPU, single thread; rerunning there rewrites byte-identical files. On
another CPU torch may sum in another order, so --verify compares logits within stated tolerances (check_logits),
weights and greedy tokens exactly. The weights are the
first seeded draw whose float32 reference has no near-ties (argmax, greedy steps, MoE expert choice; see
screen()). Exits non-zero if any check fails. See tests/fixtures/README.md.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch  # noqa: E402

import compressed_tensors  # noqa: E402
import safetensors  # noqa: E402
import transformers  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32  # noqa: E402
from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from checkpoint_dir import load_safetensors  # noqa: E402
from gemma4_expert_merge import per_expert_merge_mapping  # noqa: E402
from transformers import (  # noqa: E402
    CompressedTensorsConfig,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4UnifiedConfig,
    Gemma4UnifiedForConditionalGeneration,
    Gemma4UnifiedTextConfig,
    GenerationConfig,
)

warnings.filterwarnings("ignore", message="You passed `quantization_config`")
transformers.logging.set_verbosity_error()

REPO = Path(__file__).resolve().parents[2]
GROUP = 32                  # QAT group: 32 consecutive input columns share one step
GREEDY_TOKENS = 32
BASE_SEED = 20260801
S, F = "sliding_attention", "full_attention"
PREFIX = "model.language_model."
ATTN, EXPERTS = "eager", "eager"   # the modeling file's own attention and expert loops

# Weight distributions (all values are rounded to bf16 before use). Chosen so that the tiny models are not chaotic:
# a 1-ulp change of one weight moves the logits by ~1e-3 or less (measured and recorded in meta.json).
EMBED_STD = 0.5             # embed_tokens: tied LM head, so logit std ~ EMBED_STD * sqrt(hidden) * final norm
PLE_EMBED_STD = 0.2         # embed_tokens_per_layer (scaled by sqrt(hidden_size_per_layer_input) in the model)
LINEAR_GAIN = 1.0           # quantized / plain Linear weights: std = LINEAR_GAIN / sqrt(in_features)
ROUTER_GAIN = 12.0          # router.proj: its input is RMSNorm(x) * scale * hidden**-0.5, i.e. rms ~ 1/sqrt(hidden)
NORM_RANGE = (0.6, 1.4)     # RMSNorm weights (Gemma 4 multiplies by w itself, not 1 + w)
QK_NORM_RANGE = (0.25, 0.5)   # q_norm / k_norm: attention scaling is 1.0, so these set the attention temperature
LAYER_SCALAR_RANGE = (0.3, 1.0)
ROUTER_SCALE_RANGE = (0.5, 1.5)
PER_EXPERT_SCALE_RANGE = (0.5, 1.5)

MODELS = {
    # E2B-like: per-layer embeddings, KV sharing of both layer types, double-wide MLP on shared layers, softcap.
    "e2b_like": dict(
        text=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, S, F, S, S, F, S, F],
                  num_kv_shared_layers=4, hidden_size_per_layer_input=32, vocab_size_per_layer_input=512,
                  use_double_wide_mlp=True, sliding_window=8, final_logit_softcapping=30.0,
                  pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # 26B-A4B-like: MoE block (8 experts, top-2) beside the dense MLP, attention_k_eq_v with 1 global KV head vs 2.
    "moe_like": dict(
        text=dict(vocab_size=384, hidden_size=64, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16, global_head_dim=32,
                  attention_k_eq_v=True, layer_types=[S, S, F, S, S, F], hidden_size_per_layer_input=0,
                  vocab_size_per_layer_input=384, enable_moe_block=True, num_experts=8, top_k_experts=2,
                  moe_intermediate_size=32, sliding_window=8, final_logit_softcapping=30.0,
                  use_bidirectional_attention="vision", pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # transformers' own tiny test config (tests/models/gemma4 Gemma4TextModelTester), as is: bos 1 / eos 2,
    # window 512 > T, no softcap. Most dims are not multiples of 32; those weights stay plain bf16.
    "hf_test_defaults": dict(
        text=dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                  intermediate_size=37, head_dim=16, global_head_dim=16, max_position_embeddings=512,
                  initializer_range=0.02, pad_token_id=0, bos_token_id=1, eos_token_id=2, layer_types=[S, F, S, F],
                  num_kv_shared_layers=2, vocab_size_per_layer_input=99, hidden_size_per_layer_input=16,
                  enable_moe_block=True, num_experts=8, moe_intermediate_size=16, top_k_experts=2,
                  use_bidirectional_attention="vision"),
        top_eos=2, gen=dict(bos_token_id=1, pad_token_id=0, eos_token_id=2),
        prompt_len=20),
    # The 12B (gemma4_unified, transformers' models/gemma4_unified/) scaled down from Google's config
    # (../shared/configs/gemma-4-12B-it-qat-w4a16-ct.json): 5 sliding : 1 full layers, the last full; full layers
    # with twice the head dim, one KV head and attention_k_eq_v (no v_proj); no per-layer embeddings, no MoE, no KV
    # sharing; tied embedding; softcap 30; image tokens bidirectional on sliding layers ("vision", its default).
    "unified_like": dict(
        family="gemma4_unified",
        text=dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16, global_head_dim=32,
                  attention_k_eq_v=True, layer_types=[S, S, S, S, S, F], sliding_window=8,
                  final_logit_softcapping=30.0, use_bidirectional_attention="vision", pad_token_id=0, bos_token_id=2,
                  eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # For exactness at 128K positions (tools/python/make_long_goldens.py --deep): E2B's features (PLE, KV sharing of
    # both layer types, proportional RoPE on full layers) in the least attention work a full layer can cost, one
    # query head, since a 131,072-position prefill's attention grows with the square of its length.
    "long_like": dict(
        text=dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, F, S, F],
                  num_kv_shared_layers=2, hidden_size_per_layer_input=16, vocab_size_per_layer_input=256,
                  sliding_window=8, final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # The tied embedding on the QAT grid, as QAT exports' is, so that qatserve reads its LM head as int4 (the other
    # fixtures' embeddings are plain random bf16, which keeps their head bf16). Small and dense.
    "qat_head": dict(
        text=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, S, F],
                  hidden_size_per_layer_input=0, vocab_size_per_layer_input=256, sliding_window=8,
                  final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=2 * 8 + 5, embedding_on_grid=True),
}

# Linear weights that Google's w4a16 export quantizes (when their input dim is a multiple of 32).
QUANT_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection",
                 "per_layer_model_projection")
FUSED_EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


# ----------------------------------------------------------------------------------------------- weights
def seed_for(name, salt=""):
    return BASE_SEED + int(hashlib.sha256((name + salt).encode()).hexdigest()[:8], 16) % 1_000_000


def bf16(t):
    """Round to bf16 and return float32 (exactly representable in bf16)."""
    return t.to(torch.bfloat16).float()


def uniform(gen, shape, lo, hi):
    return bf16(lo + (hi - lo) * torch.rand(shape, generator=gen))


def normal(gen, shape, std):
    return bf16(std * torch.randn(shape, generator=gen))


def qat_grid(gen, shape, std):
    """bf16 weights on the QAT grid: W[..., r, 32g+k] = bf16(L * step[..., r, g]), L in -8..7.

    Each group draws its own peak (8 half of the time, else 4..7, so the group maximum is not always at level +-8)
    and uniform integer levels in [-peak, min(peak, 7)]; the step is a bf16 number chosen so that the weights have
    standard deviation ~std. Returns (weights float32, levels int8, step float32) with weights = bf16(levels*step).
    """
    *lead, out_f, in_f = shape
    groups = in_f // GROUP
    gshape = (*lead, out_f, groups)
    peak = torch.where(torch.rand(gshape, generator=gen) < 0.5, torch.full(gshape, 8),
                       torch.randint(4, 8, gshape, generator=gen))
    lo, hi = -peak, torch.clamp(peak, max=7)
    u = torch.rand((*gshape, GROUP), generator=gen)
    levels = (lo[..., None] + torch.floor(u * (hi - lo + 1)[..., None])).clamp(-8, 7).to(torch.int8)
    n = (hi - lo + 1).float()
    level_std = torch.sqrt((n * n - 1) / 12)                       # std of uniform integers on n points
    jitter = torch.exp(0.25 * (2 * torch.rand(gshape, generator=gen) - 1))
    step = bf16(std / level_std * jitter)
    weights = bf16(levels.float() * step[..., None]).reshape(shape)  # fp32 product is exact; one rounding
    levels = levels.reshape(shape)
    # Each weight must map back to its level with the stored step (what any lossless repack relies on).
    back = torch.round(weights.reshape(*gshape, GROUP) / step[..., None]).reshape(shape)
    assert torch.equal(back, levels.float()), "grid weight does not round back to its level"
    return weights, levels, step


def is_quant_linear(name):
    return name.endswith(".weight") and any(name[: -len(".weight")].endswith(m) for m in QUANT_LINEARS)


def is_fused_expert(name):
    return any(name.endswith(m) for m in FUSED_EXPERTS)


def fill_weights(model, seed, embedding_on_grid=False):
    """Replace every parameter and persistent buffer by seeded bf16-exact values (the tied embedding on the QAT
    grid of its hidden dim if asked).

    Returns ({param name: kind}, {grid param name: (levels int8, step bf16)})."""
    gen = torch.Generator().manual_seed(seed)
    kinds, grids = {}, {}
    state = dict(model.named_parameters())
    state.update({n: b for n, b in model.named_buffers() if n.endswith("layer_scalar")})
    for pname in sorted(state):
        t = state[pname]
        shape = tuple(t.shape)
        if pname.endswith("embed_tokens.weight") and embedding_on_grid:
            value, _, _ = qat_grid(gen, shape, EMBED_STD)
            kind = "qat_grid_embedding"   # stays bf16 in w4a16/, as in Google's exports
        elif pname.endswith("embed_tokens.weight"):
            value, kind = normal(gen, shape, EMBED_STD), "embedding"
        elif pname.endswith("embed_tokens_per_layer.weight"):
            value, kind = normal(gen, shape, PLE_EMBED_STD), "embedding"
        elif pname.endswith(("q_norm.weight", "k_norm.weight")):
            value, kind = uniform(gen, shape, *QK_NORM_RANGE), "norm"
        elif pname.endswith("norm.weight") or "layernorm" in pname:
            value, kind = uniform(gen, shape, *NORM_RANGE), "norm"
        elif pname.endswith("layer_scalar"):
            value, kind = uniform(gen, shape, *LAYER_SCALAR_RANGE), "layer_scalar"
        elif pname.endswith("router.scale"):
            value, kind = uniform(gen, shape, *ROUTER_SCALE_RANGE), "router_scale"
        elif pname.endswith("router.per_expert_scale"):
            value, kind = uniform(gen, shape, *PER_EXPERT_SCALE_RANGE), "router_scale"
        elif pname.endswith("router.proj.weight"):
            value, kind = normal(gen, shape, ROUTER_GAIN / math.sqrt(shape[-1])), "router_proj"
        elif is_quant_linear(pname) or is_fused_expert(pname):
            std = LINEAR_GAIN / math.sqrt(shape[-1])
            if shape[-1] % GROUP == 0:
                value, levels, step = qat_grid(gen, shape, std)
                kind = "qat_grid"
                grids[pname] = (levels, step.to(torch.bfloat16))
            else:
                value, kind = normal(gen, shape, std), "plain_linear"
        else:
            raise SystemExit(f"no rule for parameter {pname} {shape}: extend fill_weights")
        with torch.no_grad():
            t.copy_(value)
        kinds[pname] = kind
    return kinds, grids


# ----------------------------------------------------------------------------------------------- configs
# transformers classes per model family (the spec's "family"; gemma4 when absent).
FAMILIES = {
    "gemma4": (Gemma4TextConfig, Gemma4Config, Gemma4ForConditionalGeneration),
    "gemma4_unified": (Gemma4UnifiedTextConfig, Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration),
}


def family_of(spec):
    return FAMILIES[spec.get("family", "gemma4")]


def build_config(spec):
    text_cls, config_cls, _ = family_of(spec)
    text = text_cls(**spec["text"])
    config = config_cls(text_config=text, vision_config=None, audio_config=None)
    config.eos_token_id = spec["top_eos"]
    return config


def google_style_config(spec, saved):
    """config.json as Google's releases (transformers 5.5-era) write it.

    transformers 5.23 serializes full-attention layers as `per_layer_config: {"2": {"head_dim": 32}, ...}` and drops
    `global_head_dim` / `num_global_key_value_heads`; Google's files (and qatserve's parser) carry those two fields
    instead. 5.23 reads them back (Gemma4TextConfig.__post_init__ pops them into per_layer_config), which
    verify_config() checks.
    """
    t = dict(saved["text_config"])
    t.pop("per_layer_config", None)
    t["global_head_dim"] = spec["text"]["global_head_dim"]
    t["num_global_key_value_heads"] = spec["text"].get("num_global_key_value_heads")
    t["dtype"] = "bfloat16"
    top = {k: v for k, v in saved.items() if k != "text_config"}
    if spec.get("family") == "gemma4_unified":
        # Google's 12B text_config still carries the per-layer-embedding and MoE fields, as 0 / false / null.
        t.update(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, enable_moe_block=False,
                 num_experts=None, top_k_experts=None, moe_intermediate_size=None)
        top.update(architectures=["Gemma4UnifiedForConditionalGeneration"])
    else:
        t["expert_intermediate_size"] = None   # present (null) in Google's text_config; unused by transformers
        top.update(architectures=["Gemma4ForConditionalGeneration"], eoa_token_id=258883,
                   vision_soft_tokens_per_image=280)
    text = {k: t[k] for k in sorted(t)}
    top.update(text_config=text, dtype="bfloat16", eos_token_id=spec["top_eos"],
               transformers_version=transformers.__version__)
    return {k: top[k] for k in sorted(top)}


def generation_config(spec):
    g = dict(spec["gen"], do_sample=True, temperature=1.0, top_k=64, top_p=0.95,
             transformers_version=transformers.__version__)
    return {k: g[k] for k in sorted(g)}


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


# ----------------------------------------------------------------------------------------------- w4a16
def w4a16_scheme():
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP, dynamic=False)
    return QuantizationScheme(targets=["Linear"], weights=args, input_activations=None, output_activations=None,
                              format="pack-quantized")


def grid_of(weight):
    """Recover (levels int8, step bf16) of a bf16 grid tensor [..., out, in] from the stored values alone (bf16/
    does not store the step): per group, the bf16 step s with bf16(L * s) == w for all 32 members, L in -8..7,
    searched as max|w| / peak (peak 8..1) and its bf16 neighbours. Raises if a group fits no candidate."""
    w = weight.float().reshape(*weight.shape[:-1], -1, GROUP)
    amax = w.abs().amax(-1, keepdim=True)
    best_step = torch.zeros_like(amax)
    found = torch.zeros_like(amax, dtype=torch.bool)
    for peak in (8, 7, 6, 5, 4, 3, 2, 1):
        cand = bf16(amax / peak)
        # bf16 rounding of amax/peak can land one ulp off the generator's step: try the neighbours too.
        for delta in (0, 1, -1):
            c = (cand.to(torch.bfloat16).view(torch.int16) + delta).view(torch.bfloat16).float()
            lv = torch.round(w / c).clamp(-8, 7)
            ok = (bf16(lv * c) == w).all(-1, keepdim=True) & (c > 0) & ~found
            best_step = torch.where(ok, c, best_step)
            found |= ok
    if not bool(found.all()):
        raise SystemExit(f"grid recovery failed on {int((~found).sum())} groups")
    levels = torch.round(w / best_step).clamp(-8, 7).to(torch.int8).reshape(weight.shape)
    return levels, best_step[..., 0].to(torch.bfloat16)


def compress_linear(weight_bf16, step_bf16, scheme):
    """compressed-tensors' own PackedQuantizationCompressor.compress with the exact QAT step as the scale."""
    out = PackedQuantizationCompressor.compress({"weight": weight_bf16, "weight_scale": step_bf16}, scheme)
    assert set(out) == {"weight_packed", "weight_scale", "weight_shape"}, sorted(out)
    return out


def write_w4a16(bf16_dir, w4_dir, grids, linears=()):
    """bf16/ -> w4a16/: pack every grid Linear with compressed-tensors, using the generator's exact step as the
    scale; fused experts are split per expert. Unquantized tensors are copied unchanged. `linears`: weight names of
    further Linear modules (multimodal towers): packed when in `grids`, else listed in `ignore`."""
    scheme = w4a16_scheme()
    src = load_safetensors(bf16_dir)
    out, ignore, n_packed, kept_fused = {}, ["lm_head"], 0, []

    def emit(module, weight, grid):
        nonlocal n_packed
        if grid is not None:
            levels, step = grid
            on_grid = (levels.float() * step.float().repeat_interleave(GROUP, -1)).to(torch.bfloat16)
            assert torch.equal(on_grid, weight), f"{module}: stored weight is not bf16(level x step)"
            packed = compress_linear(weight, step, scheme)
            unpacked = unpack_from_int32(packed["weight_packed"], 4, packed["weight_shape"])
            assert torch.equal(unpacked, levels), f"compressed-tensors packed {module} to other levels"
            for k, v in packed.items():
                out[f"{module}.{k}"] = v.contiguous()
            n_packed += 1
        else:
            out[module + ".weight"] = weight.contiguous()
            ignore.append(module)

    for name in sorted(src):
        t = src[name]
        g = grids.get(name)
        part = (lambda e, rows: (g[0][e, rows], g[1][e, rows])) if g is not None else (lambda e, rows: None)
        if is_fused_expert(name) and not all(name.rsplit(".", 1)[0] + "." + m.split(".")[-1] in grids
                                             for m in FUSED_EXPERTS):
            # Not every expert projection of this layer fits the group of 32 (hf_test_defaults: down_proj has
            # in=16). transformers 5.23 cannot load per-expert modules mixing packed and plain weights (its
            # expert dequantizer reads only weight_packed keys), so this layer's experts stay fused bf16 tensors,
            # exactly as in bf16/ (they are not Linear modules, so they need no `ignore` entry).
            out[name] = t.contiguous()
            kept_fused.append(name)
            continue
        if name.endswith(".experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):   # gate = first I rows (HF chunk order), up = the next I
                emit(f"{base}{e}.gate_proj", t[e, :inter].clone(), part(e, slice(0, inter)))
                emit(f"{base}{e}.up_proj", t[e, inter:].clone(), part(e, slice(inter, None)))
        elif name.endswith(".experts.down_proj"):
            for e in range(t.shape[0]):
                emit(f"{name[: -len('down_proj')]}{e}.down_proj", t[e].clone(), part(e, slice(None)))
        elif name.endswith(".weight") and (is_quant_linear(name) or name in linears):
            emit(name[: -len(".weight")], t, g)
        else:
            if name.endswith("router.proj.weight"):
                ignore.append(name[: -len(".weight")])
            out[name] = t.contiguous()
    w4_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, w4_dir / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((bf16_dir / "config.json").read_text())
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                            quantization_status="compressed", ignore=sorted(set(ignore), key=natural_key))
    qdict = qc.model_dump(mode="json")
    if qdict.get("moe_sparsity_config") is None:
        qdict.pop("moe_sparsity_config", None)
    qdict.update(sparsity_config={}, transform_config={}, version=compressed_tensors.__version__)
    config["quantization_config"] = {k: qdict[k] for k in sorted(qdict)}
    write_json(w4_dir / "config.json", config)
    shutil.copy(bf16_dir / "generation_config.json", w4_dir / "generation_config.json")
    return dict(packed_modules=n_packed, ignore_entries=len(config["quantization_config"]["ignore"]),
                experts_kept_fused_bf16=[n.removeprefix(PREFIX) for n in kept_fused])


def natural_key(s):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


# ----------------------------------------------------------------------------------------------- running
def load_model(path, dtype, attn=ATTN, experts=EXPERTS, **kwargs):
    # The class config.json names (Gemma4ForConditionalGeneration or Gemma4UnifiedForConditionalGeneration).
    model_class = getattr(transformers, json.loads((Path(path) / "config.json").read_text())["architectures"][0])
    model, info = model_class.from_pretrained(
        path, dtype=dtype, attn_implementation=attn, experts_implementation=experts, output_loading_info=True,
        **kwargs)
    problems = {k: sorted(v)[:5] for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"loading {path}: {problems}")
    # transformers bug (see check_transformers_load.py): expert dequantize returns the scale dtype (bf16), not the
    # requested dtype. bf16 -> float32 is exact.
    for n, p in model.named_parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model.eval()


@torch.no_grad()
def logits_of(model, tokens):
    return model(input_ids=tokens[None], use_cache=False).logits[0].float()


def greedy_config(spec):
    # No sampling, no stop token: the continuation is a pure argmax chain of exactly GREEDY_TOKENS tokens.
    return GenerationConfig(max_new_tokens=GREEDY_TOKENS, min_new_tokens=0, do_sample=False, eos_token_id=None,
                            pad_token_id=spec["gen"]["pad_token_id"], bos_token_id=spec["gen"]["bos_token_id"],
                            temperature=None, top_k=None, top_p=None)


@torch.no_grad()
def greedy(model, tokens, spec, use_cache):
    ids = tokens[None].long()
    # generate() fills unset fields from model.generation_config (generation_config.json: eos [1, 106, 50],
    # do_sample true): swap it for the greedy one so that nothing stops the chain early.
    saved, model.generation_config = model.generation_config, greedy_config(spec)
    try:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             generation_config=greedy_config(spec), use_cache=use_cache)
    finally:
        model.generation_config = saved
    new = out[0, tokens.numel():]
    assert new.numel() == GREEDY_TOKENS, f"generate stopped after {new.numel()} tokens"
    return new.to(torch.int32)


@torch.no_grad()
def greedy_manual(model, tokens):
    """Argmax chain recomputing the full sequence every step (no cache); also returns the top-2 gap per step."""
    seq, gaps = tokens.long().tolist(), []
    for _ in range(GREEDY_TOKENS):
        logits = logits_of(model, torch.tensor(seq))[-1]
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        seq.append(int(logits.argmax()))
    return torch.tensor(seq[tokens.numel():], dtype=torch.int32), gaps


@torch.no_grad()
def routing(model, ids):
    """Router decisions on ids (no cache): (min over layers/tokens of the k-th minus (k+1)-th router logit, i.e.
    how close top-k selection is to a flip; [per layer: sorted expert ids per token]). (None, None) without MoE."""
    gaps, chosen = [], []

    def hook(module, args, output):
        probs, _, index = output
        k = module.config.top_k_experts
        top = torch.topk(probs.double(), k + 1, dim=-1).values   # log p_i - log p_j = logit_i - logit_j
        gaps.append(float((top[:, k - 1].log() - top[:, k].log()).min()))
        chosen.append(torch.sort(index, dim=-1).values)

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith(".router")]
    if not handles:
        return None, None
    model(input_ids=ids[None], use_cache=False)
    for h in handles:
        h.remove()
    return min(gaps), chosen


def next_bf16_ulp(x):
    """x with its bf16 magnitude increased by one ulp (x is bf16-exact and non-zero)."""
    b = x.to(torch.bfloat16).view(torch.int16) + 1
    return b.view(torch.bfloat16).float()


@torch.no_grad()
def sensitivity(model, tokens, base, name, kinds):
    """Perturb single weights by one bf16 ulp, one at a time; the max |logit change| each causes."""
    gen = torch.Generator().manual_seed(seed_for(name, "probe"))
    params = dict(model.named_parameters())
    params.update({n: b for n, b in model.named_buffers() if n.endswith("layer_scalar")})
    names = sorted(params)
    # Probe every kind of tensor: one per tensor family (the suffix after the layer index), 2 elements each.
    families = {}
    for n in names:
        fam = n.split(".layers.")[-1].split(".", 1)[-1] if ".layers." in n else n
        families.setdefault(fam, []).append(n)
    probes, seen = [], set()
    prompt_rows = sorted(set(tokens.tolist()))
    for fam in sorted(families):
        for _ in range(2):
            pname = families[fam][int(torch.randint(len(families[fam]), (1,), generator=gen))]
            t = params[pname]
            flat = t.view(-1)
            for _ in range(100):
                if pname.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight")):
                    # a row the prompt looks up (other rows only reach the logits through the tied LM head)
                    row = prompt_rows[int(torch.randint(len(prompt_rows), (1,), generator=gen))]
                    idx = row * t.shape[1] + int(torch.randint(t.shape[1], (1,), generator=gen))
                else:
                    idx = int(torch.randint(flat.numel(), (1,), generator=gen))
                if flat[idx] != 0 and (pname, idx) not in seen:
                    break
            if (pname, idx) in seen:
                continue
            seen.add((pname, idx))
            old = flat[idx].clone()
            flat[idx] = next_bf16_ulp(old)
            delta = float((logits_of(model, tokens) - base).abs().max())
            flat[idx] = old
            probes.append(dict(tensor=pname.removeprefix(PREFIX), kind=kinds.get(pname, "?"), index=idx,
                               value=float(old), max_abs_dlogit=delta))
    assert torch.equal(logits_of(model, tokens), base)
    deltas = sorted(p["max_abs_dlogit"] for p in probes)
    worst = max(probes, key=lambda p: p["max_abs_dlogit"])
    return dict(probes=len(probes), max_abs_dlogit=deltas[-1], median_abs_dlogit=deltas[len(deltas) // 2],
                worst_tensor=worst["tensor"], per_probe=probes)


MAX_ATTEMPTS = 2000
MIN_ROUTER_LOGIT_GAP = 5e-3    # k-th vs (k+1)-th router logit, float32, prompt + greedy continuation
MIN_GREEDY_GAP = 1e-2          # top-2 logit gap at every greedy step, float32
MIN_PROMPT_GAP = 1e-3          # top-2 logit gap at every prompt position, float32


@torch.no_grad()
def screen(model, tokens):
    """Robustness of a float32 reference to float reordering (C++ sums in another order, ~1e-6 relative): no
    near-tie in the argmax at any prompt position or greedy step, and no near-tie in MoE expert selection.
    MoE models also need three bfloat16 variants (see bf16_routing_flips) to pick the same experts as float32 at
    every prompt position: else logits_bf16 carries routing flips that an independent bf16 implementation need
    not reproduce (one flip moves logits by several units)."""
    result = dict(ok=False, prompt_top2_gap=round(min(top2_gaps(logits_of(model, tokens))), 5))
    moe = any(n.endswith(".router") for n, _ in model.named_modules())
    if moe:   # cheapest rejections first
        result["bf16_expert_choice_differs"] = bf16_routing_flips(model, tokens)
        if any(result["bf16_expert_choice_differs"].values()):
            return result
    if result["prompt_top2_gap"] < MIN_PROMPT_GAP:
        return result
    cont, greedy_gaps = greedy_manual(model, tokens)
    result["greedy_top2_gap"] = round(min(greedy_gaps), 5)
    if moe:
        result["router_logit_gap"] = round(routing(model, torch.cat([tokens, cont]).long()[:-1])[0], 6)
    result["ok"] = result["greedy_top2_gap"] >= MIN_GREEDY_GAP and (
        not moe or result["router_logit_gap"] >= MIN_ROUTER_LOGIT_GAP)
    return result


BF16_VARIANTS = {   # (attention, experts) implementations; the reference is the first
    "eager/eager": ("eager", "eager"), "eager/grouped_mm": ("eager", "grouped_mm"), "sdpa/eager": ("sdpa", "eager")}


def bf16_routing_flips(model_f32, tokens):
    """Per bfloat16 variant: number of (layer, prompt position) whose top-k expert set differs from float32.
    The variants round differently (grouped_mm, transformers' default, sums the top-k expert outputs in float32
    and rounds once; eager rounds each expert output to bf16 and accumulates in bf16), standing in for an
    independent bf16 implementation."""
    _, chosen_f32 = routing(model_f32, tokens.long())
    bf, flips = bf16_copy(model_f32), {}
    for variant, (attn, experts) in BF16_VARIANTS.items():
        bf.set_attn_implementation(attn)
        bf.set_experts_implementation(experts)
        _, chosen = routing(bf, tokens.long())
        flips[variant] = sum(int((a != b).any(-1).sum()) for a, b in zip(chosen_f32, chosen))
    return flips


def bf16_copy(model):
    """What from_pretrained(dtype=bfloat16) builds: bf16 params and buffers, but float32 RoPE inv_freq."""
    bf = copy.deepcopy(model).to(torch.bfloat16)
    for n, b in model.named_buffers():
        if n.endswith("inv_freq"):
            bf.get_buffer(n).data = b.clone()
    return bf


def routing_stats(f32, bf, tokens, full_seq):
    """MoE only: the float32 selection margin, and where the bfloat16 model picks other experts than float32."""
    gap, chosen_f32 = routing(f32, full_seq[:-1])
    if gap is None:
        return None
    _, on_prompt_f32 = routing(f32, tokens.long())
    _, on_prompt_bf16 = routing(bf, tokens.long())
    differ = sum(int((a != b).any(-1).sum()) for a, b in zip(on_prompt_f32, on_prompt_bf16))
    return dict(min_router_logit_gap_f32_prompt_and_greedy=gap,
                bf16_vs_f32_expert_choice_differs_count=differ,
                bf16_variants_vs_f32_expert_choice_differs=bf16_routing_flips(f32, tokens),
                experts_f32_prompt=[c.tolist() for c in on_prompt_f32])


def top2_gaps(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


# ----------------------------------------------------------------------------------------------- one fixture
def make_fixture(name, spec, root):
    print(f"== {name}")
    torch.manual_seed(seed_for(name, "torch"))
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    bf16_dir, w4_dir = out / "bf16", out / "w4a16"

    # Prompt: BOS then seeded random ids in [3, vocab).
    gen = torch.Generator().manual_seed(seed_for(name, "tokens"))
    tlen, vocab = spec["prompt_len"], spec["text"]["vocab_size"]
    tokens = torch.randint(3, vocab, (tlen,), generator=gen, dtype=torch.int64)
    tokens[0] = spec["text"]["bos_token_id"]
    tokens = tokens.to(torch.int32)

    # Weights: the first seeded draw whose float32 reference is robust to float reordering (see screen()).
    model = family_of(spec)[2](build_config(spec)).eval()
    model.set_attn_implementation(ATTN)
    model.set_experts_implementation(EXPERTS)
    for attempt in range(MAX_ATTEMPTS):
        seed = seed_for(name) + attempt
        kinds, grids = fill_weights(model, seed, spec.get("embedding_on_grid", False))
        screening = screen(model, tokens)
        if screening["ok"]:
            print(f"  weights seed {seed} (attempt {attempt + 1}): {screening}")
            break
    else:
        raise SystemExit(f"{name}: no robust weights in {MAX_ATTEMPTS} seeds")
    reference_state = {k: v.clone() for k, v in model.state_dict().items()}

    # bf16/: save_pretrained in bf16, then Google-style config.json and generation_config.json.
    # Save a bf16 copy: model.to(bfloat16) would also round the in-memory model's non-persistent RoPE inv_freq
    # buffers to bf16 (from_pretrained(dtype=bfloat16) keeps them float32).
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    saved = json.loads((bf16_dir / "config.json").read_text())
    write_json(bf16_dir / "config.json", google_style_config(spec, saved))
    write_json(bf16_dir / "generation_config.json", generation_config(spec))
    stored = load_safetensors(bf16_dir)
    assert all(t.dtype == torch.bfloat16 for t in stored.values()), "non-bf16 tensor in bf16/"
    missing = [k for k in reference_state if k not in stored and not k.endswith("lm_head.weight")]
    assert not missing, f"not saved: {missing[:5]}"
    assert any(k.endswith("layer_scalar") for k in stored), "layer_scalar not saved"

    # Reference runs: float32 and bfloat16 models loaded from bf16/ exactly as a user would.

    f32 = load_model(bf16_dir, torch.float32)
    reloaded_same = all(torch.equal(p, reference_state[n]) for n, p in f32.state_dict().items()
                        if n in reference_state)
    logits_f32 = logits_of(f32, tokens)
    in_memory = logits_of(model, tokens)
    if not (reloaded_same and torch.equal(in_memory, logits_f32)):
        raise SystemExit(f"{name}: reloading bf16/ does not reproduce the in-memory float32 model")
    bf = load_model(bf16_dir, torch.bfloat16)
    logits_bf16 = logits_of(bf, tokens)

    g_cache = greedy(f32, tokens, spec, use_cache=True)
    g_nocache = greedy(f32, tokens, spec, use_cache=False)
    g_manual, g_gaps = greedy_manual(f32, tokens)
    ref = dict(tokens=tokens, logits_f32=logits_f32, logits_bf16=logits_bf16, greedy_f32=g_cache)
    greedy_agree = torch.equal(g_cache, g_nocache) and torch.equal(g_cache, g_manual)
    if not greedy_agree:
        ref["greedy_f32_nocache"] = g_nocache
    save_file({k: v.contiguous() for k, v in ref.items()}, out / "reference.safetensors", metadata={"format": "pt"})

    # w4a16/ from the stored bf16 tensors, packed by compressed-tensors.
    quantized = set(grids)
    w4_summary = write_w4a16(bf16_dir, w4_dir, grids)

    # Statistics for meta.json.
    full_seq = torch.cat([tokens, g_cache]).long()
    sens = sensitivity(model, tokens, in_memory, name, kinds)
    gaps_bf16, gaps_f32 = top2_gaps(logits_bf16), top2_gaps(logits_f32)
    # How far other legitimate implementations land from the references: a scale for C++ tolerances.
    variant_spread = {}
    for dtype, key, base in ((torch.float32, "f32", logits_f32), (torch.bfloat16, "bf16", logits_bf16)):
        for variant, (attn, experts) in list(BF16_VARIANTS.items())[1:]:
            if experts != EXPERTS and not spec["text"].get("enable_moe_block"):
                continue
            other = logits_of(load_model(bf16_dir, dtype, attn=attn, experts=experts), tokens)
            variant_spread[f"{key} {variant}"] = float((other - base).abs().max())
    diff = (logits_bf16 - logits_f32).abs()
    t = spec["text"]
    meta = dict(
        name=name,
        T=tlen, vocab_size=vocab, sliding_window=t.get("sliding_window", 512),
        prompt_starts_with_bos=int(tokens[0]),
        config_summary={k: t.get(k) for k in (
            "hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
            "num_global_key_value_heads", "head_dim", "global_head_dim", "attention_k_eq_v", "intermediate_size",
            "use_double_wide_mlp", "num_kv_shared_layers", "hidden_size_per_layer_input",
            "vocab_size_per_layer_input", "enable_moe_block", "num_experts", "top_k_experts",
            "moe_intermediate_size", "final_logit_softcapping", "use_bidirectional_attention",
            "bos_token_id", "eos_token_id", "pad_token_id")},
        derived=dict(
            kv_sharing_modes=f32.config.text_config.kv_sharing_modes,
            layer_head_dim=[f32.config.text_config.per_layer_config[i].head_dim for i in range(t["num_hidden_layers"])],
            layer_kv_heads=[f32.config.text_config.per_layer_config[i].num_key_value_heads
                            for i in range(t["num_hidden_layers"])],
            layer_intermediate=[m.mlp.intermediate_size for m in f32.model.language_model.layers],
            embed_scale_f32=float(torch.tensor(t["hidden_size"] ** 0.5, dtype=torch.float32)),
            embed_scale_bf16=float(torch.tensor(t["hidden_size"] ** 0.5).to(torch.bfloat16)),
        ),
        implementation=dict(attn_implementation=ATTN, experts_implementation=EXPERTS, use_cache_for_logits=False,
                            device="cpu", torch_num_threads=torch.get_num_threads()),
        weights=dict(
            counts={k: sum(1 for v in kinds.values() if v == k) for k in sorted(set(kinds.values()))},
            qat_grid_tensors=sorted(n.removeprefix(PREFIX) for n in quantized),
            plain_bf16_linear_tensors=sorted(n.removeprefix(PREFIX) for n, v in kinds.items() if v == "plain_linear"),
            tied_embedding_on_qat_grid=bool(spec.get("embedding_on_grid")),
            distributions=dict(embed_std=EMBED_STD, ple_embed_std=PLE_EMBED_STD, linear_std="1/sqrt(in_features)",
                               router_proj_std=f"{ROUTER_GAIN}/sqrt(hidden)", norm_range=NORM_RANGE,
                               qk_norm_range=QK_NORM_RANGE, layer_scalar_range=LAYER_SCALAR_RANGE,
                               router_scale_range=ROUTER_SCALE_RANGE, per_expert_scale_range=PER_EXPERT_SCALE_RANGE),
        ),
        w4a16=w4_summary,
        sensitivity_1ulp=sens,
        logits=dict(
            max_abs_logit_f32=float(logits_f32.abs().max()), max_abs_logit_bf16=float(logits_bf16.abs().max()),
            max_abs_diff_bf16_vs_f32=float(diff.max()), mean_abs_diff_bf16_vs_f32=float(diff.mean()),
            argmax_agree_bf16_vs_f32=f"{int((logits_bf16.argmax(-1) == logits_f32.argmax(-1)).sum())}/{tlen}",
            top2_gap_bf16_min=min(gaps_bf16), top2_gap_bf16_argmin_position=int(torch.tensor(gaps_bf16).argmin()),
            top2_gap_bf16_median=sorted(gaps_bf16)[tlen // 2],
            top2_gap_bf16_per_position=[round(g, 5) for g in gaps_bf16],
            top2_gap_f32_min=min(gaps_f32),
            max_abs_diff_vs_other_hf_implementations=variant_spread,
        ),
        greedy=dict(tokens=g_cache.tolist(), cache_vs_nocache_agree=greedy_agree,
                    top2_gap_f32_min_along_greedy=min(g_gaps),
                    top2_gap_f32_along_greedy=[round(g, 5) for g in g_gaps]),
        routing=routing_stats(f32, bf, tokens, full_seq),
        versions=dict(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
                      compressed_tensors=compressed_tensors.__version__, safetensors=safetensors.__version__),
        seed=seed, seed_screening=dict(screening, attempts=attempt + 1, min_prompt_top2_gap=MIN_PROMPT_GAP,
                                       min_greedy_top2_gap=MIN_GREEDY_GAP, min_router_logit_gap=MIN_ROUTER_LOGIT_GAP),
        generator="tools/python/make_gemma4_fixtures.py",
    )
    write_json(out / "meta.json", meta)
    routing_summary = None if meta["routing"] is None else {
        k: v for k, v in meta["routing"].items() if "count" in k or "gap" in k}
    print(f"  T={tlen} vocab={vocab} window={meta['sliding_window']}  1-ulp max|dlogit|={sens['max_abs_dlogit']:.3g} "
          f"(median {sens['median_abs_dlogit']:.3g}, worst {sens['worst_tensor']})  max|logit|="
          f"{meta['logits']['max_abs_logit_f32']:.3g}  bf16 top-2 gap min={min(gaps_bf16):.4g}  "
          f"bf16-f32 max|d|={float(diff.max()):.3g}  greedy cache==nocache: {greedy_agree}  "
          f"routing: {routing_summary}")
    if not greedy_agree:
        raise SystemExit(f"{name}: greedy with cache differs from no-cache")
    return meta


# ----------------------------------------------------------------------------------------------- verification
def verify_fixture(name, spec, root):
    """Independent checks of what is on disk. Returns a list of failures."""
    out, fails = root / name, []
    bf16_dir, w4_dir = out / "bf16", out / "w4a16"
    ref = load_safetensors_file(out / "reference.safetensors")
    tokens = ref["tokens"]
    src = load_safetensors(bf16_dir)

    # 1. Google-style config parses to the config the model was built with.
    built = build_config(spec).text_config
    loaded = family_of(spec)[1].from_pretrained(bf16_dir).text_config
    for i in range(built.num_hidden_layers):
        a, b = built.per_layer_config[i], loaded.per_layer_config[i]
        if (a.head_dim, a.num_key_value_heads) != (b.head_dim, b.num_key_value_heads):
            fails.append(f"config layer {i}: head_dim/kv heads {b.head_dim}/{b.num_key_value_heads} after reload")
    if built.kv_sharing_modes != loaded.kv_sharing_modes:
        fails.append("config: kv_sharing_modes differ after reload")

    # 2. Every quantizable Linear with in % 32 == 0 (and the embedding if asked) is on the grid; everything is bf16.
    for n, t in src.items():
        if t.dtype != torch.bfloat16:
            fails.append(f"{n}: dtype {t.dtype}")
        if (is_quant_linear(n) or is_fused_expert(n)) and t.shape[-1] % GROUP == 0:
            grid_of(t)  # raises if any group is off the grid
    if spec.get("embedding_on_grid"):
        grid_of(src[PREFIX + "embed_tokens.weight"])

    # 3. bf16/ reloaded reproduces the stored logits within the verify tolerances (see VERIFY_F32_RELATIVE).
    f32 = load_model(bf16_dir, torch.float32)
    fails += check_logits("bf16/ reload float32", logits_of(f32, tokens), ref["logits_f32"], torch.float32)
    bf = load_model(bf16_dir, torch.bfloat16)
    fails += check_logits("bf16/ reload bfloat16", logits_of(bf, tokens), ref["logits_bf16"], torch.bfloat16)
    g = greedy(f32, tokens, spec, use_cache=True)
    if not torch.equal(g, ref["greedy_f32"]):
        fails.append("greedy_f32 not reproduced")

    # 3b. gemma4_unified's text math is gemma4's without per-layer embeddings and MoE (why qatserve runs it as a
    # config variant of one model): the same weights in Gemma4ForConditionalGeneration give identical logits.
    if spec.get("family") == "gemma4_unified":
        twin = Gemma4ForConditionalGeneration(build_config(dict(
            spec, family="gemma4", text=dict(spec["text"], hidden_size_per_layer_input=0))))
        result = twin.load_state_dict(f32.state_dict(), strict=False)
        if result.missing_keys or result.unexpected_keys:
            fails.append(f"gemma4 twin: missing {result.missing_keys[:3]} unexpected {result.unexpected_keys[:3]}")
        twin.set_attn_implementation(ATTN)
        twin_logits = logits_of(twin.eval(), tokens)
        print(f"  same weights in Gemma4ForConditionalGeneration: max|logits - reference| = "
              f"{float((twin_logits - ref['logits_f32']).abs().max()):.3g}")
        if not torch.equal(twin_logits, ref["logits_f32"]):
            fails.append("gemma4 twin: logits differ from gemma4_unified's")

    # 4. compressed-tensors decompresses w4a16/ bit-exactly to bf16/ (experts split, gate = first I rows).
    dst = load_safetensors(w4_dir)
    try:
        dec = CompressedTensorsDequantizer(w4_dir, dtype=torch.bfloat16).validate(dict(dst))
    except Exception as e:  # noqa: BLE001
        fails.append(f"compressed-tensors refused w4a16/: {type(e).__name__}: {e}")
        dec = {}
    expected = {}
    for n, t in src.items():
        if is_fused_expert(n) and n in dst:   # experts kept fused bf16 (see write_w4a16)
            expected[n] = t
        elif n.endswith(".experts.gate_up_proj"):
            base, inter = n[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                expected[f"{base}{e}.gate_proj.weight"] = t[e, :inter]
                expected[f"{base}{e}.up_proj.weight"] = t[e, inter:]
        elif n.endswith(".experts.down_proj"):
            for e in range(t.shape[0]):
                expected[f"{n[: -len('down_proj')]}{e}.down_proj.weight"] = t[e]
        else:
            expected[n] = t
    if dec:
        if set(dec) != set(expected):
            fails.append(f"w4a16 names: missing {sorted(set(expected) - set(dec))[:3]} "
                         f"extra {sorted(set(dec) - set(expected))[:3]}")
        bad = [n for n in expected if n in dec and not (dec[n].dtype == expected[n].dtype and torch.equal(
            dec[n].contiguous().view(torch.int16), expected[n].contiguous().view(torch.int16)))]
        packed = sum(1 for n in dst if n.endswith(".weight_packed"))
        print(f"  compressed-tensors decompress: {packed} packed modules, {len(expected) - len(bad)}/{len(expected)} "
              f"tensors bit-identical to bf16/")
        if bad:
            fails.append(f"w4a16 decompress differs: {bad[:5]}")
    for n, t in dst.items():
        if n.endswith(".weight_packed") and t.dtype != torch.int32 or n.endswith(".weight_shape") and \
                t.dtype != torch.int64 or n.endswith(".weight_scale") and t.dtype != torch.bfloat16:
            fails.append(f"{n}: dtype {t.dtype}")

    # 5. transformers loads w4a16/ (CompressedTensorsConfig(dequantize=True)) and reproduces logits_f32.
    w4 = None
    try:
        with per_expert_merge_mapping():
            w4 = load_model(w4_dir, torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
        same = sum(torch.equal(p, dict(f32.named_parameters())[n]) for n, p in w4.named_parameters())
        print(f"  w4a16/ via transformers dequantize=True: {same}/{len(list(f32.parameters()))} params identical")
        if same != len(list(f32.parameters())):
            fails.append("w4a16/ transformers load: params differ from bf16/")
        fails += check_logits("w4a16/ via transformers dequantize=True", logits_of(w4, tokens), ref["logits_f32"],
                              torch.float32)
    except (Exception, SystemExit) as e:  # noqa: BLE001
        fails.append(f"transformers refused w4a16/: {type(e).__name__}: {e}")
    return fails


# --verify tolerances. Rerunning on the machine that made the fixtures reproduces the logits bit for bit, but torch
# picks its CPU kernels (vector width, summation order) by instruction set, so another CPU may differ by float
# reordering: in f32 up to VERIFY_F32_RELATIVE of each position's peak |logit| (the C++ parity test's tolerance),
# in bf16 up to VERIFY_BF16_ULPS bf16 ulps of each position's peak |logit| (a reordered bf16 sum can round one
# logit to the neighbouring bf16 value; the C++ bf16 test's tolerance too). The f32 check still catches a 1-ulp
# change of nearly any single weight (143 of the 150 probes of meta.json sensitivity_1ulp move the logits by more
# than 5e-6 of the largest |logit|); the bf16 check is coarser (one bf16 ulp of a logit ~16 is 0.06) and only
# guards the bf16 path as a whole.
VERIFY_F32_RELATIVE = 5e-6
VERIFY_BF16_ULPS = 2


def check_logits(what, got, want, dtype):
    """Per position: max |got - want| against the tolerance for dtype, scaled by the position's peak |want|."""
    peak = want.abs().amax(-1)
    worst = (got - want).abs().amax(-1)
    if dtype == torch.float32:
        measured, limit, unit = float((worst / peak).max()), VERIFY_F32_RELATIVE, "of the peak |logit|"
    else:
        ulp = torch.exp2(torch.floor(torch.log2(peak)) - 7)     # bf16: 8 significant bits
        measured, limit, unit = float((worst / ulp).max()), VERIFY_BF16_ULPS, "bf16 ulps of the peak |logit|"
    print(f"  {what}: max|logits - reference| = {float(worst.max()):.3g}, {measured:.3g} {unit} "
          f"(tolerance {limit:g})")
    return [] if measured <= limit else [f"{what}: logits differ by {measured:.3g} {unit} (> {limit:g})"]


def load_safetensors_file(path):
    with safe_open(path, framework="pt") as f:
        return {n: f.get_tensor(n) for n in f.keys()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), default=None)
    ap.add_argument("--verify", action="store_true", help="only verify fixtures already on disk")
    ap.add_argument("--no-external", action="store_true", help="skip tools/python/check_repack_external.py")
    args = ap.parse_args()
    torch.set_num_threads(1)            # fixed reduction order: byte-identical reruns
    torch.use_deterministic_algorithms(True)
    names = args.only or list(MODELS)
    failures = []
    for name in names:
        if not args.verify:
            make_fixture(name, MODELS[name], args.out)
        print(f"-- verify {name}")
        fails = verify_fixture(name, MODELS[name], args.out)
        # The project's own repack checker (expects every fused expert split per expert in w4a16/).
        external = REPO / "tools" / "python" / "check_repack_external.py"
        fused_kept = json.loads((args.out / name / "meta.json").read_text())["w4a16"]["experts_kept_fused_bf16"]
        if not args.no_external and external.exists() and not fused_kept:
            r = subprocess.run([sys.executable, str(external), str(args.out / name / "bf16"),
                                str(args.out / name / "w4a16")], capture_output=True, text=True)
            print("  check_repack_external.py: " + (r.stdout.strip().splitlines() or ["(no output)"])[-1])
            if r.returncode != 0:
                fails.append("check_repack_external.py failed:\n" + r.stdout + r.stderr)
        failures += [f"{name}: {f}" for f in fails]
    for f in failures:
        print("FAIL", f)
    print("fixtures FAILED" if failures else "fixtures OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
