#!/usr/bin/env bash
# quality_trained.sh [QATSERVE] [CHARS]: the quality table of docs/quality.md on the QAT-trained tiny model
# (models/gemma4-tiny-qat/): `qatserve eval` on its held-out Austen text (the paragraphs in its first CHARS
# characters, default 65536, ~16k tokens, so that five evals fit a few minutes on the shared 2-core VM), in windows
# of 256 (the training context): the lossless int4 repack against the bf16 export, bf16 against f32 activations,
# --precision int8, the int8 KV cache (--kv-dtype int8) against the bf16 one and, at f32 activations (the cache's
# own error), against the f32 one, and the two lossy grids (`repack --grid textbook|ct-7.5`) against the lossless
# repack. The seven evals run side by side (one process each); prints a markdown table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/qatserve}
chars=${2:-65536}
model="$root/models/gemma4-tiny-qat"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for g in lossless textbook ct-7.5; do
  "$bin" repack "$model" "$work/$g" --grid "$g" > /dev/null
done
for g in textbook ct-7.5; do
  echo "verify --grid $g: $("$bin" verify "$model" "$work/$g" --allow-lossy 2>&1 | grep -E 'LOSSY' | head -1)"
done
# The first CHARS characters of the held-out text, whole paragraphs (every paragraph is one line).
head -c "$chars" "$model/held_out.txt" | sed '$d' > "$work/text.txt"
ev() { "$bin" eval --text "$work/text.txt" --context 256 --json "$work/$1.json" "${@:2}" > "$work/$1.log" 2>&1; }
ev lossless --model "$work/lossless" --reference-model "$model" &
ev f32 --model "$work/lossless" --precision bf16 --reference-precision f32 &
ev int8 --model "$work/lossless" --precision int8 --reference-precision bf16 &
ev kvint8 --model "$work/lossless" --kv-dtype int8 --reference-kv-dtype bf16 &
ev kvint8f32 --model "$work/lossless" --precision f32 --kv-dtype int8 --reference-kv-dtype f32 &
ev textbook --model "$work/textbook" --reference-model "$work/lossless" &
ev ct75 --model "$work/ct-7.5" --reference-model "$work/lossless" &
wait
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
rows = [("lossless", "int4 lossless repack vs bf16 export (bf16 activations)"),
        ("f32", "bf16 activations vs f32 (int4)"), ("int8", "`--precision int8` vs bf16 (int4)"),
        ("kvint8", "`--kv-dtype int8` vs the bf16 KV cache (int4, bf16 activations)"),
        ("kvint8f32", "`--kv-dtype int8` vs the f32 KV cache (int4, f32 activations: the cache alone)"),
        ("textbook", "`--grid textbook` (amax/8) vs lossless"), ("ct75", "`--grid ct-7.5` (amax/7.5) vs lossless")]
print("| model vs reference | perplexity | ref | mean KL | max KL | top-1 agree | max \\|logit diff\\| |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for key, label in rows:
    j = json.load(open(f"{work}/{key}.json"))
    c = j["comparison"]
    print(f"| {label} | {j['perplexity']:.4f} | {j['reference']['perplexity']:.4f} | {c['mean_kl']:.3g} | "
          f"{c['max_kl']:.3g} | {c['top1_agree']}/{c['positions']} | {c['max_abs_logit_diff']:.3g} |")
print(f"\n{j['tokens_scored']} tokens in {j['windows']} windows of {j['context']}")
PY
