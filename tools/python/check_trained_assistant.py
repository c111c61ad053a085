#!/usr/bin/env python3
"""check_trained_assistant.py QATSERVE: qatserve's drafting chain of the trained assistant
(models/gemma4-tiny-qat-assistant, tools/python/train_tiny_assistant.py) against transformers'.

The reference is make_assistant_fixtures.draft_chains (transformers 5.23 in float32 with that script's two
kv_sharing_modes patches, imported): for every position t of a prompt, the demo target runs tokens[0..t], the
assistant drafts 4 tokens after it, fed tokens[t+1] (the last row: the target's argmax). The prompt is a held-out
Austen paragraph, 96 tokens after <bos>, so that the drafter's sliding layer reads past its window of 64.
qatserve runs `logits --assistant --precision f32` on
  1. the bf16 exports (models/gemma4-tiny-qat + models/gemma4-tiny-qat-assistant),
  2. their int4 repacks (`qatserve repack`, each checked lossless by `qatserve verify`),
and its assistant_chain [T, 4, vocab] must equal the reference within 1e-5 of each draft's peak |logit|, with the
same greedy drafts. Exit 0 when all holds; prints the measured differences.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import make_assistant_fixtures as maf
from gemma4_fixture_run import load_model, load_safetensors_file
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "gemma4-tiny-qat"
ASSISTANT = REPO / "models" / "gemma4-tiny-qat-assistant"
PROMPT_TOKENS = 96
MAX_REL = 1e-5


def run(*args):
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def repack(qatserve, src, dst):
    run(qatserve, "repack", src, dst)
    out = run(qatserve, "verify", src, dst)
    if "OK: lossless" not in out:
        raise SystemExit(f"verify {dst}: not lossless:\n{out}")


def qatserve_chain(qatserve, target, assistant, tokens, work):
    out = work / "logits.safetensors"
    run(qatserve, "logits", "--model", target, "--assistant", assistant, "--precision", "f32", "--tokens",
        ",".join(map(str, tokens.tolist())), "--out", out)
    return load_safetensors_file(out)["assistant_chain"]


def main():
    qatserve = sys.argv[1]
    torch.set_num_threads(1)
    maf.patch_kv_sharing_modes()
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    held = tok.encode((TARGET / "held_out.txt").read_text(), add_special_tokens=False).ids
    tokens = torch.tensor([2] + held[:PROMPT_TOKENS], dtype=torch.int32)
    target = load_model(TARGET, torch.float32)
    assistant = maf.load_assistant(ASSISTANT, torch.float32)
    ref, ref_ids, _, _ = maf.draft_chains(target, assistant, tokens)
    print(f"transformers: {tokens.numel()} positions x {maf.DRAFTS} drafts; first drafts "
          f"{ref_ids[:6].tolist()}")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repack(qatserve, TARGET, work / "target-w4a16")
        repack(qatserve, ASSISTANT, work / "assistant-w4a16")
        for what, t, a in (("bf16 exports", TARGET, ASSISTANT),
                           ("int4 repacks", work / "target-w4a16", work / "assistant-w4a16")):
            got = qatserve_chain(qatserve, t, a, tokens, work)
            rel = float(((got - ref).abs().amax(-1) / ref.abs().amax(-1)).max())
            same = torch.equal(got.argmax(-1).to(torch.int32), ref_ids)
            print(f"{what}: max |qatserve - transformers| / peak |logit| = {rel:.3g}, greedy drafts equal: {same}")
            if rel > MAX_REL or not same:
                failures.append(what)
    print("trained assistant external check " + (f"FAILED: {failures}" if failures else "OK"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
