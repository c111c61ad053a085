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
# The parts, beside this script: gemma4_fixture_specs (the models), _weights (seeded grid weights), _config (config
# files), _w4a16 (packing), _run (transformers runs), _screen (which draw is kept), _verify (--verify).
import argparse
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

from gemma4_fixture_specs import (
    ATTN, EMBED_STD, EXPERTS, LAYER_SCALAR_RANGE, MODELS, NORM_RANGE, PER_EXPERT_SCALE_RANGE, PLE_EMBED_STD, PREFIX,
    QK_NORM_RANGE, REPO, ROUTER_GAIN, ROUTER_SCALE_RANGE, family_of)
from gemma4_fixture_config import build_config, generation_config, google_style_config, write_json
from gemma4_fixture_run import greedy, greedy_manual, load_model, logits_of, sensitivity
from gemma4_fixture_screen import (
    BF16_VARIANTS, MAX_ATTEMPTS, MIN_GREEDY_GAP, MIN_PROMPT_GAP, MIN_ROUTER_LOGIT_GAP, routing_stats, screen, top2_gaps)
from gemma4_fixture_verify import verify_fixture
from gemma4_fixture_w4a16 import write_w4a16
from gemma4_fixture_weights import fill_weights, seed_for

import compressed_tensors
import safetensors
import torch
import transformers
from checkpoint_dir import load_safetensors
from safetensors.torch import save_file


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
