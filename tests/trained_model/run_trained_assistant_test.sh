#!/usr/bin/env bash
# run_trained_assistant_test.sh QATSERVE_BINARY: the committed assistant drafter trained against the demo model
# (models/gemma4-tiny-qat-assistant, tools/python/train_tiny_assistant.py) in speculative decoding. For the bf16
# exports and for their int4 repacks (each `verify`-ed lossless), greedy `generate --assistant` must give exactly
# the ids of plain greedy `generate` (a held-out Austen prompt and a chat prompt, bf16 and f32 activations), and
# accept at least $floor of its draft tokens over these runs: greedy acceptance is deterministic (measured 448 of 502
# = 0.89 on AVX2, Zen 3, 2026-12-07; the floor leaves room for another machine's kernels
# flipping a near-tie). Needs nothing but the binary; no timing is asserted.
set -euo pipefail
qatserve="${1:?usage: run_trained_assistant_test.sh QATSERVE_BINARY}"
models="$(cd "$(dirname "$0")/../.." && pwd)/models"
floor=0.80
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for m in gemma4-tiny-qat gemma4-tiny-qat-assistant; do
  "$qatserve" repack "$models/$m" "$work/$m" > "$work/repack.log"
  "$qatserve" verify "$models/$m" "$work/$m" > "$work/verify.log"
  grep -q '^OK: lossless$' "$work/verify.log" || { cat "$work/verify.log"; echo "FAIL: $m repack not lossless"; exit 1; }
  grep -q '"kept_bf16": \[\]' "$work/$m/repack_report.json" || { echo "FAIL: $m: a linear stayed bf16"; exit 1; }
done

prose="Anne had not wanted this visit to Uppercross, to learn that"
chat="Tell me about Captain Wentworth."
ids() {  # PRECISION TARGET [ASSISTANT]: greedy ids (stderr to $work/err)
  local args=(--model "$2" --precision "$1" --temperature 0 --print-ids)
  [[ -n "${3:-}" ]] && args+=(--assistant "$3")
  "$qatserve" generate "${args[@]}" "${prompt_args[@]}" 2> "$work/err" | tr -d '[:space:]'
}
accepted_total=0 drafted_total=0
for format in bf16 int4; do
  if [[ $format == bf16 ]]; then target="$models/gemma4-tiny-qat" assistant="$models/gemma4-tiny-qat-assistant"
  else target="$work/gemma4-tiny-qat" assistant="$work/gemma4-tiny-qat-assistant"; fi
  for precision in bf16 f32; do
    for kind in prose chat; do
      if [[ $kind == prose ]]; then prompt_args=(--prompt "$prose" --max-tokens 96)
      else prompt_args=(--prompt "$chat" --chat --max-tokens 64); fi
      plain=$(ids "$precision" "$target")
      spec=$(ids "$precision" "$target" "$assistant")
      line=$(grep -o 'speculative: [0-9]* of [0-9]* draft tokens accepted.*\]' "$work/err" || true)
      read -r acc drafted < <(sed -n 's/.*speculative: \([0-9]*\) of \([0-9]*\) draft.*/\1 \2/p' "$work/err")
      echo "$format weights, $precision activations, $kind: ${line:-no speculative line}"
      [[ -n "$plain" && "$plain" == "$spec" ]] || { echo "FAIL: ids with the assistant differ: $spec vs $plain"; exit 1; }
      accepted_total=$((accepted_total + acc)) drafted_total=$((drafted_total + drafted))
    done
  done
done
rate=$(awk -v a="$accepted_total" -v d="$drafted_total" 'BEGIN { printf "%.4f", a / d }')
echo "acceptance over all runs: $accepted_total of $drafted_total = $rate (floor $floor)"
awk -v r="$rate" -v f="$floor" 'BEGIN { exit !(r >= f) }' || { echo "FAIL: acceptance below the floor"; exit 1; }
echo "trained assistant: greedy ids equal to plain decoding, acceptance $rate"
