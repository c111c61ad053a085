#!/usr/bin/env bash
# Repack and verify throughput on a full-size synthetic E2B (about 9 GB of bf16), beside the disk's own speed.
# Usage: [QATSERVE_BIN=path] [TMPFS_DIR=dir] bench/repack_bench.sh [WORKDIR]
# Needs ~16 GB free in WORKDIR (default out/bench in the repository) and, for the tmpfs row, ~7 GB in TMPFS_DIR (a
# memory-backed folder; default the system's /dev/shm).
# Prints one table; numbers go into BENCHMARKS.md. Timings are noisy here: compare rows of one run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${QATSERVE_BIN:-$root/build/qatserve}  # QATSERVE_BIN=... to time another build (A/B)
work=${1:-$root/out/bench}
tmpfs=${TMPFS_DIR:-/dev/shm}
mkdir -p "$work"
cd "$work"

seconds() { /usr/bin/time -f "%e %M %U %S" "$@" 2>&1 >/dev/null | tail -1; }  # wall s, peak RSS KiB, user s, sys s
row() { printf "| %-34s | %10s | %8s | %10s | %12s |\n" "$@"; }
cpu() { awk "BEGIN{printf \"%.1f\", $1 + $2}"; }  # CPU seconds: what a loaded machine cannot inflate as much as wall time

[ -d e2b-bf16 ] || "$bin" synth --preset e2b --out e2b-bf16 --quiet >/dev/null
src_bytes=$(du -sb e2b-bf16 | cut -f1)
gb=$(awk "BEGIN{print $src_bytes/1e9}")

dd if=/dev/zero of=dd.tmp bs=16M count=128 conv=fdatasync 2>dd.log; disk_w=$(grep -o '[0-9.]* [MG]B/s' dd.log)
dd if=dd.tmp of=/dev/null bs=16M iflag=direct 2>dd.log; disk_r=$(grep -o '[0-9.]* [MG]B/s' dd.log); rm -f dd.tmp dd.log

cat e2b-bf16/*.safetensors >/dev/null  # source in the page cache for every row alike
load=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf e2b-w4 "$tmpfs/qatserve-e2b-w4"
# tmpfs first and removed at once: source, output and tmpfs together would not fit in 24 GiB of RAM.
read -r t_shm rss_shm u_shm s_shm < <(seconds "$bin" repack e2b-bf16 "$tmpfs/qatserve-e2b-w4" --quiet)
rm -rf "$tmpfs/qatserve-e2b-w4"
read -r t_disk rss_disk u_disk s_disk < <(seconds "$bin" repack e2b-bf16 e2b-w4 --quiet)
read -r t_verify rss_verify u_verify s_verify < <(seconds "$bin" verify e2b-bf16 e2b-w4 --quiet)

echo "source: synthetic E2B bf16, $(awk "BEGIN{printf \"%.2f\", $gb}") GB; $(nproc) cores; disk write $disk_w (fdatasync), read $disk_r (O_DIRECT)"
echo "load average before: $load"
row "what" "seconds" "GB/s" "peak RSS" "CPU seconds"
row "---" "---" "---" "---" "---"
row "repack to disk" "$t_disk" "$(awk "BEGIN{printf \"%.2f\", $gb/$t_disk}")" "$((rss_disk/1024)) MiB" "$(cpu $u_disk $s_disk)"
row "repack to tmpfs (compute bound)" "$t_shm" "$(awk "BEGIN{printf \"%.2f\", $gb/$t_shm}")" "$((rss_shm/1024)) MiB" "$(cpu $u_shm $s_shm)"
row "verify (re-reads both from disk)" "$t_verify" "$(awk "BEGIN{printf \"%.2f\", $gb/$t_verify}")" "$((rss_verify/1024)) MiB" "$(cpu $u_verify $s_verify)"
