#!/usr/bin/env python3
"""The HTTP layer under many connections (`qatserve serve`, loopback): idle and slow clients cost no request.

usage: test_connections.py QATSERVE_BINARY

1. 1,500 connections that sent half a header, held open, plus 48 concurrent streaming clients: /health still
   answers, every stream runs to [DONE], and the idle connections are still open.
2. A client that closes its socket in the middle of a NON-streaming generation aborts it: the abort is counted
   and the engine stops long before max_tokens.
3. --header-timeout closes a client that never finishes its header (and an idle kept-alive connection);
   --body-timeout one that never finishes its body.
4. --max-connections: the connection past the limit gets a 503 with a JSON error and Connection: close, and the
   server serves again once connections close.
No check depends on the machine's speed: waits end on events, their deadlines only stop a hung test (the one
latency bound, /health answered at all within 10 s, is functional).
Exit status: 0 passed, 1 failed, 77 skipped (no demo tokenizer or no openai package, as test_openai_server.py).
"""
import concurrent.futures as futures
import http.client
import json
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from test_openai_server import DEMO_TOKENIZER, SKIP, Checks, Server, sse_frames, wait_for

IDLE_CONNECTIONS = 1500
STREAMS = 48
HEALTH_DEADLINE = 10  # seconds: /health must answer at all within this, under the load


def raise_fd_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def half_header(port):
    """A connection that sent part of a request header and then nothing."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nX-Slow: ")
    return s


def closed_by_server(s, timeout):
    """True when the server closes the socket (EOF or reset) within `timeout` seconds; the bytes it sent first are
    ignored."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def still_open(s):
    """Nothing received and no EOF: the server holds the connection."""
    s.setblocking(False)
    try:
        data = s.recv(1)
        return False if data == b"" else True
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def health_within(port, deadline):
    t0 = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        r.read()
    finally:
        conn.close()
    return time.time() - t0


def stream(port, i, max_tokens=32):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({
            "prompt": [2, 100 + i, 7], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        frames = sse_frames(r.read())
        assert frames[-1] == "[DONE]" and frames[-2]["choices"][0]["finish_reason"] == "length", frames[-2:]
        return sum(1 for f in frames[:-1] if f["choices"][0]["text"] or f["choices"][0]["finish_reason"] is None)
    finally:
        conn.close()


class Suite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary = binary
        self.workdir = Path(workdir)
        self.model = self.workdir / "tiny-e2b"

    def many_idle_and_streams(self):
        idle = [half_header(self.a.port) for _ in range(IDLE_CONNECTIONS)]
        try:
            wait_for(lambda: self.a.metrics()["qatserve_http_connections"] >= IDLE_CONNECTIONS,
                     "the server holding the idle connections")
            with futures.ThreadPoolExecutor(STREAMS) as pool:
                streams = [pool.submit(stream, self.a.port, i) for i in range(STREAMS)]
                # While the streams run (and after), with every idle connection held: /health answers.
                latencies = [health_within(self.a.port, HEALTH_DEADLINE) for _ in range(20)]
                frames = [s.result() for s in streams]
            latencies.append(health_within(self.a.port, HEALTH_DEADLINE))
            assert all(f >= 1 for f in frames), frames
            open_now = sum(still_open(s) for s in idle)
            assert open_now == IDLE_CONNECTIONS, f"only {open_now} of {IDLE_CONNECTIONS} idle connections held"
            latencies.sort()
            print(f"  {IDLE_CONNECTIONS} idle connections held, {STREAMS} streams to [DONE]; /health answered in "
                  f"{latencies[len(latencies) // 2] * 1000:.1f} ms (median), {latencies[-1] * 1000:.1f} ms (slowest)",
                  flush=True)
        finally:
            for s in idle:
                s.close()
        wait_for(lambda: self.a.metrics()["qatserve_http_connections"] <= 1, "the idle connections released")

    def non_streaming_disconnect(self):
        max_tokens = 4000
        before = self.a.metrics()
        body = json.dumps({"prompt": [2, 10, 11, 12], "max_tokens": max_tokens, "ignore_eos": True,
                           "temperature": 0}).encode()
        s = socket.create_connection(("127.0.0.1", self.a.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)

        def generating():  # (tokens are counted when a sequence ends; engine steps as they run)
            m = self.a.metrics()
            return m["qatserve_engine_steps_total"] - before["qatserve_engine_steps_total"] >= 8

        wait_for(generating, "the generation under way")
        s.close()  # an ordinary close, as a client that gave up

        def aborted():
            m = self.a.metrics()
            n = m['qatserve_requests_total{outcome="abort"}'] - before['qatserve_requests_total{outcome="abort"}']
            return m if n == 1 and m["qatserve_requests_running"] == 0 else None

        m = wait_for(aborted, "the abort counted and the batch empty")
        steps = m["qatserve_engine_steps_total"] - before["qatserve_engine_steps_total"]
        generated = m["qatserve_generation_tokens_total"] - before["qatserve_generation_tokens_total"]
        assert 8 <= steps < max_tokens and generated < max_tokens, \
            f"the engine took {steps} steps ({generated} tokens) for a client that left"
        wait_for(lambda: self.a.log_has("outcome=abort (client gone)"), "the request's log line")
        print(f"  closed after {steps} engine steps ({generated} tokens counted) of {max_tokens}: aborted", flush=True)

    def timeouts_and_limit(self):
        limit = 20
        b = Server(self.binary, self.model, self.workdir, "server-limits", "--header-timeout", "1",
                   "--body-timeout", "1", "--max-connections", str(limit))
        try:
            b.wait_ready()
            before = b.metrics()
            # A header never finished, a body never finished, a kept-alive connection left idle: all closed.
            slow_header = half_header(b.port)
            slow_body = socket.create_connection(("127.0.0.1", b.port))
            slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"pro")
            kept = socket.create_connection(("127.0.0.1", b.port))
            kept.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            for s, what in ((slow_header, "half a header"), (slow_body, "half a body"), (kept, "an idle keep-alive")):
                assert closed_by_server(s, 30), f"{what}: not closed by the server"
                s.close()
            m = b.metrics()
            assert m["qatserve_http_timeouts_total"] - before["qatserve_http_timeouts_total"] == 3, m
            # The limit: `limit` connections held, the next one refused with a JSON 503 and closed.
            held = [half_header(b.port) for _ in range(limit)]
            wait_for(lambda: all(still_open(s) for s in held) and len(held) == limit, "the connections held")
            extra = socket.create_connection(("127.0.0.1", b.port))
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            extra.settimeout(30)
            reply = b""
            while True:
                data = extra.recv(65536)
                if not data:
                    break
                reply += data
            extra.close()
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in head, head
            err = json.loads(body)["error"]
            assert "--max-connections" in err["message"] and err["type"] == "server_error", err
            for s in held:
                s.close()
            wait_for(lambda: self.health_ok(b), "/health again once connections closed")
            m = b.metrics()
            assert m["qatserve_http_connections_refused_total"] >= 1, m
            assert b.log_has("refused 1 connection(s)"), b.log_text()
            assert b.stop(signal.SIGTERM) == 0, b.log_text()
        finally:
            b.kill()

    @staticmethod
    def health_ok(server):
        try:
            return server.request("GET", "/health", timeout=10)[0] == 200
        except (ConnectionResetError, http.client.RemoteDisconnected):
            return False

    def run(self):
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(self.model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        self.a = Server(self.binary, self.model, self.workdir, "server-connections", "--header-timeout", "300",
                        "--max-running", "16", "--max-waiting", str(STREAMS))
        try:
            self.a.wait_ready()
            for name, fn in [
                (f"{IDLE_CONNECTIONS} half-header connections and {STREAMS} streams", self.many_idle_and_streams),
                ("a client closing mid non-streaming generation aborts it", self.non_streaming_disconnect),
                ("header, body and keep-alive timeouts; the connection limit's 503", self.timeouts_and_limit),
            ]:
                self.check(name, fn)
            assert self.a.stop(signal.SIGTERM) == 0, self.a.log_text()
        finally:
            self.a.kill()
        return self.summary("connection checks", self.a)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not (DEMO_TOKENIZER / "tokenizer.json").exists():
        print(f"connection test skipped: {DEMO_TOKENIZER}/tokenizer.json is missing")
        return SKIP
    fds = raise_fd_limit(IDLE_CONNECTIONS + 512)
    if fds < IDLE_CONNECTIONS + 256:
        print(f"connection test skipped: the open-file limit is {fds}, {IDLE_CONNECTIONS + 256} needed")
        return SKIP
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-connections-test-") as tmp:
        rc = Suite(str(Path(sys.argv[1]).resolve()), tmp).run()
    print(f"connection test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
