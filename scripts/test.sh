#!/usr/bin/env bash
# Sets up everything on a fresh Debian 12 machine and runs every test: Debian packages, the pinned Python
# reference tools (.venv), the build, then ctest (unit tests, bad-input tests, external checks against
# compressed-tensors and transformers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/make-venv.sh"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)"
