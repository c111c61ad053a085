#!/usr/bin/env bash
# run_unified_image_check.sh MEDIA_PROBE: src/media's torch-exact resize and the 12B's image preprocessing against
# torchvision and transformers' Gemma4UnifiedImageProcessor (check_unified_image_external.py). Exit 77 (skipped)
# without the venv or torchvision.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
probe="${1:?usage: run_unified_image_check.sh MEDIA_PROBE}"
if [[ ! -x "$python" ]] || ! "$python" -c "import PIL, torchvision, transformers" 2>/dev/null; then
  echo "unified image external check skipped: no .venv with Pillow, torchvision and transformers (scripts/make-venv.sh)"
  exit 77
fi
exec "$python" "$here/check_unified_image_external.py" "$probe"
