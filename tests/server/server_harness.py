"""The harness of the end-to-end server tests: a `qatserve serve` process on a free port with its log, HTTP and openai
clients on it, /metrics parsed by prometheus_client, server-sent-event frames, named checks that report as they end,
and waits that end on events (their deadlines only stop a hung test).

Importing it exits 77 (skipped) without the openai or prometheus_client package, so a suite that imports it is
skipped, not failed, in a venv that predates the pins.
"""
import http.client
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

SKIP = 77
ROOT = Path(__file__).resolve().parents[2]
DEMO_TOKENIZER = ROOT / "configs" / "demo-tokenizer"

try:
    import openai
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # the venv predates the pins
    print(f"server test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

HANG_STOP = 300  # seconds: the deadline of every wait, only there to end a hung test


def wait_for(condition, what, timeout=HANG_STOP):
    """Polls condition() until it returns something true and returns that; a hung server fails with `what`."""
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.time() < deadline, f"hung: {what} did not happen in {timeout} s"
        time.sleep(0.02)


def write_fifo(path, data, timeout=HANG_STOP):
    """Writes `data` to a named pipe once a reader has it open; fails (rather than blocking forever) if none comes."""
    def opened():
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no reader yet
                return None
            raise
    fd = wait_for(opened, f"the server opening {path}", timeout)
    try:
        os.set_blocking(fd, True)
        os.write(fd, data)
    finally:
        os.close(fd)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown cpu"


class Server:
    """One `qatserve serve` process; its stdout and stderr go to a log file."""

    def __init__(self, binary, model, workdir, name, *extra, env=None):
        self.port = free_port()
        self.log_path = Path(workdir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", str(model), "--port", str(self.port), *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.saw_loading = None  # the 503 body, if /health was caught while loading

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict with lower-case names, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, method, path, body=None, headers=None):
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data)

    def wait_ready(self, timeout=HANG_STOP):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                status, body = self.json("GET", "/health")
                if status == 200:
                    return body
                assert status == 503 and body["status"] == "loading", (status, body)
                self.saw_loading = body
            except (ConnectionRefusedError, ConnectionResetError):
                pass
            time.sleep(0.01)
        raise AssertionError(f"server not ready in {timeout} s:\n{self.log_text()}")

    def client(self, api_key="unused"):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key, max_retries=0, timeout=60)

    def metric_families(self):
        """/metrics as prometheus_client's parser reads it: {family name: Metric}."""
        status, headers, data = self.request("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4"), (status, headers)
        families = {}
        for f in text_string_to_metric_families(data.decode()):
            assert f.name not in families, f"family {f.name} written twice"
            families[f.name] = f
        return families

    def metrics(self):
        """Every sample of /metrics by name{label="value",...}, as parsed by prometheus_client."""
        return sample_values(self.metric_families())

    def log_has(self, text):
        return text in self.log_text()

    def stop(self, sig=signal.SIGTERM, timeout=HANG_STOP):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")


def sample_values(families):
    """Every sample of parsed metric families by name{label="value",...}."""
    values = {}
    for family in families.values():
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def sse_frames(data: bytes):
    """The payloads of a server-sent-event body: parsed JSON, or the string "[DONE]"."""
    text = data.decode("utf-8")  # strict: a split UTF-8 character would fail here
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    frames = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


def ids_from_logprobs(tokens):
    """Token ids from completion logprobs written with return_tokens_as_token_ids."""
    out = []
    for t in tokens:
        m = re.fullmatch(r"token_id:(\d+)", t)
        assert m, t
        out.append(int(m.group(1)))
    return out


class Checks:
    """Runs named checks one after another: each is reported as it ends, a failure does not stop the rest."""

    def __init__(self):
        self.passed, self.failed = [], []

    def check(self, name, fn):
        t0 = time.time()
        try:
            fn()
            self.passed.append(name)
            print(f"PASS {name} ({time.time() - t0:.2f} s)", flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported, the rest still run
            self.failed.append(name)
            print(f"FAIL {name} ({time.time() - t0:.2f} s)\n{traceback.format_exc()}", flush=True)

    def summary(self, what, server):
        """The closing line; on failure the end of the server's log. Returns the exit status."""
        print(f"\n{what}: {len(self.passed)} passed, {len(self.failed)} failed")
        if self.failed:
            print(f"server log ({server.log_path}):\n{server.log_text()[-4000:]}")
        return 1 if self.failed else 0


def run_suite_main(doc, suite_class, prefix):
    """main() of a suite that owns one server: `script.py QATSERVE`, a temporary work folder, the server killed
    whatever happens."""
    if len(sys.argv) != 2:
        print(doc)
        return 2
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
        suite = suite_class(sys.argv[1], workdir)
        try:
            return suite.run()
        finally:
            if suite.server:
                suite.server.kill()
