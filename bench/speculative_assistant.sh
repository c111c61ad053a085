#!/usr/bin/env bash
# speculative_assistant.sh [QATSERVE] [WORKDIR] [REPEAT]: speculative decoding on the full-size synthetic E2B (int4
# W4A16, text only) with its synthetic assistant drafter (`synth --preset e2b-assistant`), k = 1..4, then prompt
# lookup (ngram) on the same copy prompt, both through `qatserve bench --speculative` (docs/speculative.md: the rows, the
# measured round costs, and the acceptance projection). Random weights never agree with each other, so the
# assistant's acceptance here is about 0: what the run measures is the cost of a round (drafting k tokens, verifying
# k + 1 positions) against one plain step, from which the projection table gives the speedup at acceptance a.
# The checkpoints (about 7 GB) are written into WORKDIR (default out/specbench in the checkout) once and kept for reruns.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/qatserve}
work=${2:-$root/out/specbench}
repeat=${3:-3}
mkdir -p "$work"
[[ -f $work/e2b-w4a16/config.json ]] || "$bin" synth --preset e2b --format w4a16 --no-towers --out "$work/e2b-w4a16"
[[ -f $work/e2b-assistant-w4a16/config.json ]] ||
  "$bin" synth --preset e2b-assistant --format w4a16 --out "$work/e2b-assistant-w4a16"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" bench --model "$work/e2b-w4a16" --assistant "$work/e2b-assistant-w4a16" --num-speculative-tokens 1,2,3,4 \
  --decode-tokens 32 --repeat "$repeat" --json "$work/assistant.json"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" bench --model "$work/e2b-w4a16" --speculative ngram --num-speculative-tokens 4 --decode-tokens 32 \
  --repeat "$repeat" --json "$work/ngram.json"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
