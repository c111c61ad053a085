#!/usr/bin/env bash
# The main job on the bundled demo model: build, make the small synthetic E2B-structured checkpoint (bf16 QAT
# export), repack it to int4 W4A16 compressed-tensors, verify the repack from disk, and print the report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
bin="$root/build/qatserve"
demo="$root/out/demo"
mkdir -p "$demo"
rm -rf "$demo/e2b-tiny-bf16" "$demo/e2b-tiny-w4a16"
"$bin" synth --preset e2b-tiny --format bf16 --out "$demo/e2b-tiny-bf16"
"$bin" repack "$demo/e2b-tiny-bf16" "$demo/e2b-tiny-w4a16"
"$bin" verify "$demo/e2b-tiny-bf16" "$demo/e2b-tiny-w4a16"
"$bin" inspect "$demo/e2b-tiny-w4a16"
echo "report: $demo/e2b-tiny-w4a16/repack_report.json"
cat "$demo/e2b-tiny-w4a16/repack_report.json"
