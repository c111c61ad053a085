"""What the deploy tests share: a `scripts/cluster.sh` run (replicas behind nginx) and raw HTTP through it.

The server tests' helpers (Checks, wait_for, free_port, sample_values) come from tests/server/server_harness.py.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "server"))
from server_harness import HANG_STOP, Checks, free_port, sample_values, wait_for  # noqa: E402,F401
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

SKIP = 77
DEMO_TOKENIZER = ROOT / "configs" / "demo-tokenizer"
CLUSTER_SH = ROOT / "scripts" / "cluster.sh"


def skip_unless(tool, what):
    """Exits 77 (skipped) when `tool` is not on PATH (or in /usr/sbin, where Debian puts nginx)."""
    if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        print(f"{what} skipped: {tool} is not installed (scripts/install-deps.sh)")
        sys.exit(SKIP)


def synth_model(binary, workdir, max_position_embeddings=None):
    """The tiny E2B checkpoint with the demo tokenizer (loads in well under a second). With max_position_embeddings,
    the same model with that context instead of its 4096 positions (built from the preset's config.json): a stream of
    tens of thousands of tokens, minutes of generation where 4096 tokens take about a second."""
    if not (DEMO_TOKENIZER / "tokenizer.json").exists():
        print(f"skipped: {DEMO_TOKENIZER}/tokenizer.json is missing")
        sys.exit(SKIP)
    model = Path(workdir) / "tiny-e2b"
    synth = [binary, "synth", "--out", str(model), "--tokenizer", str(DEMO_TOKENIZER), "--quiet"]
    subprocess.run(synth + ["--preset", "e2b-tiny"], check=True, capture_output=True)
    if max_position_embeddings:
        config = json.loads((model / "config.json").read_text())
        config["text_config"]["max_position_embeddings"] = max_position_embeddings
        config_path = Path(workdir) / "tiny-e2b-long.json"
        config_path.write_text(json.dumps(config))
        model = Path(workdir) / "tiny-e2b-long"
        subprocess.run([binary, "synth", "--out", str(model), "--tokenizer", str(DEMO_TOKENIZER), "--quiet",
                        "--config", str(config_path)], check=True, capture_output=True)
    return model


def free_port_run(n):
    """A port P such that P..P+n-1 are free on loopback (bound and released: good enough on a test machine)."""
    for _ in range(100):
        base = free_port()
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports")


class Replica:
    def __init__(self, name, addr, pid, cores):
        self.name, self.addr, self.pid, self.cores = name, addr, int(pid), cores
        self.port = int(addr.rsplit(":", 1)[1])

    def alive(self):
        try:
            os.kill(self.pid, 0)
            return Path(f"/proc/{self.pid}/stat").read_text().split()[2] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            return False


class Cluster:
    """`scripts/cluster.sh --model M --replicas N --port P --run-dir D -- SERVE_ARGS`, with QATSERVE_BIN = the binary
    under test, run under `wrapper` when given (e.g. taskset -c 0); ready when nginx answers /health with 200."""

    def __init__(self, binary, model, workdir, name, replicas=2, serve_args=(), wrapper=()):
        self.run_dir = Path(workdir) / name
        self.port = free_port_run(replicas + 1)
        self.log_path = Path(workdir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        env = dict(os.environ, QATSERVE_BIN=str(binary))
        self.proc = subprocess.Popen(
            [*wrapper, str(CLUSTER_SH), "--model", str(model), "--replicas", str(replicas), "--port", str(self.port),
             "--run-dir", str(self.run_dir), "--", *serve_args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.replicas = []
        wait_for(self._ready, "the cluster answering /health through nginx")
        lines = (self.run_dir / "replicas.tsv").read_text().splitlines()
        self.replicas = [Replica(*line.split("\t")) for line in lines]
        assert len(self.replicas) == replicas, lines

    def _ready(self):
        assert self.proc.poll() is None, f"cluster.sh exited with {self.proc.returncode}:\n{self.log_text()}"
        try:
            status, _, _ = self.request("GET", "/health", timeout=5)
            return status == 200
        except OSError:
            return False

    def replica(self, name):
        return next(r for r in self.replicas if r.name == name)

    def request(self, method, path, body=None, headers=None, timeout=60, port=None):
        """(status, headers with lower-case names, body bytes), through nginx unless `port` names a replica."""
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=timeout)
        try:
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def metrics(self, replica):
        """One replica's /metrics (read from it directly), parsed by prometheus_client: {name{labels}: value}."""
        status, _, data = self.request("GET", "/metrics", port=replica.port)
        assert status == 200, status
        return sample_values({f.name: f for f in text_string_to_metric_families(data.decode())})

    def in_flight(self, replica):
        """Requests the replica holds, by its own count: vllm:num_requests_running + vllm:num_requests_waiting."""
        return sum(v for k, v in self.metrics(replica).items()
                   if k.split("{")[0] in ("vllm:num_requests_running", "vllm:num_requests_waiting"))

    def access_log(self):
        return (self.run_dir / "access.log").read_text(errors="replace")

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        """Signals cluster.sh and returns its exit status (every replica and nginx stopped by then)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=HANG_STOP)
        finally:
            self.log.close()

    def kill(self):
        """Cleanup after a failure: cluster.sh, then anything it started that is still running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for r in self.replicas:
            if r.alive():
                os.kill(r.pid, signal.SIGKILL)
        pid_file = self.run_dir / "nginx.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if not self.log.closed:
            self.log.close()


class Stream:
    """One streaming completion through nginx, read as it comes: the replica that served it, its tokens, and how it
    ended: "done" (data: [DONE]), "cut" (the connection ended without it), "http NNN", or "closed" (close() was
    called: the client hung up). `tokens` counts the chunks that carried a token."""

    def __init__(self, port, body, headers=None):
        self.port, self.body, self.headers = port, dict(body, stream=True), headers or {}
        self.replica, self.tokens, self.end, self.finish_reason = None, 0, None, None
        self.sent_at = self.first_token_at = self.ended_at = None
        self.closing = False

    def close(self):
        """Hang up before reading the next line (a running stream brings one a token)."""
        self.closing = True

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HANG_STOP)
        end = "cut"
        try:
            self.sent_at = time.time()
            conn.request("POST", "/v1/completions", body=json.dumps(self.body).encode(),
                         headers={"Content-Type": "application/json", **self.headers})
            r = conn.getresponse()
            self.replica = r.getheader("X-Qatserve-Replica")
            if r.status != 200:
                r.read()
                end = f"http {r.status}"
                return self
            while True:
                if self.closing:
                    end = "closed"
                    break
                try:
                    line = r.readline()
                except (http.client.IncompleteRead, ConnectionError):
                    break
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                payload = line[len(b"data: "):].strip()
                if payload == b"[DONE]":
                    end = "done"
                    break
                choice = json.loads(payload)["choices"][0]
                if choice.get("finish_reason") is None:  # a token's chunk (its text may be held back: UTF-8)
                    self.tokens += 1
                    self.first_token_at = self.first_token_at or time.time()
                else:
                    self.finish_reason = choice["finish_reason"]
        except (ConnectionError, http.client.HTTPException) as e:
            end = f"error {type(e).__name__}"
        finally:
            self.ended_at = time.time()
            self.end = end  # last: None means still running
            conn.close()
        return self
