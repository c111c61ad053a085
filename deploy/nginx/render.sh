#!/usr/bin/env bash
# render.sh --listen HOST:PORT --run-dir DIR NAME=HOST:PORT...: prints deploy/nginx/qatserve.conf.template filled
# in: nginx listening on HOST:PORT, keeping its pid, logs and temporary files in DIR (absolute), in front of the
# replicas given as NAME=HOST:PORT (the name goes into each response's X-Qatserve-Replica header).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
usage() { echo "usage: render.sh --listen HOST:PORT --run-dir DIR NAME=HOST:PORT..." >&2; exit 2; }

listen="" run_dir="" replicas=()
while (($#)); do
  case "$1" in
    --listen) listen="${2:-}"; shift 2 || usage ;;
    --run-dir) run_dir="${2:-}"; shift 2 || usage ;;
    -*) usage ;;
    *) replicas+=("$1"); shift ;;
  esac
done
[[ -n "$listen" && -n "$run_dir" && ${#replicas[@]} -gt 0 ]] || usage
[[ "$run_dir" == /* ]] || { echo "render.sh: --run-dir must be absolute, got '$run_dir'" >&2; exit 2; }

servers="" names=""
for r in "${replicas[@]}"; do
  name="${r%%=*}" addr="${r#*=}"
  if [[ "$name" == "$r" || ! "$name" =~ ^[A-Za-z0-9._-]+$ || ! "$addr" =~ ^[A-Za-z0-9.:_-]+:[0-9]+$ ]]; then
    echo "render.sh: replica '$r' is not NAME=HOST:PORT (NAME of letters, digits, . _ -)" >&2
    exit 2
  fi
  servers+="    server $addr max_fails=3 fail_timeout=5s;"$'\n'
  # the address as a regular expression matching the end of $upstream_addr (the last replica tried)
  names+="    \"~(^|, )${addr//./\\.}\$\" $name;"$'\n'
done

# values through the environment: awk -v would interpret the backslashes of the regular expressions
SERVERS="${servers%$'\n'}" NAMES="${names%$'\n'}" LISTEN="$listen" RUN_DIR="$run_dir" awk '
  /^@SERVERS@$/ { print ENVIRON["SERVERS"]; next }
  /^@REPLICA_NAMES@$/ { print ENVIRON["NAMES"]; next }
  { gsub(/@LISTEN@/, ENVIRON["LISTEN"]); gsub(/@RUN_DIR@/, ENVIRON["RUN_DIR"]); print }
' "$here/qatserve.conf.template"
