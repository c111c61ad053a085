#!/usr/bin/env bash
# run_external_checks.sh QATSERVE_BINARY: check `qatserve repack` against third-party code (compressed-tensors,
# safetensors, transformers) rather than our own C++ against itself. Synthesizes both tiny presets in bf16,
# repacks each, then runs the Python checks on each pair (transformers unpatched and patched, in separate
# processes), and the lossy `repack --grid ct-7.5` against compressed-tensors' own quantizer. Exits non-zero if
# any check fails, 77 (skipped) without the venv.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_external_checks.sh QATSERVE_BINARY}"

# The venv is optional (scripts/make-venv.sh downloads torch); without it these checks cannot run: exit 77, which
# ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
if [[ ! -x "$python" ]]; then
  echo "external checks skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0
for preset in e2b-tiny 26b-a4b-tiny; do  # dense + per-layer embeddings, and fused MoE experts
  src="$tmp/$preset" dst="$tmp/$preset-w4a16"
  echo "== $preset"
  if ! "$qatserve" synth --preset "$preset" --format bf16 --out "$src" --quiet ||
     ! "$qatserve" repack "$src" "$dst" --quiet; then
    echo "FAILED: qatserve synth/repack for $preset"; failed=1; continue
  fi
  "$python" "$here/check_repack_external.py" "$src" "$dst" || failed=1
  # Each in its own process: the unpatched load must see transformers exactly as a user gets it.
  "$python" "$here/check_transformers_load.py" --unpatched "$src" "$dst" || failed=1
  "$python" "$here/check_transformers_load.py" --patched "$src" "$dst" || failed=1
  # The lossy `--grid ct-7.5` must hold exactly what compressed-tensors' own amax/7.5 quantizer makes.
  if "$qatserve" repack "$src" "$dst-ct" --grid ct-7.5 --quiet >/dev/null; then
    "$python" "$here/check_ct_grid_external.py" "$src" "$dst-ct" || failed=1
  else
    echo "FAILED: qatserve repack --grid ct-7.5 for $preset"; failed=1
  fi
done
((failed)) && echo "external checks FAILED" || echo "external checks passed"
exit "$failed"
