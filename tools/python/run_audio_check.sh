#!/usr/bin/env bash
# run_audio_check.sh AUDIO_PROBE: qatserve's audio decoding and features against transformers
# (check_audio_external.py). Exits 77 (skipped) without the venv or its soundfile/soxr packages.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
probe="${1:?usage: run_audio_check.sh AUDIO_PROBE}"
if [[ ! -x "$python" ]] || ! "$python" -c "import soundfile, soxr, transformers" 2>/dev/null; then
  echo "audio external check skipped: no .venv with soundfile, soxr and transformers (run scripts/make-venv.sh)"
  exit 77
fi
cd "$here" && exec nice -n 10 "$python" check_audio_external.py "$probe"
