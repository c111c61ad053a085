#!/usr/bin/env bash
# run_multimodal_cli_check.sh QATSERVE_BINARY [FIXTURE...]: images and audio through `qatserve logits/generate
# --messages` against transformers' goldens in the multimodal fixtures (check_multimodal_cli.py; by default
# mm_e2b_like and mm_moe_like, else the named ones under tests/fixtures). Exits 77 (skipped) without the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_multimodal_cli_check.sh QATSERVE_BINARY [FIXTURE...]}"
shift
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(mm_e2b_like mm_moe_like)
if [[ ! -x "$python" ]]; then
  echo "multimodal CLI check skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
fixtures="$here/../../tests/fixtures"
exec "$python" "$here/check_multimodal_cli.py" "$qatserve" "${names[@]/#/$fixtures/}"
