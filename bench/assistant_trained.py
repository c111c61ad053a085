#!/usr/bin/env python3
"""assistant_trained.py [--qatserve BIN] [--rounds N] [--model DIR --assistant DIR]: speculative decoding with the
assistant drafter trained against the demo model (models/gemma4-tiny-qat-assistant, tools/python/train_tiny_assistant.py),
through `qatserve generate` (greedy, bf16 activations, the machine's threads).

Prompts (the drafter was trained on the target's continuations of prompts from the demo model's training data):
  prose  the first 12 words of 6 paragraphs of the demo model's held-out Austen text (models/gemma4-tiny-qat/
         held_out.txt, whichever --model runs), 128 new tokens;
  chat   6 user turns in the chat template, up to 64 new tokens (most answers stop earlier, at <turn|>); 2 of them
         ("Tell me about Captain Wentworth.", "Who wrote Persuasion?") are also among the training chats' prompts,
         the other 4 are not.
For each round, each prompt runs plain and then with `--assistant --num-speculative-tokens K` for K = 1..4, back to
back. Acceptance is deterministic under greedy decoding (read from round 1; every round's ids are compared with
plain decoding's); decode tokens/s (tokens after the first / time after the first, as generate prints it) is the
median over rounds of each set's total, and the speed-up the median over the back-to-back (plain, K) pairs.
Prints a Markdown table; exit 1 if any ids differ from plain decoding.
"""
import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHATS = ["Tell me about Captain Wentworth.", "Who wrote Persuasion?", "Write a sentence about the sea.",
         "What do you know about Mr. Elliot?", "Say something about a long walk.", "Good evening!"]
KS = (1, 2, 3, 4)


def prose_prompts(model):
    paras = [p for p in (model / "held_out.txt").read_text().splitlines() if len(p.split()) >= 30]
    return [" ".join(p.split()[:12]) for p in paras[::max(1, len(paras) // 6)][:6]]


def generate(args, prompt_args, k):
    cmd = [args.qatserve, "generate", "--model", args.model, "--temperature", "0", "--print-ids", *prompt_args]
    if k:
        cmd += ["--assistant", args.assistant, "--num-speculative-tokens", str(k)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    err = done.stderr
    m = re.search(r"(\d+) generated, ([0-9.]+) tokens/s decode", err)
    n, speed = int(m.group(1)), float(m.group(2))
    per_pos = [tuple(map(int, p.split("/"))) for p in re.findall(r" (\d+/\d+)", err.split("by draft position:")[-1])] \
        if "by draft position:" in err else []
    return dict(ids=done.stdout.strip().splitlines()[-1], tokens=n, speed=speed,
                seconds=(n - 1) / speed if speed else 0.0, per_pos=per_pos)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qatserve", default=str(ROOT / "build" / "qatserve"))
    ap.add_argument("--model", default=str(ROOT / "models" / "gemma4-tiny-qat"))
    ap.add_argument("--assistant", default=str(ROOT / "models" / "gemma4-tiny-qat-assistant"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sets = {"prose": [["--prompt", p, "--max-tokens", "128"] for p in prose_prompts(ROOT / "models" / "gemma4-tiny-qat")],
            "chat": [["--prompt", c, "--chat", "--max-tokens", "64"] for c in CHATS]}
    runs = {}  # (set, k, round, prompt) -> result
    for r in range(args.rounds):
        for name, prompts in sets.items():
            for i, p in enumerate(prompts):
                for k in (0, *KS):
                    runs[name, k, r, i] = generate(args, p, k)
    same = all(runs[s, k, r, i]["ids"] == runs[s, 0, r, i]["ids"] for (s, k, r, i) in runs)
    print("| prompts | K | draft tokens accepted | by draft position (accepted/drafted) | tokens per verification | "
          "decode tok/s plain | with assistant | speed-up (median of pairs) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, prompts in sets.items():
        def total_speed(k, r):
            rs = [runs[name, k, r, i] for i in range(len(prompts))]
            return sum(x["tokens"] - 1 for x in rs) / sum(x["seconds"] for x in rs)
        plain = statistics.median(total_speed(0, r) for r in range(args.rounds))
        for k in KS:
            first = [runs[name, k, 0, i] for i in range(len(prompts))]
            pos = [(sum(x["per_pos"][j][0] for x in first if len(x["per_pos"]) > j),
                    sum(x["per_pos"][j][1] for x in first if len(x["per_pos"]) > j)) for j in range(k)]
            acc, drafted = sum(a for a, _ in pos), sum(d for _, d in pos)
            steps = pos[0][1] if pos else 0          # every verification drafts a first token
            speed = statistics.median(total_speed(k, r) for r in range(args.rounds))
            pairs = [runs[name, k, r, i]["speed"] / runs[name, 0, r, i]["speed"]
                     for r in range(args.rounds) for i in range(len(prompts)) if runs[name, 0, r, i]["speed"] > 0]
            by_pos = " ".join(f"{a / d:.2f}" if d else "-" for a, d in pos)
            print(f"| {name} | {k} | {acc}/{drafted} ({acc / drafted:.2f}) | {by_pos} | "
                  f"{(acc + steps) / steps:.2f} | {plain:.0f} | {speed:.0f} | {speed / plain:.2f}x "
                  f"({statistics.median(pairs):.2f}x) |")
    print(f"\nids with the assistant equal to plain decoding in every run: {'yes' if same else 'NO'} "
          f"({args.rounds} rounds, {sum(len(p) for p in sets.values())} prompts, K = 1..4)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
