#!/usr/bin/env bash
# The main job: the OpenAI-compatible server on the bundled demo model. Installs the Debian packages, builds,
# makes the small synthetic E2B-structured checkpoint (bf16 QAT export, with the bundled 4096-entry Gemma-style
# tokenizer), repacks it to int4 W4A16 compressed-tensors, verifies the repack from disk, and serves the int4
# checkpoint on http://127.0.0.1:${PORT:-8000} until Ctrl-C. The weights are random: the text is nonsense.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
bin="$root/build/qatserve"
demo="$root/out/demo"
mkdir -p "$demo"
rm -rf "$demo/e2b-tiny-bf16" "$demo/e2b-tiny-w4a16"
"$bin" synth --preset e2b-tiny --format bf16 --tokenizer "$root/configs/demo-tokenizer" --out "$demo/e2b-tiny-bf16"
"$bin" repack "$demo/e2b-tiny-bf16" "$demo/e2b-tiny-w4a16"
"$bin" verify "$demo/e2b-tiny-bf16" "$demo/e2b-tiny-w4a16"
echo "open http://127.0.0.1:${PORT:-8000}/ in a browser to chat, or"
echo "try: curl -s localhost:${PORT:-8000}/v1/chat/completions -H 'content-type: application/json' \\"
echo "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}'"
exec "$bin" serve --model "$demo/e2b-tiny-w4a16" --host 127.0.0.1 --port "${PORT:-8000}"
