#!/usr/bin/env bash
# The main job: the OpenAI-compatible server on the bundled demo model. Installs the Debian packages, builds,
# repacks the committed QAT-trained tiny Gemma 4 (models/gemma4-tiny-qat/: a bf16 `-qat-q4_0-unquantized`-style
# export, 2.9 M parameters trained on Jane Austen's novels, see its README.md) to int4 W4A16 compressed-tensors,
# verifies the repack from disk (every group lossless), and serves the int4 checkpoint on
# http://127.0.0.1:${PORT:-8000} until Ctrl-C. A model this small writes Austen-flavoured English, not sense.
# DEMO_DIR: where the int4 repack is written (default out/demo in the checkout).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
bin="$root/build/qatserve"
model="$root/models/gemma4-tiny-qat"
demo="${DEMO_DIR:-$root/out/demo}"
mkdir -p "$demo"
rm -rf "$demo/gemma4-tiny-qat-w4a16"
"$bin" repack "$model" "$demo/gemma4-tiny-qat-w4a16"
"$bin" verify "$model" "$demo/gemma4-tiny-qat-w4a16"
echo "open http://127.0.0.1:${PORT:-8000}/ in a browser to chat, or"
echo "try: curl -s localhost:${PORT:-8000}/v1/chat/completions -H 'content-type: application/json' \\"
echo "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Who wrote Emma?\"}],\"max_tokens\":48,\"temperature\":0}'"
exec "$bin" serve --model "$demo/gemma4-tiny-qat-w4a16" --host 127.0.0.1 --port "${PORT:-8000}"
