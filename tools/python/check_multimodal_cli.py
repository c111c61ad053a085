#!/usr/bin/env python3
"""check_multimodal_cli.py QATSERVE FIXTURE...: images and audio end to end through the command line, from the bytes.

For each multimodal fixture (tests/fixtures/mm_*, made by make_multimodal_fixtures.py) and each of its cases, the
case's conversation is written as OpenAI chat messages, every image as an `image_url` data URL of the PNG in media/
and every clip as an `input_audio` part of the WAV, and run through

  1. qatserve logits --messages --precision f32    on bf16/ and w4a16/: `tokens` = the processor's input ids;
     logits at the fixture's rows within F32_REL of each row's peak |logit| of transformers' float32 logits
  2. qatserve logits --messages --precision bf16   on bf16/ and w4a16/: tokens as above; max |ours - transformers
     f32| at most BF16_RATIO x transformers' own bf16 model's (the largest over the fixture's cases)
  3. qatserve generate --messages --temperature 0 --precision f32 --print-ids --max-tokens 8 --ignore-eos   on bf16/:
     all 8 greedy tokens = transformers' (both generated past any eos)

The oracle is transformers 5.23's numbers in reference.safetensors. Exit 0 when every check holds, 1 otherwise.
"""
import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.torch import load_file as torch_load_file

from make_multimodal_fixtures import cases

F32_REL = 1e-4  # max |ours - reference| / max |reference| per position (the bound)
BF16_RATIO = 1.5  # as gemma4_vision_test's bf16 bound: no further from f32 than 1.5x transformers' bf16 model
GREEDY_TOKENS = 8


def openai_messages(conversation, media):
    def part(p):
        if p["type"] == "text":
            return {"type": "text", "text": p["text"]}
        data = base64.b64encode((media / (p["name"] + (".png" if p["type"] == "image" else ".wav"))).read_bytes())
        if p["type"] == "image":
            return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data.decode()}}
        return {"type": "input_audio", "input_audio": {"data": data.decode(), "format": "wav"}}
    return [{"role": m["role"], "content": [part(p) for p in m["content"]]} for m in conversation]


def run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def load_file(path):  # as float32 / int numpy arrays (numpy has no bfloat16)
    return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in torch_load_file(path).items()}


def check_fixture(qatserve, fixture, tmp):
    meta = json.loads((fixture / "meta.json").read_text())
    ref = load_file(str(fixture / "reference.safetensors"))
    conversations = cases(None, None, meta["config"]["audio"] is not None)
    ok = True
    for fmt in ("bf16", "w4a16"):
        model = fixture / fmt
        hf_bf16_err, ours_bf16_err = 0.0, {}
        for case in meta["cases"]:
            msgs = tmp / f"{fixture.name}.{case}.json"
            msgs.write_text(json.dumps({"messages": openai_messages(conversations[case], fixture / "media")}))
            rows = ref[f"{case}.logits_rows"]
            want = ref[f"{case}.logits_f32"]
            for precision in ("f32", "bf16"):
                out = tmp / f"{fixture.name}.{fmt}.{case}.{precision}.safetensors"
                run([qatserve, "logits", "--model", model, "--messages", msgs, "--out", out, "--precision", precision])
                got = load_file(str(out))
                if not np.array_equal(got["tokens"], ref[f"{case}.input_ids"]):
                    print(f"FAIL {fixture.name}/{fmt} {case} {precision}: tokens differ from the processor's "
                          f"({got['tokens'].size} vs {ref[f'{case}.input_ids'].size})")
                    ok = False
                    continue
                diff = np.abs(got["logits"][rows] - want).max(-1)
                if precision == "f32":
                    rel = float((diff / np.abs(want).max(-1)).max())
                    good = rel <= F32_REL
                    ok &= good
                    print(f"{'ok  ' if good else 'FAIL'} {fixture.name}/{fmt} {case} f32: tokens equal ({rows.size} "
                          f"rows), max|diff|/max|ref| = {rel:.3g} (<= {F32_REL})")
                else:
                    hf = ref[f"{case}.logits_bf16"]
                    hf_bf16_err = max(hf_bf16_err, float(np.abs(hf - want).max()))
                    ours_bf16_err[case] = float(diff.max())
        for case, err in ours_bf16_err.items():
            good = err <= BF16_RATIO * hf_bf16_err
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} {fixture.name}/{fmt} {case} bf16: max|ours - hf f32| = {err:.3g}, "
                  f"transformers' bf16 = {hf_bf16_err:.3g} (ratio <= {BF16_RATIO})")
    for case in meta["cases"]:
        msgs = tmp / f"{fixture.name}.{case}.json"
        out = run([qatserve, "generate", "--model", fixture / "bf16", "--messages", msgs, "--temperature", "0",
                   "--precision", "f32", "--print-ids", "--max-tokens", str(GREEDY_TOKENS), "--ignore-eos"])
        ids = [int(t) for t in out.strip().splitlines()[-1].split(",") if t]
        golden = [int(t) for t in ref[f"{case}.greedy_f32"]]
        good = ids == golden and len(ids) == GREEDY_TOKENS
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {fixture.name} {case} greedy: {ids} vs transformers {golden}")
    return ok


def main():
    qatserve, fixtures = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    with tempfile.TemporaryDirectory() as tmp:
        ok = all([check_fixture(qatserve, f, Path(tmp)) for f in fixtures])
    print("multimodal CLI check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
