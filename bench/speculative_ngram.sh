#!/usr/bin/env bash
# speculative_ngram.sh [QATSERVE] [ROUNDS] [K]: decode tokens/s of `qatserve generate` with and without
# `--speculative ngram --num-speculative-tokens K` (default 5) on an extraction/editing workload, on the QAT-trained
# tiny model (models/gemma4-tiny-qat/, the only trained model here: a random-weight model's greedy output copies
# nothing, so drafts would never be accepted).
#
# Workload ("copy the passage on"): each prompt is a passage of the model's held-out Austen text written out in full,
# then its first 12 words again, so that the continuation the model is asked for is the rest of the passage (an
# extraction or light edit: the answer copies the prompt). 4 passages (the held-out text's first lines, cut to
# 300 characters), greedy, 96 new tokens each. The trained model copies only part of the way before it drifts into
# its own prose, which is what the acceptance rate measures.
#
# The two modes alternate, ROUNDS (default 5) times, and the table gives the median decode tokens/s (tokens after
# the first / time after the first) over every run of each mode, the acceptance rate, and whether the generated ids
# are the same with and without speculation (they must be: greedy speculation is exact). Also the median of the
# per-pair ratios (each passage run with and without, back to back), which a shared machine's load swings disturb less.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/qatserve}
rounds=${2:-5}
k=${3:-5}
model="$root/models/gemma4-tiny-qat"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

head -n 4 "$model/held_out.txt" | cut -c1-300 > "$work/passages.txt"
run() {  # run MODE INDEX PASSAGE -> one line: mode decode_tok_s accepted drafted ids
  local mode=$1 i=$2 passage=$3 flags=()
  [[ $mode == ngram ]] && flags=(--speculative ngram --num-speculative-tokens "$k")
  local head
  head=$(echo "$passage" | cut -d' ' -f1-12)
  "$bin" generate --model "$model" --prompt "$passage"$'\n'"$head" --temperature 0 --max-tokens 96 \
    --print-ids "${flags[@]}" > "$work/$mode-$i.out" 2> "$work/$mode-$i.err"
  python3 - "$mode" "$work/$mode-$i.out" "$work/$mode-$i.err" <<'PY'
import re, sys
mode, out, err = sys.argv[1], open(sys.argv[2]).read().strip(), open(sys.argv[3]).read()
speed = float(re.search(r"([0-9.]+) tokens/s decode", err).group(1))
m = re.search(r"speculative: (\d+) of (\d+) draft tokens accepted", err)
acc, drafted = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
print(mode, speed, acc, drafted, out.splitlines()[-1])
PY
}

: > "$work/results.txt"
for r in $(seq 1 "$rounds"); do
  i=0
  while IFS= read -r passage; do
    i=$((i + 1))
    for mode in plain ngram; do run "$mode" "$r-$i" "$passage" >> "$work/results.txt"; done
  done < "$work/passages.txt"
done

python3 - "$work/results.txt" "$k" "$rounds" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
k, rounds = sys.argv[2], sys.argv[3]
by = {m: [r for r in rows if r[0] == m] for m in ("plain", "ngram")}
plain_ids = [r[4] for r in by["plain"]]
same = plain_ids == [r[4] for r in by["ngram"]]
med = {m: statistics.median(float(r[1]) for r in rs) for m, rs in by.items()}
print(f"| mode | runs | decode tok/s (median) | min | max | draft tokens accepted | ids equal to plain |")
print(f"|---|---|---|---|---|---|---|")
for m, rs in by.items():
    speeds = [float(r[1]) for r in rs]
    acc, drafted = sum(int(r[2]) for r in rs), sum(int(r[3]) for r in rs)
    rate = f"{acc}/{drafted} ({100 * acc / drafted:.0f}%)" if drafted else "-"
    label = "plain" if m == "plain" else f"--speculative ngram, K={k}"
    print(f"| {label} | {len(rs)} | {med[m]:.0f} | {min(speeds):.0f} | {max(speeds):.0f} | {rate} | "
          f"{'-' if m == 'plain' else ('yes' if same else 'NO')} |")
ratios = [float(n[1]) / float(p[1]) for p, n in zip(by["plain"], by["ngram"])]  # each passage's run right after
print(f"\nspeed-up: {med['ngram'] / med['plain']:.2f}x median over median, {statistics.median(ratios):.2f}x median of "
      f"the {len(ratios)} back-to-back pairs, over {rounds} alternating rounds")
sys.exit(0 if same else 1)
PY
