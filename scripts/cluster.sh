#!/usr/bin/env bash
# cluster.sh --model DIR --replicas N --port P [options] [-- SERVE_OPTIONS...]
#
# N `qatserve serve` replicas on local ports behind nginx on port P, in the foreground. Ctrl-C or SIGTERM stops them
# all (the replicas drain their requests, nginx finishes its open streams) and exits 0.
#   --model DIR          the checkpoint every replica serves
#   --replicas N         how many replicas (default 2)
#   --port P             nginx's port (default 8000)
#   --host ADDR          nginx's address (default 127.0.0.1; the replicas always listen on 127.0.0.1)
#   --replica-port Q     the first replica's port (default P+1; replica i listens on Q+i)
#   --run-dir DIR        where the nginx config, logs and replicas.tsv go (default: a new folder under /tmp)
#   -- SERVE_OPTIONS     passed to every `qatserve serve` (e.g. --served-model-name, --drain-timeout, --api-key-file)
# The binary is $QATSERVE_BIN when set, else build/qatserve (scripts/build.sh). The cores are those this script may
# use (`taskset -c 0-7 cluster.sh ...` gives it 0-7). When there are at least two cores per replica, each replica is
# pinned (taskset) to its own cores and given --threads = its core count; otherwise the replicas share the cores,
# --threads = cores / N (at least 1). A --threads in SERVE_OPTIONS wins.
# The run folder holds nginx.conf (deploy/nginx/qatserve.conf.template, rendered), replica-I.log, nginx's
# access.log and error.log, replicas.tsv (name, address, pid, cores: one line per replica) and
# qatserve-targets.json (the replicas for deploy/prometheus/prometheus.yml's file_sd_configs, labelled `replica`).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# The comment block above, without its "# ".
help_text() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
usage() { help_text >&2; exit 2; }
die() { echo "cluster: $*" >&2; exit 1; }

model="" replicas=2 port=8000 host=127.0.0.1 replica_port="" run_dir="" serve_args=()
while (($#)); do
  case "$1" in
    --model) model="${2:-}"; shift 2 || usage ;;
    --replicas) replicas="${2:-}"; shift 2 || usage ;;
    --port) port="${2:-}"; shift 2 || usage ;;
    --host) host="${2:-}"; shift 2 || usage ;;
    --replica-port) replica_port="${2:-}"; shift 2 || usage ;;
    --run-dir) run_dir="${2:-}"; shift 2 || usage ;;
    --) shift; serve_args=("$@"); break ;;
    -h|--help) help_text; exit 0 ;;
    *) echo "cluster: unknown option '$1'" >&2; usage ;;
  esac
done
[[ -n "$model" ]] || { echo "cluster: --model DIR is required" >&2; usage; }
[[ -d "$model" ]] || die "--model '$model' is not a directory"
[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || die "--replicas must be a positive integer, got '$replicas'"
[[ "$port" =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) || die "--port must be a port number, got '$port'"
replica_port="${replica_port:-$((port + 1))}"
[[ "$replica_port" =~ ^[0-9]+$ ]] && ((replica_port >= 1 && replica_port + replicas - 1 <= 65535)) ||
  die "--replica-port: ports $replica_port..$((replica_port + replicas - 1)) are not all port numbers"
((port < replica_port || port >= replica_port + replicas)) ||
  die "--port $port is one of the replicas' ports ($replica_port..$((replica_port + replicas - 1)))"

qatserve="${QATSERVE_BIN:-$root/build/qatserve}"
[[ -x "$qatserve" ]] || die "no qatserve binary at '$qatserve' (run scripts/build.sh, or set QATSERVE_BIN)"
# Debian puts nginx in /usr/sbin, which a normal user's PATH lacks.
nginx_bin="$(PATH="$PATH:/usr/sbin:/sbin" command -v nginx)" ||
  die "nginx is not installed (apt-get install nginx; scripts/install-deps.sh does)"

if [[ -z "$run_dir" ]]; then
  run_dir="$(mktemp -d /tmp/qatserve-cluster.XXXXXX)" || die "cannot create a run folder under /tmp"
fi
mkdir -p "$run_dir" || die "cannot create the run folder '$run_dir'"
run_dir="$(cd "$run_dir" && pwd)"
chmod 755 "$run_dir"  # when started as root, nginx's workers run as an unprivileged user and write temp files here

# The CPUs this process may use (cgroup cpuset, taskset), as a list of ids.
allowed_cpus() {
  local list id range
  list="$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)"
  for range in ${list//,/ }; do
    if [[ "$range" == *-* ]]; then
      for ((id = ${range%-*}; id <= ${range#*-}; id++)); do echo "$id"; done
    else
      echo "$range"
    fi
  done
}
mapfile -t cpus < <(allowed_cpus)
ncpu=${#cpus[@]}
((ncpu > 0)) || { cpus=(0); ncpu=1; }
pin=0
((ncpu >= 2 * replicas)) && pin=1
per_replica=$((ncpu / replicas))
((per_replica >= 1)) || per_replica=1
user_threads=0
for a in "${serve_args[@]}"; do [[ "$a" == --threads || "$a" == --threads=* ]] && user_threads=1; done

pids=() names=() addrs=() nginx_pid=""
stopping=0

stop_all() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done   # replicas drain (up to their --drain-timeout)
  [[ -n "$nginx_pid" ]] && kill -QUIT "$nginx_pid" 2>/dev/null   # graceful: nginx finishes its open streams
  for p in "${pids[@]}" $nginx_pid; do wait "$p" 2>/dev/null; done
}
on_signal() {
  ((stopping)) && return
  stopping=1
  echo "cluster: stopping ${#pids[@]} replicas and nginx (the replicas drain their requests)" >&2
  stop_all
  echo "cluster: stopped" >&2
  exit 0
}
trap on_signal INT TERM

# The replica answers GET /health with 200 (loaded); 0 when it does, 1 when not yet. Bash's /dev/tcp: no curl needed.
healthy() {
  local status=""
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
  IFS= read -r -t 5 status <&3 2>/dev/null || true  # a replica that exits resets the connection
  exec 3<&-
  [[ "$status" == "HTTP/1."?" 200"* ]]
}

: >"$run_dir/replicas.tsv"
for ((i = 0; i < replicas; i++)); do
  name="replica-$i" rport=$((replica_port + i))
  cmd=("$qatserve" serve --model "$model" --host 127.0.0.1 --port "$rport")
  ((user_threads)) || cmd+=(--threads "$per_replica")
  cores="shared"
  if ((pin)); then
    cores="$(IFS=,; echo "${cpus[*]:i*per_replica:per_replica}")"
    cmd=(taskset -c "$cores" "${cmd[@]}")
  fi
  # Its own session: a Ctrl-C in the terminal reaches this script only, which then stops everything in order.
  setsid "${cmd[@]}" "${serve_args[@]}" >"$run_dir/$name.log" 2>&1 &
  pids+=($!) names+=("$name") addrs+=("127.0.0.1:$rport")
  printf '%s\t127.0.0.1:%s\t%s\t%s\n' "$name" "$rport" "$!" "$cores" >>"$run_dir/replicas.tsv"
  echo "cluster: $name on 127.0.0.1:$rport (pid $!, cores: $cores), log $run_dir/$name.log" >&2
done

# nginx takes the port only once every replica is loaded.
for ((i = 0; i < replicas; i++)); do
  until healthy $((replica_port + i)); do
    if ! kill -0 "${pids[i]}" 2>/dev/null; then
      wait "${pids[i]}"; rc=$?
      echo "cluster: ${names[i]} exited with status $rc while loading; its log:" >&2
      tail -n 20 "$run_dir/${names[i]}.log" >&2
      stopping=1; stop_all; exit 1
    fi
    sleep 0.2
  done
done

upstreams=() targets=()
for ((i = 0; i < replicas; i++)); do
  upstreams+=("${names[i]}=${addrs[i]}")
  targets+=("{\"targets\": [\"${addrs[i]}\"], \"labels\": {\"replica\": \"${names[i]}\"}}")
done
(IFS=,; echo "[${targets[*]}]") >"$run_dir/qatserve-targets.json"
"$root/deploy/nginx/render.sh" --listen "$host:$port" --run-dir "$run_dir" "${upstreams[@]}" >"$run_dir/nginx.conf" ||
  { stopping=1; stop_all; die "cannot render the nginx configuration"; }
setsid "$nginx_bin" -p "$run_dir" -c "$run_dir/nginx.conf" -e "$run_dir/error.log" -g 'daemon off;' &
nginx_pid=$!
echo "cluster: nginx (pid $nginx_pid) on http://$host:$port/ in front of $replicas replicas; run folder $run_dir" >&2

# Runs until a signal. A replica that dies is reported and left out by nginx (passive health); if nginx dies, the
# cluster has no front door: everything stops, exit 1.
while true; do
  wait -n -p exited "${pids[@]}" "$nginx_pid"
  rc=$?
  [[ -n "${exited:-}" ]] || continue  # interrupted by a signal the trap did not end on
  if [[ "$exited" == "$nginx_pid" ]]; then
    echo "cluster: nginx exited with status $rc (see $run_dir/error.log); stopping the replicas" >&2
    nginx_pid=""; stopping=1; stop_all; exit 1
  fi
  for ((i = 0; i < ${#pids[@]}; i++)); do
    if [[ "${pids[i]}" == "$exited" ]]; then
      echo "cluster: ${names[i]} (pid $exited) exited with status $rc; nginx sends its work to the others" >&2
      pids=("${pids[@]:0:i}" "${pids[@]:i+1}")
      names=("${names[@]:0:i}" "${names[@]:i+1}")
      break
    fi
  done
  unset exited
done
