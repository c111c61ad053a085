#!/usr/bin/env bash
# run_trained_assistant_check.sh QATSERVE_BINARY: qatserve's drafting chain of the trained assistant
# (models/gemma4-tiny-qat-assistant) against transformers' (check_trained_assistant.py). Exits 77 (skipped) without
# the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_trained_assistant_check.sh QATSERVE_BINARY}"
if [[ ! -x "$python" ]]; then
  echo "trained assistant external check skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
cd "$here" && exec "$python" "$here/check_trained_assistant.py" "$qatserve"
