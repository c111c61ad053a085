#!/usr/bin/env bash
# run_multimodal_cli_check.sh QATSERVE_BINARY: images and audio through `qatserve logits/generate --messages` against
# transformers' goldens in the multimodal fixtures (check_multimodal_cli.py). Exits 77 (skipped) without the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_multimodal_cli_check.sh QATSERVE_BINARY}"
if [[ ! -x "$python" ]]; then
  echo "multimodal CLI check skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
fixtures="$here/../../tests/fixtures"
exec "$python" "$here/check_multimodal_cli.py" "$qatserve" "$fixtures/mm_e2b_like" "$fixtures/mm_moe_like"
