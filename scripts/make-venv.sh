#!/usr/bin/env bash
# Creates .venv with the pinned Python reference tools (transformers, compressed-tensors, tokenizers, ...).
# Idempotent: does nothing when the venv already matches requirements.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
req="$root/tools/python/requirements.txt"
stamp="$venv/.requirements.sha256"

want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "make-venv: $venv is up to date"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# torch from PyPI pulls CUDA wheels; the CPU build is all the reference tools need, but only PyPI is reachable.
"$venv/bin/pip" install -q -r "$req"
echo "$want" > "$stamp"
echo "make-venv: ready at $venv"
