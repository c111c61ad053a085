#!/usr/bin/env bash
# run_image_check.sh MEDIA_PROBE: src/media's image decoding, resize and Gemma 4 preprocessing against Pillow and
# transformers (check_image_external.py). Exit 77 (skipped) without the venv.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
probe="${1:?usage: run_image_check.sh MEDIA_PROBE}"
if [[ ! -x "$python" ]] || ! "$python" -c "import PIL, transformers" 2>/dev/null; then
  echo "image external check skipped: no .venv with Pillow and transformers (run scripts/make-venv.sh)"
  exit 77
fi
exec "$python" "$here/check_image_external.py" "$probe"
