#!/usr/bin/env bash
# run_constrained_outputs_test.sh QATSERVE CONSTRAIN_WALK: the grammar engine's property test against the jsonschema
# package (tools/python/check_constrained_outputs.py): random walks on the demo tokenizer and, when ../shared has it,
# the real Gemma 4 vocabulary; then end to end through `qatserve generate --json-schema` on a random-weight
# synthetic model, and schemas without unbounded strings or arrays, whose every output must end within the length
# derived from the schema, properties in the declared order (a weak model's output must neither run on nor reorder
# them). Exit 77 (skipped) without the venv or its jsonschema.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
python="$root/.venv/bin/python"
qatserve="${1:?usage: run_constrained_outputs_test.sh QATSERVE CONSTRAIN_WALK}"
walk="${2:?usage: run_constrained_outputs_test.sh QATSERVE CONSTRAIN_WALK}"
check="$root/tools/python/check_constrained_outputs.py"

if [[ ! -x "$python" ]] || ! "$python" -c "import jsonschema" 2>/dev/null; then
  echo "constrained outputs test skipped: no .venv with jsonschema (run scripts/make-venv.sh)"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$qatserve" synth --preset e2b-tiny --tokenizer "$root/configs/demo-tokenizer" --out "$tmp/model" --quiet
"$python" "$check" "$walk" "$root/configs/demo-tokenizer/tokenizer.json" --schemas 300 --seeds 4 \
  --e2e-qatserve "$qatserve" --e2e-model "$tmp/model" --e2e-schemas 20 --bounded-schemas 12 --bounded-seeds 6
gemma="$root/../shared/tokenizer/gemma4/tokenizer.reconstructed.json"
if [[ -f "$gemma" ]]; then
  "$python" "$check" "$walk" "$gemma" --schemas 8 --seeds 2 --seed 7
else
  echo "real Gemma 4 vocabulary part skipped: $gemma is absent"
fi
