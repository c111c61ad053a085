"""bf16/ -> w4a16/: the grid Linears packed by compressed-tensors itself with the generator's exact QAT step as the
scale, and the step recovered from stored bf16 grid weights alone."""
import json
import re
import shutil

from gemma4_fixture_config import write_json
from gemma4_fixture_specs import FUSED_EXPERTS, GROUP, PREFIX
from gemma4_fixture_weights import bf16, is_fused_expert, is_quant_linear

import compressed_tensors
import torch
from checkpoint_dir import load_safetensors
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
from safetensors.torch import save_file


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
