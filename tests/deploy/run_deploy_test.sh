#!/usr/bin/env bash
# run_deploy_test.sh QATSERVE_BINARY SCRIPT: one of the deploy tests in this folder with the pinned Python tools in
# .venv. Exit 77 (skipped) without the venv; the script itself skips when its tool (nginx, prometheus, ...) is absent.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_deploy_test.sh QATSERVE_BINARY SCRIPT}"
script="${2:?usage: run_deploy_test.sh QATSERVE_BINARY SCRIPT}"

if [[ ! -x "$python" ]]; then
  echo "deploy test skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
exec "$python" "$here/$script" "$qatserve"
