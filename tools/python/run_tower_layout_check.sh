#!/usr/bin/env bash
# run_tower_layout_check.sh QATSERVE_BINARY WORK_DIR: the full-size towers synth writes (E2B vision + audio, 26B-A4B
# vision; ~2 GB written and removed) against transformers' modules built from the same configs
# (check_tower_layout.py). Exits 77 (skipped) without the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_tower_layout_check.sh QATSERVE_BINARY WORK_DIR}"
work="${2:?usage: run_tower_layout_check.sh QATSERVE_BINARY WORK_DIR}"
if [[ ! -x "$python" ]]; then
  echo "tower layout check skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
mkdir -p "$work"
exec "$python" "$here/check_tower_layout.py" "$qatserve" "$work"
