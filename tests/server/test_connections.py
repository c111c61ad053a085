#!/usr/bin/env python3
"""The HTTP layer under many connections (`qatserve serve`, loopback): idle and slow clients cost no request.

usage: test_connections.py QATSERVE_BINARY

docs/api.md's claims about connections ("The HTTP layer"), each asserted:
1. 2,000 connections that sent half a header, held open, plus 200 concurrent streaming clients: /health still
   answers, every stream runs to [DONE], and the idle connections are still open. The server's VmRSS
   (/proc/PID/status: the process's resident memory, kernel socket buffers not included) grows by at most
   RSS_PER_CONNECTION_BOUND (8 KiB) a connection while the idle ones are opened (docs/api.md: about 3 KB; 2.7 KiB
   measured on the 2-core development VM).
2. A client that closes its socket in the middle of a NON-streaming generation aborts it: the abort is counted
   and the engine stops long before max_tokens.
3. --header-timeout closes a client that never finishes its header (and an idle kept-alive connection);
   --body-timeout one that never finishes its body.
4. --max-connections: the connection past the limit gets a 503 with a JSON error naming the flag, Retry-After: 1 and
   Connection: close, the refusal is logged, and the server serves again once connections close.
5. The open-file limit caps --max-connections: a server started under `ulimit -Sn 100 -Hn 160` with
   --max-connections 4096 raises its soft limit to the hard one (/proc/PID/limits), logs that the flag is lowered to
   160 - 64 spare descriptors = 96, and answers the 97th connection with the 503 (not an accept failure).
6. A client that sends a streaming request and then reads nothing is dropped by the server's 30 s write timeout
   (not configurable: the test waits it out, while checks 1-5 run): the connection is closed no sooner than 30 s
   after the request, counted in qatserve_http_timeouts_total, its request aborted (still generating: a
   262,144-token context model asked for 262,136 tokens, of which the development VM generates about 31,000 in the
   30 s) and its batch slot freed. While it runs, that server (--max-running 1 --max-waiting 0) answers another
   generation with a 429 and Retry-After: 1.
No check depends on the machine's speed: waits end on events, their deadlines only stop a hung test (the latency
bounds, /health answered at all within 10 s and the dropped reader within WRITE_TIMEOUT + SLOW_READER_SLACK s, are
functional).
Exit status: 0 passed, 1 failed, 77 skipped (no demo tokenizer or no openai package, as test_openai_server.py).
"""
import concurrent.futures as futures
import http.client
import json
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_harness import DEMO_TOKENIZER, HANG_STOP, SKIP, Checks, Server, sse_frames, wait_for

IDLE_CONNECTIONS = 2000
STREAMS = 200
STREAM_TOKENS = 8
HEALTH_DEADLINE = 10  # seconds: /health must answer at all within this, under the load
RSS_PER_CONNECTION_BOUND = 8 * 1024  # bytes of server VmRSS per idle connection (docs/api.md: about 3 KB)
NOFILE_SOFT, NOFILE_HARD = 100, 160  # the fd-capped server's open-file limits
SPARE_DESCRIPTORS = 64  # http_transport.cc's kSpareDescriptors: descriptors kept from connections
WRITE_TIMEOUT = 30  # seconds: http_transport.h's write_timeout, docs/api.md's 30 s write timeout
SLOW_READER_SLACK = 90  # seconds past WRITE_TIMEOUT: the socket buffers filling first, on a loaded machine
LONG_CONTEXT = 262144  # the slow reader's model: a generation that 30 s cannot finish


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


def read_to_eof(s, timeout=30):
    s.settimeout(timeout)
    reply = b""
    while True:
        data = s.recv(65536)
        if not data:
            return reply
        reply += data


def head_of(reply):
    """(status, {lower-case header name: value}, body) of one raw HTTP/1.1 response."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


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


def stream(port, i, max_tokens=STREAM_TOKENS):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_STOP)
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


def vm_rss(pid):
    """The process's resident set (VmRSS of /proc/PID/status), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            assert unit == "kB", line
            return int(value) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def open_file_limits(pid):
    """(soft, hard) "Max open files" of /proc/PID/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


def kept_metrics_connection(port, connections):
    """A kept-alive connection whose GET /metrics was answered while the server held exactly `connections`
    (itself included); None when refused (a closed connection not yet released) or the count differs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        body = r.read().decode()
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
        conn.close()
        return None
    held = [float(line.split()[1]) for line in body.splitlines() if line.startswith("qatserve_http_connections ")]
    if r.status != 200 or held != [connections]:
        conn.close()
        return None
    return conn


def refused_at_limit(server, limit):
    """Fills the server to `limit` connections and returns the raw reply to one more, with the held ones' state.

    No race with connections the test closed just before (their release is asynchronous): the server is first seen
    holding only the asking connection, so at most one closed one is pending when limit - 1 half-header ones open
    (accepted in order, before anything opened after them); the last slot is taken by a kept-alive /metrics that
    was answered while the server held exactly `limit`."""
    wait_for(lambda: server.metrics()["qatserve_http_connections"] == 1, "only the asking connection held")
    held = [half_header(server.port) for _ in range(limit - 1)]
    kept = None
    try:
        kept = wait_for(lambda: kept_metrics_connection(server.port, limit), f"{limit} connections held")
        extra = socket.create_connection(("127.0.0.1", server.port))
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = read_to_eof(extra)
        extra.close()
        open_now = sum(still_open(s) for s in held) + still_open(kept.sock)
        return reply, open_now
    finally:
        for s in held:
            s.close()
        if kept:
            kept.close()


def assert_limit_refusal(reply, limit):
    status, headers, body = head_of(reply)
    assert status == 503, reply[:300]
    assert headers.get("retry-after") == "1" and headers.get("connection") == "close", headers
    err = json.loads(body)["error"]
    assert "--max-connections" in err["message"] and f"limit of {limit} connections" in err["message"] \
        and err["type"] == "server_error", err


class Suite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary = binary
        self.workdir = Path(workdir)
        self.model = self.workdir / "tiny-e2b"
        self.long_model = self.workdir / "tiny-e2b-long"
        self.slow = None  # the slow reader: (socket, time its request was sent, metrics before)

    # ---- 1, 2: many connections, memory, aborts ----

    def many_idle_and_streams(self):
        pid = self.a.proc.pid
        self.a.metrics()  # the /metrics path warmed up before the baseline
        rss_before = vm_rss(pid)
        idle = [half_header(self.a.port) for _ in range(IDLE_CONNECTIONS)]
        try:
            # The asking connection is held too while /metrics answers.
            wait_for(lambda: self.a.metrics()["qatserve_http_connections"] >= IDLE_CONNECTIONS + 1,
                     "the server holding the idle connections")
            rss_held = vm_rss(pid)
            per_connection = (rss_held - rss_before) / IDLE_CONNECTIONS
            assert per_connection <= RSS_PER_CONNECTION_BOUND, \
                f"VmRSS {rss_before} -> {rss_held} bytes: {per_connection:.0f} bytes a connection"
            with futures.ThreadPoolExecutor(STREAMS) as pool:
                streams = [pool.submit(stream, self.a.port, i) for i in range(STREAMS)]
                # While the streams run (and after), with every idle connection held: /health answers.
                latencies = [health_within(self.a.port, HEALTH_DEADLINE) for _ in range(20)]
                frames = [s.result() for s in streams]
            latencies.append(health_within(self.a.port, HEALTH_DEADLINE))
            assert len(frames) == STREAMS and all(f >= 1 for f in frames), frames
            open_now = sum(still_open(s) for s in idle)
            assert open_now == IDLE_CONNECTIONS, f"only {open_now} of {IDLE_CONNECTIONS} idle connections held"
            latencies.sort()
            print(f"  {IDLE_CONNECTIONS} idle connections held: VmRSS {rss_before / 2**20:.1f} -> "
                  f"{rss_held / 2**20:.1f} MiB, {per_connection / 1024:.2f} KiB a connection (bound "
                  f"{RSS_PER_CONNECTION_BOUND / 1024:.0f} KiB); {STREAMS} streams to [DONE]; /health answered in "
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

    # ---- 3, 4: timeouts and --max-connections ----

    def timeouts(self):
        b = Server(self.binary, self.model, self.workdir, "server-timeouts", "--header-timeout", "1",
                   "--body-timeout", "1")
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
            assert b.stop(signal.SIGTERM) == 0, b.log_text()
        finally:
            b.kill()

    def connection_limit(self):
        limit = 20
        e = Server(self.binary, self.model, self.workdir, "server-limit", "--max-connections", str(limit),
                   "--header-timeout", "300")
        try:
            e.wait_ready()
            # `limit` connections held, the next one refused with a JSON 503, Retry-After and Connection: close.
            reply, open_now = refused_at_limit(e, limit)
            assert_limit_refusal(reply, limit)
            assert open_now == limit, f"{open_now} of {limit} held connections still open at the refusal"
            wait_for(lambda: self.health_ok(e), "/health again once connections closed")
            m = e.metrics()
            assert m["qatserve_http_connections_refused_total"] >= 1, m
            assert re.search(rf"refused \d+ connection\(s\): the server holds its limit of {limit} connections "
                             r"\(--max-connections\)", e.log_text()), e.log_text()
            assert e.stop(signal.SIGTERM) == 0, e.log_text()
        finally:
            e.kill()

    def open_file_limit_caps_connections(self):
        cap = NOFILE_HARD - SPARE_DESCRIPTORS
        wrapper = self.workdir / "qatserve-nofile.sh"
        wrapper.write_text(f"#!/bin/sh\nulimit -S -n {NOFILE_SOFT} && ulimit -H -n {NOFILE_HARD} && "
                           f"exec '{self.binary}' \"$@\"\n")
        wrapper.chmod(0o755)
        d = Server(str(wrapper), self.model, self.workdir, "server-nofile", "--max-connections", "4096",
                   "--header-timeout", "300")
        try:
            d.wait_ready()
            assert open_file_limits(d.proc.pid) == (NOFILE_HARD, NOFILE_HARD), \
                Path(f"/proc/{d.proc.pid}/limits").read_text()
            assert d.log_has(f"--max-connections 4096 lowered to {cap}: the open-file limit (ulimit -n) holds no "
                             "more"), d.log_text()
            assert d.log_has(f"(up to {cap} connections)"), d.log_text()
            reply, open_now = refused_at_limit(d, cap)
            assert_limit_refusal(reply, cap)
            assert open_now == cap, f"{open_now} of {cap} held connections still open at the refusal"
            wait_for(lambda: self.health_ok(d), "/health again once connections closed")
            assert d.metrics()["qatserve_http_connections_refused_total"] >= 1
            assert not d.log_has("accept failed"), d.log_text()
            assert d.stop(signal.SIGTERM) == 0, d.log_text()
            print(f"  ulimit -n {NOFILE_SOFT}/{NOFILE_HARD}: soft raised to {NOFILE_HARD}, --max-connections 4096 "
                  f"lowered to {cap}, connection {cap + 1} answered 503", flush=True)
        finally:
            d.kill()

    # ---- 6: the client that reads nothing (and the 429 of a full queue) ----

    def slow_reader_starts(self):
        c = self.c
        before = c.metrics()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel's buffers fill sooner
        s.connect(("127.0.0.1", c.port))
        body = json.dumps({"prompt": [2, 10, 11], "max_tokens": LONG_CONTEXT - 8, "ignore_eos": True,
                           "temperature": 0, "stream": True, "logprobs": 5}).encode()
        sent = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.slow = (s, sent, before)
        wait_for(lambda: c.metrics()["qatserve_requests_running"] == 1, "the slow reader's request running")
        # Its one batch slot taken and no queue: another generation is refused at once, with Retry-After.
        status, headers, data = c.request("POST", "/v1/completions", {"prompt": [2, 5], "max_tokens": 1})
        assert status == 429 and headers.get("retry-after") == "1", (status, headers, data)
        err = json.loads(data)["error"]
        assert "at capacity" in err["message"] and err["type"] == "rate_limit_error", err

    def slow_reader_dropped(self):
        assert self.slow, "the slow reader did not start"
        c = self.c
        s, sent, before = self.slow
        abort = 'qatserve_requests_total{outcome="abort"}'
        deadline = sent + WRITE_TIMEOUT + SLOW_READER_SLACK
        while True:  # polled every 0.2 s: the server's engine is busy with the reader's generation meanwhile
            m = c.metrics()
            if m["qatserve_http_timeouts_total"] > before["qatserve_http_timeouts_total"] or m[abort] > before[abort]:
                dropped = time.monotonic() - sent
                break
            assert time.monotonic() < deadline, \
                f"not dropped {WRITE_TIMEOUT + SLOW_READER_SLACK} s after its request: {m}"
            time.sleep(0.2)
        # The write timer starts at the server's last write, after the request was sent: never sooner than 30 s.
        assert dropped >= WRITE_TIMEOUT, f"dropped {dropped:.1f} s after its request"

        def counted():  # the timeout counted and the request aborted (the generation was far from its end)
            m = c.metrics()
            timeouts = m["qatserve_http_timeouts_total"] - before["qatserve_http_timeouts_total"]
            aborts = m[abort] - before[abort]
            assert timeouts <= 1 and aborts <= 1, m
            return m if timeouts == 1 and aborts == 1 and m["qatserve_requests_running"] == 0 else None

        m = wait_for(counted, "the drop counted in qatserve_http_timeouts_total and the request aborted", timeout=30)
        assert m['qatserve_requests_total{outcome="length"}'] == before['qatserve_requests_total{outcome="length"}']
        assert c.log_has("outcome=abort (client gone)"), c.log_text()
        s.settimeout(30)
        received = b""
        try:
            while data := s.recv(1 << 20):
                received += data
        except ConnectionResetError:
            pass
        s.close()
        assert received.startswith(b"HTTP/1.1 200 "), received[:200]
        generated = m["qatserve_engine_steps_total"] - before["qatserve_engine_steps_total"]

        def served():  # the slot freed: the next generation runs
            status, _, data = c.request("POST", "/v1/completions", {"prompt": [2, 5], "max_tokens": 2})
            assert status in (200, 429), (status, data)
            return status == 200

        wait_for(served, "a generation served after the drop")
        print(f"  dropped {dropped:.1f} s after its request (the write timeout is {WRITE_TIMEOUT} s), "
              f"{len(received) / 2**20:.1f} MiB had reached it, aborted after {generated:.0f} engine steps of "
              f"{LONG_CONTEXT - 8}", flush=True)

    @staticmethod
    def health_ok(server):
        try:
            return server.request("GET", "/health", timeout=10)[0] == 200
        except (ConnectionResetError, http.client.RemoteDisconnected):
            return False

    def synth(self):
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(self.model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        # The same model with a long context, for a generation that outlasts the write timeout on any machine.
        config = json.loads((self.model / "config.json").read_text())
        config["text_config"]["max_position_embeddings"] = LONG_CONTEXT
        long_config = self.workdir / "long-config.json"
        long_config.write_text(json.dumps(config))
        subprocess.run([self.binary, "synth", "--config", str(long_config), "--out", str(self.long_model),
                        "--tokenizer", str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)

    def run(self):
        self.synth()
        self.c = Server(self.binary, self.long_model, self.workdir, "server-slow-reader", "--threads", "1",
                        "--max-running", "1", "--max-waiting", "0", "--kv-memory", "64M")
        self.a = Server(self.binary, self.model, self.workdir, "server-connections", "--header-timeout", "300",
                        "--max-running", "16", "--max-waiting", str(STREAMS))
        try:
            self.c.wait_ready()
            self.a.wait_ready()
            for name, fn in [
                ("a client reading nothing holds its batch slot: another request gets 429 with Retry-After",
                 self.slow_reader_starts),
                (f"{IDLE_CONNECTIONS} half-header connections (VmRSS a connection) and {STREAMS} streams",
                 self.many_idle_and_streams),
                ("a client closing mid non-streaming generation aborts it", self.non_streaming_disconnect),
                ("header, body and keep-alive timeouts", self.timeouts),
                ("--max-connections: past it a 503 with Retry-After and Connection: close", self.connection_limit),
                ("the open-file limit lowers --max-connections; past it a 503, not an accept failure",
                 self.open_file_limit_caps_connections),
                (f"a client reading nothing is dropped after {WRITE_TIMEOUT} s and its request aborted",
                 self.slow_reader_dropped),
            ]:
                self.check(name, fn)
            assert self.a.stop(signal.SIGTERM) == 0, self.a.log_text()
            assert self.c.stop(signal.SIGTERM) == 0, self.c.log_text()
        finally:
            self.a.kill()
            self.c.kill()
        return self.summary("connection checks", self.a)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not (DEMO_TOKENIZER / "tokenizer.json").exists():
        print(f"connection test skipped: {DEMO_TOKENIZER}/tokenizer.json is missing")
        return SKIP
    needed = IDLE_CONNECTIONS + STREAMS + 256
    fds = raise_fd_limit(needed + 256)
    if fds < needed:
        print(f"connection test skipped: the open-file limit is {fds}, {needed} needed")
        return SKIP
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-connections-test-") as tmp:
        rc = Suite(str(Path(sys.argv[1]).resolve()), tmp).run()
    print(f"connection test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
