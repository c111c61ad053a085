#!/usr/bin/env python3
"""check_transformers_load.py SRC DST: HF transformers must load the repacked int4 DST through its
compressed-tensors quantizer and reproduce the bf16 SRC on a fixed 12-token input (float32, eager attention).

Two loads of DST:
1. transformers' defaults (what a user gets): must load cleanly; after a forward pass has decompressed the
   weights, each must round to SRC's bf16 value. This path multiplies levels by a float32 copy of the bf16
   scale, i.e. the exact product, which can sit up to half a bf16 ulp from SRC's stored bf16(level x scale);
   the tiny random models amplify that to O(1) logits, so its logit difference is only reported.
2. CompressedTensorsConfig(dequantize=True): decompresses at load with the file's bf16 scales, giving
   bf16(level x scale) exactly as SRC stores it, so every param and the logits must be identical.
Two work-arounds for transformers 5.23 are marked below; neither touches the checkpoint.
"""
import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars of transformers and compressed-tensors: noise here
import torch
from transformers import CompressedTensorsConfig, Gemma4ForConditionalGeneration
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

# Passing dequantize=True on top of the checkpoint's quantization_config is the documented way; silence the notice.
warnings.filterwarnings("ignore", message="You passed `quantization_config`")
TOKENS = torch.tensor([[2, 651, 1234, 77, 3000, 42, 999, 2048, 5, 4095, 17, 100]])
MAX_LOGIT_DIFF = 1e-4  # same weights and kernels give 0; allow float reordering only

# Work-around 1 (transformers limitation): it has no Gemma 4 entry in its checkpoint conversion mapping, so
# per-expert modules `experts.{e}.{gate,up,down}_proj` (the compressed-tensors layout vLLM and SGLang read,
# reference §5.2) are not merged into Gemma4TextExperts' fused params. Register the same merge that
# transformers ships for qwen2_moe; its compressed-tensors quantizer dequantizes before merging.
if get_checkpoint_conversion_mapping("gemma4_text") is None:
    register_checkpoint_conversion_mapping("gemma4_text", [
        WeightConverter(source_patterns=["experts.*.gate_proj.weight", "experts.*.up_proj.weight"],
                        target_patterns="experts.gate_up_proj",
                        operations=[MergeModulelist(dim=0), Concatenate(dim=1)]),  # gate rows first
        WeightConverter(source_patterns="experts.*.down_proj.weight", target_patterns="experts.down_proj",
                        operations=[MergeModulelist(dim=0)]),
    ])


def load(path, **kwargs):
    model, info = Gemma4ForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, **kwargs)
    problems = {k: sorted(v)[:5] for k, v in info.items() if v}
    # Work-around 2 (transformers bug): its expert dequantize returns the scale dtype (bf16), not the
    # requested float32. bf16 -> float32 is exact, so upcasting keeps the loaded values.
    upcast = [n for n, p in model.named_parameters() if p.is_floating_point() and p.dtype != torch.float32]
    for name in upcast:
        model.get_parameter(name).data = model.get_parameter(name).data.float()
    return model.eval(), problems, upcast


def compare(src, dst, rounding):
    """Params of dst equal to src's (after rounding dst to bf16 if asked), and the logits' max abs difference."""
    src_params, dst_params = dict(src.named_parameters()), dict(dst.named_parameters())
    fix = (lambda t: t.to(torch.bfloat16).float()) if rounding else (lambda t: t)
    same = sum(n in dst_params and torch.equal(p, fix(dst_params[n])) for n, p in src_params.items())
    with torch.no_grad():
        diff = (src(input_ids=TOKENS).logits - dst(input_ids=TOKENS).logits).abs().max().item()
    return same, len(src_params), diff


def main(src_dir, dst_dir):
    src, problems, _ = load(src_dir)
    try:
        default, default_problems, _ = load(dst_dir)
        exact, exact_problems, upcast = load(dst_dir, quantization_config=CompressedTensorsConfig(dequantize=True))
    except Exception as e:  # noqa: BLE001 - the refusal itself is the finding
        print(f"FAILED: transformers refused DST: {type(e).__name__}: {e}")
        quant = json.loads((Path(dst_dir) / "config.json").read_text()).get("quantization_config", {})
        if "lm_head" not in quant.get("ignore", []):
            print("  cause: quantization_config.ignore lacks 'lm_head', so compressed-tensors packs the tied "
                  "lm_head Linear and transformers cannot tie it to embed_tokens (reference §7: put lm_head on ignore)")
        return 1
    if problems or default_problems or exact_problems:
        print(f"FAILED: loading info SRC {problems} DST {default_problems or exact_problems}")
        return 1

    with torch.no_grad():
        default(input_ids=TOKENS)  # the default path decompresses on the first forward
    d_same, total, d_diff = compare(src, default, rounding=True)
    e_same, _, e_diff = compare(src, exact, rounding=False)
    print(f"transformers default load: {d_same}/{total} params equal SRC after rounding to bf16; "
          f"logits max abs diff {d_diff:.3g} (informational)")
    print(f"transformers dequantize=True load ({len(upcast)} bf16 expert params upcast): {e_same}/{total} params "
          f"identical to SRC; logits max abs diff {e_diff:.3g} on {TOKENS.shape[1]} tokens")
    if d_same != total or e_same != total or e_diff > MAX_LOGIT_DIFF:
        print("FAILED: int4 checkpoint does not reproduce the bf16 one")
        return 1
    print("OK: int4 logits equal bf16 logits")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
