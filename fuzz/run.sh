#!/usr/bin/env bash
# Build the libFuzzer targets with clang (ASan + UBSan + libFuzzer) and fuzz one of them for SECONDS on
# two cores (FUZZ_WORKERS=1: one). Corpus, crash artifacts and logs go under fuzz/corpus-run/ (gitignored).
# Record each run in fuzz/RECORD.md.
#
# usage: fuzz/run.sh SECONDS TARGET   (TARGET: a fuzz/<TARGET>.cc, e.g. tokenizer_fuzz)
# A crash reproduces with: build-fuzz/fuzz/<target> fuzz/corpus-run/artifacts/<target>/crash-...
set -euo pipefail
targets=$(cd "$(dirname "$0")" && ls ./*_fuzz.cc | sed 's|./||; s|\.cc||' | tr '\n' ' ')
usage="usage: fuzz/run.sh SECONDS TARGET (one of: $targets)"
seconds=${1:?$usage}
target=${2:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
run=$root/fuzz/corpus-run
[[ -f $root/fuzz/$target.cc ]] || { echo "unknown target $target; $usage" >&2; exit 2; }

if [[ ! -f $build/build.ninja ]]; then
  CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DQATSERVE_FUZZ=ON -DQATSERVE_TESTS=OFF
fi
ninja -C "$build" "$target"

corpus=$run/$target
artifacts=$run/artifacts/$target
mkdir -p "$corpus" "$artifacts"
python3 "$root/fuzz/make_seed_corpus.py" "$run/seeds" >/dev/null
dict=$root/fuzz/${target%_fuzz}.dict
# Leaks inside system libraries that no code of ours can free (each file says which).
suppressions=$root/fuzz/${target%_fuzz}.lsan-suppressions
[[ -f $suppressions ]] && export LSAN_OPTIONS="suppressions=$suppressions${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
regressions=()  # inputs that once crashed the target (fuzz/RECORD.md)
[[ -d $root/fuzz/regressions/$target ]] && regressions=("$root/fuzz/regressions/$target")

cd "$run"  # libFuzzer writes its per-worker logs into the current directory
echo "fuzzing $target for $seconds s on ${FUZZ_WORKERS:-2} workers; corpus $corpus"
start=$(date +%s)
status=0
"$build/fuzz/$target" -dict="$dict" -fork="${FUZZ_WORKERS:-2}" -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
  -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$artifacts/" "$corpus" "$run/seeds/$target" "${regressions[@]}" || status=$?
# Fork mode does not count seeds that crash while it loads the corpus, so count the artifacts instead.
found=$(find "$artifacts" -type f | wc -l)
echo "fuzz/run.sh: $target ran $(( $(date +%s) - start )) s, exit $status, corpus $(find "$corpus" -type f | wc -l) inputs," \
  "$found artifacts in $artifacts"
find "$artifacts" -type f -printf '  %p\n'
[[ $status -eq 0 && $found -eq 0 ]]
