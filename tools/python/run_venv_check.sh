#!/usr/bin/env bash
# run_venv_check.sh [--needs MODULE,...] SCRIPT [ARG...]: one external check (tools/python/SCRIPT, which compares
# qatserve with third-party code) in the reference venv (scripts/make-venv.sh), run from this folder. Exits 77, which
# ctest reports as skipped (never as passed), when the venv or a module SCRIPT needs (transformers, and --needs) is
# missing.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
usage="usage: run_venv_check.sh [--needs MODULE,...] SCRIPT [ARG...]"
needs=transformers
if [[ ${1:-} == --needs ]]; then
  needs+=",${2:?$usage}"
  shift 2
fi
script="${1:?$usage}"
shift
if [[ ! -x "$python" ]] || ! "$python" -c "import $needs" 2>/dev/null; then
  echo "$script skipped: no .venv with ${needs//,/, } (run scripts/make-venv.sh)"
  exit 77
fi
cd "$here" && exec "$python" "$script" "$@"
