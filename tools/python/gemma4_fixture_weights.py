"""Seeded bf16-exact weights for the fixture models: every Linear weight Google's w4a16 export quantizes (and the
tied embedding when a spec asks) on the QAT grid, the rest from the distributions of gemma4_fixture_specs."""
import hashlib
import math

from gemma4_fixture_specs import (
    BASE_SEED, EMBED_STD, FUSED_EXPERTS, GROUP, LAYER_SCALAR_RANGE, LINEAR_GAIN, NORM_RANGE, PER_EXPERT_SCALE_RANGE,
    PLE_EMBED_STD, QK_NORM_RANGE, QUANT_LINEARS, ROUTER_GAIN, ROUTER_SCALE_RANGE)

import torch


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
