#!/usr/bin/env bash
# qatserve vs llama.cpp on the same synthetic full-size Gemma 4 E2B QAT checkpoint: pp512 and tg128 at the same
# thread count, runs alternating (llama.cpp, qatserve, llama.cpp, ...) so that drift on the shared host hits both.
# Prints the ratio qatserve / llama.cpp and each side's fraction of the memory-bandwidth bound (bandwidth measured
# by `qatserve bench` in the same runs).
#
# llama.cpp is built outside this repository (none of its code belongs here):
#   LLAMACPP_DIR  its checkout, built with build/bin/llama-bench and build/bin/llama-quantize
#   LLAMACPP_PY   a python with torch, transformers, numpy, sentencepiece and its gguf-py (for convert_hf_to_gguf.py)
# Build it with this CPU's ISA but without AMX: the VM lists amx_* in /proc/cpuinfo, yet llama.cpp's AMX matmul
# segfaults here (GGML_NATIVE=ON turns it on), e.g.
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
#     -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON \
#     -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
#   cmake --build build -j2 --target llama-bench llama-quantize test-backend-ops
# Optional: QATSERVE (default build/qatserve), THREADS (2), RUNS (3), TOKENIZER_DIR (holds the Gemma 4
# tokenizer.reconstructed.json the converter gets when the checkpoint has no tokenizer.json; default
# ../shared/tokenizer/gemma4), KEEP_BF16_GGUF=1.
#
# Usage: bench/llamacpp_side_by_side.sh BF16_CHECKPOINT QATSERVE_CHECKPOINT [WORK_DIR]
#   BF16_CHECKPOINT      what llama.cpp converts (`qatserve synth --preset e2b --format bf16`)
#   QATSERVE_CHECKPOINT  what qatserve runs (the lossless int4 repack of the same)
#   WORK_DIR             GGUF files and per-run JSON (default out/llamacpp in the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: bench/llamacpp_side_by_side.sh BF16_CHECKPOINT QATSERVE_CHECKPOINT [WORK_DIR]}
qs_model=${2:?usage: bench/llamacpp_side_by_side.sh BF16_CHECKPOINT QATSERVE_CHECKPOINT [WORK_DIR]}
work=${3:-$root/out/llamacpp}
: "${LLAMACPP_DIR:?set LLAMACPP_DIR to a built llama.cpp checkout}"
: "${LLAMACPP_PY:?set LLAMACPP_PY to the python that runs its converter}"
qatserve=${QATSERVE:-$root/build/qatserve}
threads=${THREADS:-2}
runs=${RUNS:-3}
tokenizer_dir=${TOKENIZER_DIR:-$root/../shared/tokenizer/gemma4}
bin=$LLAMACPP_DIR/build/bin
for tool in "$bin/llama-bench" "$bin/llama-quantize" "$qatserve"; do
  [ -x "$tool" ] || { echo "missing $tool" >&2; exit 1; }
done
mkdir -p "$work"
bf16_gguf=$work/e2b-bf16.gguf
q4_gguf=$work/e2b-q4_0.gguf

# The converter reads a directory: the checkpoint's files, linked, plus a tokenizer when the checkpoint has none
# (synthetic checkpoints carry weights only; the Gemma 4 vocabulary is what the converter needs).
stage_source() {
  local stage=$work/src
  rm -rf "$stage" && mkdir -p "$stage"
  ln -s "$src"/* "$stage"/
  [ -e "$stage/tokenizer.json" ] || ln -s "$tokenizer_dir/tokenizer.reconstructed.json" "$stage/tokenizer.json"
  # The converter's transformers (4.57) reads tokenizer_config.json and rejects the one newer transformers
  # re-save (extra_special_tokens as a list): give it the plain Gemma fields.
  if [ ! -e "$stage/tokenizer_config.json" ]; then
    cat > "$stage/tokenizer_config.json" <<'JSON'
{"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
 "unk_token": "<unk>", "add_bos_token": true, "add_eos_token": false, "padding_side": "left"}
JSON
  fi
  echo "$stage"
}

if [ ! -s "$q4_gguf" ]; then
  if [ ! -s "$bf16_gguf" ]; then
    stage=$(stage_source)
    echo "converting $src -> $bf16_gguf (llama.cpp's convert_hf_to_gguf.py)" >&2
    "$LLAMACPP_PY" "$LLAMACPP_DIR/convert_hf_to_gguf.py" "$stage" --outtype bf16 --outfile "$bf16_gguf.tmp" >&2
    mv "$bf16_gguf.tmp" "$bf16_gguf"
  fi
  echo "quantizing -> $q4_gguf (Q4_0)" >&2
  "$bin/llama-quantize" "$bf16_gguf" "$q4_gguf.tmp" Q4_0 "$threads" >&2
  mv "$q4_gguf.tmp" "$q4_gguf"
  [ "${KEEP_BF16_GGUF:-0}" = 1 ] || rm -f "$bf16_gguf"
fi

# Alternate the two, one llama-bench repetition per turn, so each side sees the same stretches of host load.
for i in $(seq 1 "$runs"); do
  echo "run $i/$runs: llama-bench" >&2
  "$bin/llama-bench" -m "$q4_gguf" -p 512 -n 128 -t "$threads" -r 1 -o json > "$work/llamacpp_run$i.json"
  echo "run $i/$runs: qatserve bench" >&2
  "$qatserve" bench --model "$qs_model" --prompts 512 --streams 1 --depths 0 --decode-tokens 128 \
    --threads "$threads" --json "$work/qatserve_run$i.json" > /dev/null
done

# Bytes llama.cpp reads per decoded token: every tensor of the GGUF except the per-layer token-embedding table,
# of which one row is gathered (the tied token_embd is read whole, as the LM head). Its KV at depth <= 640 is
# under 1% of that and left out (qatserve's JSON counts its own KV).
"$LLAMACPP_PY" - "$q4_gguf" "$work" "$runs" <<'EOF'
import json, statistics, sys
from gguf import GGUFReader

gguf_path, work, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = GGUFReader(gguf_path)
read = 0
for t in reader.tensors:
    if t.name == "per_layer_token_embd.weight":
        read += int(t.n_bytes) // int(t.shape[-1])  # one row per token
    else:
        read += int(t.n_bytes)
types = {t.name: t.tensor_type.name for t in reader.tensors if t.name in ("token_embd.weight", "output.weight", "per_layer_token_embd.weight")}

lc_pp, lc_tg, qs_pp, qs_tg, qs_tg_bytes, bw = [], [], [], [], [], []
for i in range(1, runs + 1):
    for r in json.load(open(f"{work}/llamacpp_run{i}.json")):
        (lc_pp if r["n_prompt"] > 0 else lc_tg).append(r["avg_ts"])
    q = json.load(open(f"{work}/qatserve_run{i}.json"))
    bw.append(q["bandwidth"]["bytes_per_second"])
    for r in q["rows"]:
        if r["phase"] == "prefill":
            qs_pp.append(r["tokens_per_second"])
        else:
            qs_tg.append(r["tokens_per_second"])
            qs_tg_bytes.append(r["weight_bytes_per_token"] + r["kv_bytes_per_token"])

med = statistics.median
bound = max(bw)
qs_bytes = med(qs_tg_bytes)
print(f"threads {q['threads']}, {runs} alternating runs each, medians; memory read bandwidth {bound / 1e9:.1f} GB/s "
      f"(best of qatserve's sweeps)")
print(f"llama.cpp GGUF {gguf_path}: {types}")
print()
print("| | qatserve | llama.cpp | qatserve / llama.cpp |")
print("| --- | --- | --- | --- |")
print(f"| pp512 tokens/s | {med(qs_pp):.2f} | {med(lc_pp):.2f} | {med(qs_pp) / med(lc_pp):.2f} |")
print(f"| tg128 tokens/s | {med(qs_tg):.2f} | {med(lc_tg):.2f} | {med(qs_tg) / med(lc_tg):.2f} |")
print(f"| tg128 bytes read per token | {qs_bytes / 1e9:.2f} GB | {read / 1e9:.2f} GB | |")
print(f"| tg128 bound (bandwidth / bytes) | {bound / qs_bytes:.1f} tokens/s | {bound / read:.1f} tokens/s | |")
print(f"| tg128 fraction of the bound | {med(qs_tg) * qs_bytes / bound:.1%} | {med(lc_tg) * read / bound:.1%} | |")
print()
print("runs (tokens/s): qatserve pp", [round(x, 2) for x in qs_pp], "tg", [round(x, 2) for x in qs_tg],
      "| llama.cpp pp", [round(x, 2) for x in lc_pp], "tg", [round(x, 2) for x in lc_tg])
EOF
