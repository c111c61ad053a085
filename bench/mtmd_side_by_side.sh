#!/usr/bin/env bash
# qatserve's vision tower vs llama.cpp's mtmd on the same synthetic full-size Gemma 4 E2B vision tower: one image of
# the processor's default budget (960 x 672 random pixels = a full 60 x 42 grid of 16-pixel patches, 2520 patches,
# 280 soft tokens; llama.cpp's Gemma 4 preprocessing keeps that size too), its encode time in wall and CPU seconds.
# Runs alternate (llama.cpp, then each qatserve row, again...) so that drift on the shared host hits both sides.
#
# llama.cpp: its encode in wall ms from mtmd-cli's own log ("mtmd batch encoding done in N ms"); its CPU seconds
# are the process's utime + stime (/proc/PID/stat) between the log's "encoding mtmd batch" and that line, polled
# every 0.1 s; the process is stopped there (the text model's prefill of the soft tokens is not timed). qatserve:
# bench/vision_tower_bench's BM_VisionTowerEncode rows (wall time, and cpu_s_all_threads: the process's CPU seconds
# per encode), on towers synth writes with the same seed, so with the same weights as the checkpoint converted here.
#
# llama.cpp is built outside this repository (none of its code belongs here):
#   LLAMACPP_DIR  its checkout, built with build/bin/llama-mtmd-cli (GGML_NATIVE=OFF and the GGML_* ISA options
#                 of this CPU without AMX, as bench/llamacpp_side_by_side.sh says; check each against
#                 /proc/cpuinfo: a VM without avx512_vbmi / avx512_bf16 / avx_vnni dies of SIGILL in the encode)
#   LLAMACPP_PY   a python that runs its convert_hf_to_gguf.py (requirements/requirements-convert_hf_to_gguf.txt)
# Optional: THREADS (2), RUNS (3), ROWS ('0/1/280 0/0/280': the bench's E2B w4a16 and bf16 rows at 280 tokens),
# MMPROJ_TYPE (bf16: the tower's own bits; f16 also works), TEXT_TYPE (q8_0: mtmd-cli needs a text model but only
# loads it here), TOKENIZER_DIR (default ../shared/tokenizer/gemma4), BENCH (default build/bench/vision_tower_bench).
#
# Usage: bench/mtmd_side_by_side.sh BF16_CHECKPOINT [WORK_DIR]
#   BF16_CHECKPOINT  a full E2B with its towers and processor_config.json (`qatserve synth --preset e2b --format
#                    bf16`)
#   WORK_DIR         GGUF files, the image and per-run logs (default out/llamacpp in the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: bench/mtmd_side_by_side.sh BF16_CHECKPOINT [WORK_DIR]}
work=${2:-$root/out/llamacpp}
: "${LLAMACPP_DIR:?set LLAMACPP_DIR to a built llama.cpp checkout}"
: "${LLAMACPP_PY:?set LLAMACPP_PY to the python that runs its converter}"
threads=${THREADS:-2}
runs=${RUNS:-3}
rows=${ROWS:-0/1/280 0/0/280}
mmproj_type=${MMPROJ_TYPE:-bf16}
text_type=${TEXT_TYPE:-q8_0}
tokenizer_dir=${TOKENIZER_DIR:-$root/../shared/tokenizer/gemma4}
bench=${BENCH:-$root/build/bench/vision_tower_bench}
cli=$LLAMACPP_DIR/build/bin/llama-mtmd-cli
for tool in "$cli" "$bench"; do
  [ -x "$tool" ] || { echo "missing $tool" >&2; exit 1; }
done
[ -e "$src/processor_config.json" ] || {
  echo "$src has no processor_config.json (the converter reads image_mean/image_std from it): synth it again" >&2
  exit 1
}
mkdir -p "$work"
text_gguf=$work/e2b-$text_type.gguf
mmproj_gguf=$work/mmproj-e2b-$mmproj_type.gguf
image=$work/random-960x672.ppm

# The converter reads a directory: the checkpoint's files, linked, plus a tokenizer when the checkpoint has none.
stage_source() {
  local stage=$work/src
  rm -rf "$stage" && mkdir -p "$stage"
  ln -s "$src"/* "$stage"/
  [ -e "$stage/tokenizer.json" ] || ln -s "$tokenizer_dir/tokenizer.reconstructed.json" "$stage/tokenizer.json"
  # The converter's transformers (4.57) rejects the tokenizer_config.json newer transformers re-save.
  [ -e "$stage/tokenizer_config.json" ] || cat > "$stage/tokenizer_config.json" <<'JSON'
{"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
 "unk_token": "<unk>", "add_bos_token": true, "add_eos_token": false, "padding_side": "left"}
JSON
  echo "$stage"
}

convert() {  # convert OUT [converter options...]
  local out=$1
  shift
  [ -s "$out" ] && return
  echo "converting $src -> $out (llama.cpp's convert_hf_to_gguf.py $*)" >&2
  "$LLAMACPP_PY" "$LLAMACPP_DIR/convert_hf_to_gguf.py" "$(stage_source)" "$@" --outfile "$out.tmp" >&2
  mv "$out.tmp" "$out"
}
convert "$text_gguf" --outtype "$text_type"
convert "$mmproj_gguf" --mmproj --outtype "$mmproj_type"

# Random pixels, binary PPM (stb_image reads it; no imaging library needed).
[ -s "$image" ] || "$LLAMACPP_PY" -c "
import os, sys
with open(sys.argv[1], 'wb') as f:
    f.write(b'P6\n960 672\n255\n' + os.urandom(960 * 672 * 3))" "$image"

ticks_per_s=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# One llama.cpp encode: prints "wall_ms cpu_s soft_tokens".
llamacpp_encode() {
  local log=$1
  "$cli" -m "$text_gguf" --mmproj "$mmproj_gguf" --image "$image" -p "Describe the image." -n 1 -t "$threads" \
    --no-warmup --chat-template gemma -v > "$log" 2>&1 &
  local pid=$! start="" end="" now
  while kill -0 "$pid" 2>/dev/null; do
    now=$(cpu_ticks "$pid" 2>/dev/null) || break
    if [ -z "$start" ] && grep -q "encoding mtmd batch" "$log"; then start=$now; fi
    if [ -n "$start" ] && grep -q "mtmd batch encoding done in" "$log"; then end=$now; break; fi
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ -n "$end" ] || { echo "llama-mtmd-cli did not encode the image; its log: $log" >&2; tail -20 "$log" >&2; exit 1; }
  local wall_ms tokens
  wall_ms=$(sed -n 's/.*mtmd batch encoding done in \([0-9]*\) ms.*/\1/p' "$log" | head -1)
  # The image's soft tokens: its token grid, nx x ny (-v's debug lines).
  tokens=$(sed -n 's/.*image_tokens->n\([xy]\) = \([0-9]*\).*/\2/p' "$log" | head -2 | paste -sd'*' | bc)
  echo "$wall_ms $(awk -v t=$((end - start)) -v hz="$ticks_per_s" 'BEGIN {printf "%.1f", t / hz}') ${tokens:-?}"
}

# One qatserve encode per row: prints "wall_ms cpu_s soft_tokens" per row.
qatserve_encode() {
  local row=$1 json=$2
  "$bench" --benchmark_filter="BM_VisionTowerEncode/$row/" --benchmark_format=json > "$json"
  "$LLAMACPP_PY" -c "
import json, sys
b = json.load(open(sys.argv[1]))['benchmarks'][0]
print(f\"{b['real_time']:.0f} {b['cpu_s_all_threads']:.1f} {b['soft_tokens']:.0f}\")" "$json"
}

results=$work/mtmd_side_by_side.txt
: > "$results"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for i in $(seq 1 "$runs"); do
  echo "run $i/$runs: llama.cpp mtmd ($mmproj_type mmproj)" >&2
  # (An assignment, so that a failed encode stops the script.)
  r=$(llamacpp_encode "$work/mtmd_run$i.log")
  echo "llama.cpp_$mmproj_type $r $(cut -d' ' -f1 /proc/loadavg)" >> "$results"
  for row in $rows; do
    echo "run $i/$runs: qatserve vision_tower_bench $row" >&2
    r=$(qatserve_encode "$row" "$work/qatserve_${row//\//_}_run$i.json")
    echo "qatserve_$row $r $(cut -d' ' -f1 /proc/loadavg)" >> "$results"
  done
done

# Medians per side; patches = soft tokens x 9 (3 x 3 pooling).
"$LLAMACPP_PY" - "$results" "$threads" <<'EOF'
import statistics, sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    name, wall_ms, cpu_s, tokens, load = line.split()
    runs[name].append((float(wall_ms) / 1000, float(cpu_s), tokens, load))
print(f"threads {sys.argv[2]}; one image, medians of {max(len(r) for r in runs.values())} alternating runs")
print()
print("| encoder | soft tokens | wall s | CPU s, all threads | soft tokens / wall s | patches / CPU s | load (1 min) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, r in runs.items():
    wall, cpu = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
    tokens = r[0][2]
    rate = f"{int(tokens) / wall:.2f}" if tokens.isdigit() else "?"
    per_patch = f"{int(tokens) * 9 / cpu:.1f}" if tokens.isdigit() and cpu > 0 else "?"
    print(f"| {name} | {tokens} | {wall:.1f} | {cpu:.1f} | {rate} | {per_patch} | {', '.join(x[3] for x in r)} |")
print()
for name, r in runs.items():
    print(f"{name}: wall s {[round(x[0], 1) for x in r]}, CPU s {[x[1] for x in r]}")
EOF
