#!/usr/bin/env bash
# run_eval_check.sh QATSERVE_BINARY: `qatserve eval` against transformers on the committed fixtures
# (check_eval_external.py). Exits 77 (skipped) without the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_eval_check.sh QATSERVE_BINARY}"
if [[ ! -x "$python" ]]; then
  echo "eval external check skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
fixtures="$here/../../tests/fixtures"
exec "$python" "$here/check_eval_external.py" "$qatserve" \
  "$fixtures/e2b_like" "$fixtures/moe_like" "$fixtures/hf_test_defaults" "$fixtures/qat_head"
