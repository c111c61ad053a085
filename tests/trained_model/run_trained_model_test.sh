#!/usr/bin/env bash
# run_trained_model_test.sh QATSERVE_BINARY: the committed QAT-trained model (models/gemma4-tiny-qat/) repacks
# losslessly (`verify` finds every group of every quantized tensor reproduced), and qatserve's float32 greedy decoding
# of the int4 repack gives exactly transformers' greedy ids on the bf16 export (reference_greedy.txt, written by
# tools/python/train_tiny_qat.py export): 16 tokens continuing an English sentence, and a chat answer that stops
# with <turn|>. Needs nothing but the binary.
set -euo pipefail
qatserve="${1:?usage: run_trained_model_test.sh QATSERVE_BINARY}"
model="$(cd "$(dirname "$0")/../.." && pwd)/models/gemma4-tiny-qat"
ref="$model/reference_greedy.txt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

field() { sed -n "s/^$1: //p" "$ref"; }

"$qatserve" repack "$model" "$work/w4a16" > "$work/repack.log"
"$qatserve" verify "$model" "$work/w4a16" | tee "$work/verify.log"
grep -q '^OK: lossless$' "$work/verify.log" || { echo "FAIL: verify did not report lossless"; exit 1; }
grep -q '"lossless": true' "$work/w4a16/repack_report.json" || { echo "FAIL: repack_report not lossless"; exit 1; }
grep -q '"kept_bf16": \[\]' "$work/w4a16/repack_report.json" || { echo "FAIL: a tensor stayed bf16"; exit 1; }

check() {  # NAME MAX_TOKENS GENERATE_ARGS...: qatserve's greedy ids on the repack == transformers' (and the finish)
  local name=$1 max=$2 got finish
  got=$("$qatserve" generate --model "$work/w4a16" "${@:3}" --max-tokens "$max" \
        --temperature 0 --precision f32 --print-ids 2> "$work/$name.err" | tr -d '[:space:]')
  finish=$(sed -n 's/.*finish: \([a-z]*\).*/\1/p' "$work/$name.err")
  echo "$name ${*:3}: qatserve  $got ($finish)"
  echo "$name: reference $(field "${name}_ids") ($(field "${name}_finish")) $(field "${name}_text")"
  [[ "$got" == "$(field "${name}_ids")" ]] || { echo "FAIL: $name ids differ from transformers'"; exit 1; }
  [[ "$finish" == "$(field "${name}_finish")" ]] || { echo "FAIL: $name finish differs"; exit 1; }
}
# From the reference's own prompt ids, then through qatserve's tokenizer and chat template.
check prose 16 --tokens "$(field prose_prompt_ids)"
check chat 48 --tokens "$(field chat_prompt_ids)"
check prose 16 --prompt "$(field prose_prompt)"
check chat 48 --prompt "$(field chat_prompt)" --chat
[[ "$(field chat_finish)" == stop ]] || { echo "FAIL: the reference chat answer does not end with <turn|>"; exit 1; }
echo "trained model: lossless repack, greedy ids equal to transformers'"
