#!/usr/bin/env python3
"""make_audio_tower_fixture.py: external reference for the C++ Gemma 4 audio tower (conformer) and its embedder.

Builds a tiny random Gemma4ForConditionalGeneration with transformers (pinned 5.23.0, CPU, one thread) whose
audio_config keeps the real E2B structure (subsampling convolutions, chunked local attention of chunk 12 / left 13 /
right 0 with relative positions, logit cap, clipped linears, light conv of kernel 5, output_proj with bias) at a
small width, and writes tests/fixtures/audio_tower/:
  bf16/    config.json (Google-style, text_config of a 1-layer text model) and model.safetensors holding only
           `model.audio_tower.*` and `model.embed_audio.*`, named as in a full checkpoint, all bf16. Every tower
           Linear sits on the QAT grid (groups of 32 input columns = bf16(level x step)); clip bounds are finite
           (one pair left at +-inf, as transformers initialises them) and clip some values.
  w4a16/   the same tensors, every tower Linear packed by compressed-tensors (weight_packed / weight_scale /
           weight_shape) with the QAT step as its scale; `ignore` as Google's: the embedder's projection and lm_head.
  reference.safetensors  per clip <c> in CLIPS: features_<c> BF16 [frames, n_mel], mask_<c> U8 [frames],
           out_f32_<c> / out_bf16_<c> F32 [valid soft tokens, text_hidden]: Gemma4Model.get_audio_features'
           pooler_output with the padding tokens dropped (as Gemma4Model.forward drops them), from the model
           loaded from a full bf16 checkpoint by from_pretrained in float32 and in bfloat16.
  meta.json  config, clip sizes, the bf16 reference's own error against float32.

Usage (from the repository root): .venv/bin/python tools/python/make_audio_tower_fixture.py
Deterministic on one machine (fixed seeds, one thread). See tests/fixtures/README.md.
"""
import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemma4_fixture_specs import GROUP, REPO  # noqa: E402
from gemma4_fixture_config import google_style_config, write_json  # noqa: E402
from gemma4_fixture_w4a16 import compress_linear, natural_key, w4a16_scheme  # noqa: E402
from gemma4_fixture_weights import bf16, normal, qat_grid, seed_for, uniform  # noqa: E402

import compressed_tensors  # noqa: E402
import transformers  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig  # noqa: E402

torch.set_num_threads(1)
NAME = "audio_tower"
N_MEL = 128  # the feature extractor's mel bins; the subsampling reduces them to N_MEL / 4 = channels[0] / 4
SPEC = dict(
    text=dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, global_head_dim=32, layer_types=["full_attention"],
              hidden_size_per_layer_input=0, vocab_size_per_layer_input=128, sliding_window=8,
              final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1),
    audio=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, subsampling_conv_channels=[N_MEL, 8],
               conv_kernel_size=5, attention_chunk_size=12, attention_context_left=13, attention_context_right=0,
               attention_logit_cap=50.0, output_proj_dims=96, residual_weight=0.5, use_clipped_linears=True,
               rms_norm_eps=1e-6, hidden_act="silu"),
    top_eos=[1, 106])
# name -> (frames, valid frames): all valid and long (5 attention chunks of soft tokens, frames not a multiple of 4),
# padded at the end (as a batch pads a shorter clip), and shorter than one chunk.
CLIPS = {"long": (203, 203), "padded": (203, 150), "short": (18, 18)}
PREFIXES = ("model.audio_tower.", "model.embed_audio.")
CLIP_RANGE = (1.5, 3.0)  # |bound| of the clipped linears' input/output ranges (activations have rms ~1)


def is_tower_linear(name):
    return name.startswith("model.audio_tower.") and name.endswith(
        (".linear.weight", "relative_k_proj.weight", "input_proj_linear.weight", "output_proj.weight"))


def fill_weights(model, seed):
    """Seeded bf16-exact values for every audio tower / embedder parameter and clip bound; tower Linears on the QAT
    grid. Returns {grid weight name: (levels int8, step bf16)}."""
    gen = torch.Generator().manual_seed(seed)
    grids = {}
    state = {n: p for n, p in model.named_parameters() if n.startswith(PREFIXES)}
    state.update({n: b for n, b in model.named_buffers() if n.startswith(PREFIXES) and n.endswith(("_min", "_max"))})
    for name in sorted(state):
        t, shape = state[name], tuple(state[name].shape)
        if is_tower_linear(name):
            value, levels, step = qat_grid(gen, shape, 1.0 / math.sqrt(shape[-1]))
            grids[name] = (levels, step.to(torch.bfloat16))
        elif name.endswith(("_min", "_max")):
            # One linear keeps transformers' initial +-inf bounds; the others clip a few percent of values.
            if ".layers.1.feed_forward2.ffw_layer_2." in name:
                value = torch.tensor(-math.inf if name.endswith("_min") else math.inf)
            else:
                bound = uniform(gen, (), *CLIP_RANGE)
                value = -bound if name.endswith("_min") else bound
        elif name.endswith(".weight") and "norm" in name.split(".")[-2]:  # RMSNorm, and the LayerNorms' scales
            value = uniform(gen, shape, 0.6, 1.4)
        elif name.endswith("per_dim_scale"):
            value = normal(gen, shape, 0.5)
        elif name.endswith("conv.weight"):  # Conv2d [out, in, 3, 3]
            value = normal(gen, shape, 1.0 / math.sqrt(shape[1] * 9))
        elif name.endswith("depthwise_conv1d.weight"):  # [hidden, 1, kernel]
            value = normal(gen, shape, 1.0 / math.sqrt(shape[-1]))
        elif name.endswith("output_proj.bias"):
            value = normal(gen, shape, 0.1)
        elif name.endswith("embedding_projection.weight"):
            value = normal(gen, shape, 1.0 / math.sqrt(shape[-1]))
        else:
            raise SystemExit(f"no rule for {name} {shape}: extend fill_weights")
        with torch.no_grad():
            t.copy_(value)
    return grids


def build_config():
    text = Gemma4TextConfig(**SPEC["text"])
    audio = Gemma4AudioConfig(**SPEC["audio"])
    config = Gemma4Config(text_config=text, vision_config=None, audio_config=audio)
    config.eos_token_id = SPEC["top_eos"]
    return config


def clips():
    gen = torch.Generator().manual_seed(seed_for(NAME, "features"))
    out = {}
    for name, (frames, valid) in CLIPS.items():
        # bf16-exact (stored as bf16); padding frames too are random: the tower must mask them.
        features = bf16(torch.randn((frames, N_MEL), generator=gen))
        mask = torch.arange(frames) < valid
        out[name] = (features, mask)
    return out


def clipped_fraction(model, features, mask):
    """Fraction of the clipped linears' inputs and outputs that their bounds clip (so that the test sees them)."""
    counts = [0, 0]

    def hook(module, args, output):
        x = args[0]
        counts[0] += int(((x < module.input_min) | (x > module.input_max)).sum())
        y = module.linear(torch.clamp(x, module.input_min, module.input_max))
        counts[0] += int(((y < module.output_min) | (y > module.output_max)).sum())
        counts[1] += x.numel() + y.numel()

    linears = [m for m in model.modules() if type(m).__name__ == "Gemma4ClippableLinear"]
    handles = [m.register_forward_hook(hook) for m in linears]
    soft_tokens(model, features, mask)
    for h in handles:
        h.remove()
    return counts[0] / counts[1]


@torch.no_grad()
def soft_tokens(model, features, mask):
    """get_audio_features' soft tokens with the padding ones dropped, as Gemma4Model.forward keeps them."""
    o = model.model.get_audio_features(features[None], mask[None], return_dict=True)
    return o.pooler_output[0][o.attention_mask[0]].float()


def write_w4a16(src, grids, config, w4_dir):
    scheme = w4a16_scheme()
    out, ignore = {}, ["lm_head"]
    for name, t in sorted(src.items()):
        if name in grids:
            levels, step = grids[name]
            module = name[: -len(".weight")]
            packed = compress_linear(t, step, scheme)
            assert torch.equal(unpack_from_int32(packed["weight_packed"], 4, packed["weight_shape"]), levels), module
            out.update({f"{module}.{k}": v.contiguous() for k, v in packed.items()})
        else:
            out[name] = t.contiguous()
            if name.endswith("embedding_projection.weight"):
                ignore.append(name[: -len(".weight")])
    w4_dir.mkdir(parents=True)
    save_file(out, w4_dir / "model.safetensors", metadata={"format": "pt"})
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                            quantization_status="compressed", ignore=sorted(ignore, key=natural_key))
    q = qc.model_dump(mode="json")
    q.pop("moe_sparsity_config", None)
    q.update(sparsity_config={}, transform_config={}, version=compressed_tensors.__version__)
    write_json(w4_dir / "config.json", dict(config, quantization_config={k: q[k] for k in sorted(q)}))


def main():
    root = REPO / "tests" / "fixtures" / NAME
    if root.exists():
        shutil.rmtree(root)
    torch.manual_seed(seed_for(NAME, "torch"))
    model = Gemma4ForConditionalGeneration(build_config()).eval()
    gen = torch.Generator().manual_seed(seed_for(NAME, "text"))
    with torch.no_grad():  # the text model is never run; bf16-exact values keep its save lossless
        for n, p in model.named_parameters():
            if not n.startswith(PREFIXES):
                p.copy_(normal(gen, tuple(p.shape), 0.05))
    grids = fill_weights(model, seed_for(NAME))

    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "full"
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(full, safe_serialization=True)
        config = google_style_config(SPEC, json.loads((full / "config.json").read_text()))
        write_json(full / "config.json", config)
        loaded = {}
        for dtype in (torch.float32, torch.bfloat16):
            m, info = Gemma4ForConditionalGeneration.from_pretrained(full, dtype=dtype, output_loading_info=True)
            assert not any(info.values()), info
            loaded[dtype] = m.eval()
        from checkpoint_dir import load_safetensors
        stored = {k: v for k, v in load_safetensors(full).items() if k.startswith(PREFIXES)}
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
    bounds = [k for k in stored if k.endswith(("_min", "_max"))]
    assert bounds, "clip bounds were not saved"

    (root / "bf16").mkdir(parents=True)
    save_file(stored, root / "bf16" / "model.safetensors", metadata={"format": "pt"})
    write_json(root / "bf16" / "config.json", config)
    write_w4a16(stored, grids, config, root / "w4a16")

    ref, meta_clips = {}, {}
    for name, (features, mask) in clips().items():
        want = soft_tokens(loaded[torch.float32], features, mask)
        in_memory = soft_tokens(model, features, mask)
        assert torch.equal(want, in_memory), "the reloaded float32 model differs from the in-memory one"
        got_bf16 = soft_tokens(loaded[torch.bfloat16], features, mask)
        scale = want.abs().max().item()
        meta_clips[name] = dict(frames=len(mask), valid_frames=int(mask.sum()), soft_tokens=want.shape[0],
                                max_abs_f32=scale,
                                bf16_vs_f32_max_rel=(got_bf16 - want).abs().max().item() / scale,
                                clipped_fraction=clipped_fraction(model, features, mask))
        ref.update({f"features_{name}": features.to(torch.bfloat16), f"mask_{name}": mask.to(torch.uint8),
                    f"out_f32_{name}": want, f"out_bf16_{name}": got_bf16})
        print(f"  {name}: {meta_clips[name]}")
    save_file({k: v.contiguous() for k, v in ref.items()}, root / "reference.safetensors", metadata={"format": "pt"})
    write_json(root / "meta.json", dict(spec=SPEC, n_mel=N_MEL, clips=meta_clips, quantized_linears=len(grids),
                                        clip_bounds=len(bounds),
                                        versions=dict(transformers=transformers.__version__,
                                                      torch=torch.__version__,
                                                      compressed_tensors=compressed_tensors.__version__)))
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"wrote {root} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
