"""--verify: independent checks of a fixture on disk (config reload, grid weights, logits and greedy tokens of bf16/
reloaded, compressed-tensors' decompression of w4a16/, transformers' load of w4a16/), with the tolerances another
CPU's float reordering needs."""
from gemma4_fixture_config import build_config
from gemma4_fixture_run import greedy, load_model, load_safetensors_file, logits_of
from gemma4_fixture_specs import ATTN, GROUP, PREFIX, family_of
from gemma4_fixture_w4a16 import grid_of
from gemma4_fixture_weights import is_fused_expert, is_quant_linear

import torch
from checkpoint_dir import load_safetensors
from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer
from gemma4_expert_merge import per_expert_merge_mapping, per_expert_tensors
from transformers import CompressedTensorsConfig, Gemma4ForConditionalGeneration


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
        else:
            expected.update(per_expert_tensors(n, t))
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
