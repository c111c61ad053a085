#!/usr/bin/env bash
# run_chat_page_test.sh QATSERVE_BINARY SCREENSHOT_DIR: the chat page in headless Chromium (test_chat_page.py) with
# the pinned Python tools in .venv (selenium). Exit 77 (skipped) without the venv; the script itself skips without
# selenium, chromium or chromedriver.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
python="$here/../../.venv/bin/python"
qatserve="${1:?usage: run_chat_page_test.sh QATSERVE_BINARY SCREENSHOT_DIR}"
shots="${2:?usage: run_chat_page_test.sh QATSERVE_BINARY SCREENSHOT_DIR}"

if [[ ! -x "$python" ]]; then
  echo "chat page test skipped: no .venv (run scripts/make-venv.sh)"
  exit 77
fi
exec "$python" "$here/test_chat_page.py" "$qatserve" "$shots"
