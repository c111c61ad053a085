#!/usr/bin/env python3
"""check_kv_int8_trained.py QATSERVE [MODEL] [--windows N]: the int8 KV cache's own logit error, against transformers.

The int8 cache's rule (src/model/kv_cache.h): every position's K and V row of each KV head is stored as int8 codes
round(value / scale) with scale = amax / 127 of that row. This script applies that rule in transformers (a cache
whose update() rounds K after k_norm and RoPE, and V after v_norm, exactly what qatserve commits; the KV-shared
layers read the rounded rows of their donors), independently of qatserve's code, and compares, on the trained demo
model's held-out text in windows as `qatserve eval` cuts them (BOS + the window minus its last token):

  transformers f32, int8-rounded cache  vs  transformers f32, exact cache      -> mean KL (the rule's own error)
  qatserve eval --precision f32 --kv-dtype int8 --reference-kv-dtype f32          -> mean KL (qatserve's)

Checks: qatserve's mean KL <= 1e-4 (the int8 KV cache's accuracy bar) and within 2% of transformers' (same rule,
same ids: they differ only by summation order). Also prints, without checking, the same comparison at bf16
activations, where the cache's error is not separable from bf16's own: there any perturbation of K as small as one
bf16 step of each value moves the logits about as much as int8 does (the row "bf16 step on K" shows it), because
every later bf16 rounding can then fall the other way. Exit 0 when both checks hold, 1 otherwise.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

CONTEXT = 256
GOAL_KL = 1e-4
REL_AGREEMENT = 0.02  # measured: equal to four digits (1.715e-5 both); summation order may move it


def int8_rows(x):
    """The int8 cache's rounding of [.., positions, head_dim] rows: one amax / 127 scale per row."""
    scale = x.float().abs().amax(-1, keepdim=True) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.round(x.float() / scale).clamp(-127, 127) * scale).to(x.dtype)


def bf16_step(x):
    """K moved by one bf16 step of each value (a perturbation about as large as int8's)."""
    return (x.float() * (1 + 2 ** -7)).to(x.dtype)


SCHEMES = {"exact": (None, None), "int8 K and V": (int8_rows, int8_rows), "int8 K only": (int8_rows, None),
           "int8 V only": (None, int8_rows), "bf16 step on K": (bf16_step, None)}


def rounding_cache(config, scheme):
    k_rule, v_rule = SCHEMES[scheme]

    class Cache(DynamicCache):
        def update(self, keys, values, layer_idx, *args, **kwargs):
            keys = k_rule(keys) if k_rule else keys
            values = v_rule(values) if v_rule else values
            return super().update(keys, values, layer_idx, *args, **kwargs)

    return Cache(config=config)


@torch.no_grad()
def mean_kl(model, bos, ids, scheme, reference_logits=None):
    """Mean KL(exact || scheme) over every window's positions, and the exact logits (when computing them)."""
    text_config = model.config.get_text_config()
    kls, logits_out = [], []
    for i, begin in enumerate(range(0, len(ids), CONTEXT)):
        window = torch.tensor([bos] + ids[begin:begin + CONTEXT - 1])[None]
        logits = model(window, past_key_values=rounding_cache(text_config, scheme), use_cache=True).logits[0].double()
        if reference_logits is None:
            logits_out.append(logits)
            continue
        p = torch.log_softmax(reference_logits[i], -1)
        kls.append((p.exp() * (p - torch.log_softmax(logits, -1))).sum(-1))
    return (torch.cat(kls).mean().item() if kls else None), logits_out


def transformers_kls(model_dir, ids, dtype):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    bos = model.config.get_text_config().bos_token_id
    _, exact = mean_kl(model, bos, ids, "exact")
    return {scheme: mean_kl(model, bos, ids, scheme, exact)[0] for scheme in SCHEMES if scheme != "exact"}


def qatserve_kl(qatserve, model_dir, ids_file, precision):
    reference = "f32" if precision == "f32" else "bf16"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "eval.json"
        subprocess.run([qatserve, "eval", "--model", str(model_dir), "--tokens", str(ids_file), "--context",
                        str(CONTEXT), "--precision", precision, "--kv-dtype", "int8", "--reference-kv-dtype",
                        reference, "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main():
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("qatserve")
    parser.add_argument("model", nargs="?", default=str(here.parent.parent / "models" / "gemma4-tiny-qat"))
    parser.add_argument("--windows", type=int, default=16, help="windows of 256 tokens of held_out.txt (max 64)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = Path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = (model_dir / "held_out.txt").read_text()
    ids = tokenizer(text[:CONTEXT * 8 * args.windows], add_special_tokens=False).input_ids
    ids = ids[:(CONTEXT - 1) * args.windows]  # whole windows of CONTEXT - 1 tokens after BOS
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = Path(tmp) / "ids.txt"
        ids_file.write_text(" ".join(map(str, ids)))
        for precision, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            ours = qatserve_kl(args.qatserve, model_dir, ids_file, precision)
            theirs = transformers_kls(model_dir, ids, dtype)
            kl = ours["comparison"]["mean_kl"]
            print(f"{precision} activations, {ours['comparison']['positions']} positions: qatserve int8 KV mean KL "
                  f"{kl:.3e}; transformers with the same rounding: "
                  + ", ".join(f"{name} {value:.3e}" for name, value in theirs.items()))
            if precision == "f32":
                reference = theirs["int8 K and V"]
                agree = abs(kl - reference) <= REL_AGREEMENT * reference
                print(f"  check: qatserve <= {GOAL_KL:g}: {'ok' if kl <= GOAL_KL else 'FAIL'}; within "
                      f"{REL_AGREEMENT:.0%} of transformers': {'ok' if agree else 'FAIL'}")
                ok = ok and kl <= GOAL_KL and agree
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
