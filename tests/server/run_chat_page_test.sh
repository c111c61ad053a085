#!/usr/bin/env bash
# run_chat_page_test.sh QATSERVE_BINARY SCREENSHOT_DIR [SCRIPT]: the chat page in headless Chromium (SCRIPT, default
# test_chat_page.py; test_chat_page_media.py for attachments) with the pinned Python tools in .venv (selenium).
# Exit 77 (skipped) without the venv; the script itself skips without selenium, chromium or chromedriver.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_chat_page_test.sh QATSERVE_BINARY SCREENSHOT_DIR [SCRIPT]}"
shots="${2:?usage: run_chat_page_test.sh QATSERVE_BINARY SCREENSHOT_DIR [SCRIPT]}"
script="${3:-test_chat_page.py}"

if [[ ! -x "$python" ]]; then
  echo "chat page test skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
exec "$python" "$here/$script" "$qatserve" "$shots"
