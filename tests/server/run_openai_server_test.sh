#!/usr/bin/env bash
# run_openai_server_test.sh QATSERVE_BINARY [SCRIPT]: an end-to-end test of `qatserve serve` (SCRIPT in this folder,
# default test_openai_server.py) with the pinned Python tools in .venv (the official openai client). Exit 77
# (skipped) without the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_openai_server_test.sh QATSERVE_BINARY}"

if [[ ! -x "$python" ]]; then
  echo "server test skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
exec "$python" "$here/${2:-test_openai_server.py}" "$qatserve"
