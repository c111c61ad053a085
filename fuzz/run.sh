#!/usr/bin/env bash
# Build the libFuzzer targets with clang (ASan + UBSan + libFuzzer) and fuzz one of them for SECONDS on
# two cores. Corpus, crash artifacts and logs go under fuzz/corpus-run/ (gitignored).
#
# usage: fuzz/run.sh SECONDS [safetensors_fuzz|model_config_fuzz|tool_calls_fuzz|json_schema_fuzz|http_request_fuzz|image_decode_fuzz|audio_decode_fuzz]
# A crash reproduces with: build-fuzz/fuzz/<target> fuzz/corpus-run/artifacts/<target>/crash-...
set -euo pipefail
seconds=${1:?usage: fuzz/run.sh SECONDS [safetensors_fuzz|model_config_fuzz|tool_calls_fuzz|json_schema_fuzz|http_request_fuzz|image_decode_fuzz|audio_decode_fuzz]}
target=${2:-safetensors_fuzz}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
run=$root/fuzz/corpus-run

if [[ ! -f $build/build.ninja ]]; then
  CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DQATSERVE_FUZZ=ON -DQATSERVE_TESTS=OFF
fi
case $target in safetensors_fuzz | model_config_fuzz | tool_calls_fuzz | json_schema_fuzz | http_request_fuzz | image_decode_fuzz | audio_decode_fuzz) ;; *) echo "unknown target $target" >&2; exit 2 ;; esac
ninja -C "$build" "$target"

corpus=$run/$target
artifacts=$run/artifacts/$target
mkdir -p "$corpus" "$artifacts" "$run/seeds" "$run/seeds/tool_calls_fuzz"
python3 "$root/fuzz/make_seed_corpus.py" "$run/seeds/safetensors_fuzz" "$run/seeds/model_config_fuzz" \
  "$run/seeds/json_schema_fuzz"
python3 "$root/fuzz/make_http_seeds.py" "$run/seeds/http_request_fuzz"
# Image seeds: the committed fixtures (every format and mode, and the rejected ones).
mkdir -p "$run/seeds/image_decode_fuzz"
cp "$root"/tests/data/images/*.* "$root"/tests/data/images/bad/* "$run/seeds/image_decode_fuzz/"
# Audio seeds: the small encoded clips of the decoding tests (every container decode_audio reads).
mkdir -p "$run/seeds/audio_decode_fuzz" && cp "$root"/tests/data/audio/* "$run/seeds/audio_decode_fuzz/"

dict=$root/fuzz/${target%_fuzz}.dict
suppressions=$root/fuzz/${target%_fuzz}.lsan-suppressions
[[ -f $suppressions ]] && export LSAN_OPTIONS="suppressions=$suppressions${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

cd "$run"  # libFuzzer writes its per-worker logs into the current directory
echo "fuzzing $target for $seconds s on 2 workers; corpus $corpus"
start=$(date +%s)
status=0
"$build/fuzz/$target" -dict="$dict" -fork=2 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
  -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$artifacts/" "$corpus" "$run/seeds/$target" || status=$?
# Fork mode does not count seeds that crash while it loads the corpus, so count the artifacts instead.
found=$(find "$artifacts" -type f | wc -l)
echo "fuzz/run.sh: $target ran $(( $(date +%s) - start )) s, exit $status, corpus $(find "$corpus" -type f | wc -l) inputs," \
  "$found artifacts in $artifacts"
find "$artifacts" -type f -printf '  %p\n'
[[ $status -eq 0 && $found -eq 0 ]]
