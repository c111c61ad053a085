#!/usr/bin/env bash
# ctest fuzz_smoke: configures and builds every libFuzzer target (clang, ASan + UBSan) into BUILD_DIR, then runs
# each one on its seed corpus (fuzz/make_seed_corpus.py) and past findings (fuzz/regressions/) and fuzzes it for
# SECONDS on one core. Fails on any crash, leak, timeout or sanitizer report, naming the input to reproduce it
# with (an input running 60 s is a hang: shorter limits flag a busy machine's pauses). Exit 77 (skipped) without
# clang++ or libFuzzer. Corpora grow in BUILD_DIR/corpus/ from run to run.
#
# usage: fuzz/smoke.sh BUILD_DIR [SECONDS]   (default 15)
set -euo pipefail
build=${1:?usage: fuzz/smoke.sh BUILD_DIR [SECONDS]}
seconds=${2:-15}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$build"
build=$(cd "$build" && pwd)

if ! command -v clang++ >/dev/null; then
  echo "fuzz_smoke skipped: clang++ is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
probe=$build/libfuzzer-probe
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer,address,undefined - -o "$probe" 2>/dev/null; then
  echo "fuzz_smoke skipped: clang++ cannot link libFuzzer with ASan and UBSan (libclang-rt-dev is missing)"
  exit 77
fi

launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
start=$(date +%s)
CXX=clang++ cmake -S "$root" -B "$build/cmake" -G Ninja -DQATSERVE_FUZZ=ON -DQATSERVE_TESTS=OFF "${launcher[@]}" \
  >/dev/null
cmake --build "$build/cmake" --target fuzzers
echo "fuzz_smoke: built the fuzz targets in $(( $(date +%s) - start )) s"

python3 "$root/fuzz/make_seed_corpus.py" "$build/seeds" >/dev/null
failed=()
for source in "$root"/fuzz/*_fuzz.cc; do
  target=$(basename "$source" .cc)
  corpus=$build/corpus/$target
  artifacts=$build/artifacts/$target
  mkdir -p "$corpus" "$artifacts"
  log=$build/$target.log
  regressions=()  # inputs that once crashed the target (fuzz/RECORD.md)
  [[ -d $root/fuzz/regressions/$target ]] && regressions=("$root/fuzz/regressions/$target")
  suppressions=$root/fuzz/${target%_fuzz}.lsan-suppressions  # leaks inside system libraries (each file says which)
  lsan=""
  [[ -f $suppressions ]] && lsan="suppressions=$suppressions"
  if LSAN_OPTIONS="$lsan" "$build/cmake/fuzz/$target" -dict="$root/fuzz/${target%_fuzz}.dict" -max_total_time="$seconds" \
      -max_len=16384 -timeout=60 -rss_limit_mb=2048 -artifact_prefix="$artifacts/" "$corpus" "$build/seeds/$target" \
      "${regressions[@]}" >"$log" 2>&1; then
    echo "fuzz_smoke: $target ok: $(grep -E '^Done [0-9]+ runs' "$log" || tail -1 "$log")"
  else
    failed+=("$target")
    echo "fuzz_smoke: $target FAILED (log $log); last lines:"
    tail -30 "$log"
    echo "reproduce: $build/cmake/fuzz/$target $artifacts/<crash-file>"
  fi
done
[[ ${#failed[@]} -eq 0 ]] || { echo "fuzz_smoke: failed: ${failed[*]}"; exit 1; }
echo "fuzz_smoke: every target ran ${seconds} s without a finding"
