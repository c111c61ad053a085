#!/usr/bin/env python3
"""Load benchmark of serve's HTTP layer: connections held, /health latency under load, memory per connection.

usage: bench/http_load.py QATSERVE_BINARY [--idle 2000] [--streams 200] [--max-tokens 64] [--max-running 16]
                                          [--max-waiting 64] [--threads N]

Synthesizes the tiny E2B checkpoint (demo tokenizer) and serves it on a free loopback port with the given engine
limits (and --threads compute threads; default one per core). Then:
  1. opens --idle connections that each send half a request header and then nothing (slow or idle clients), and
     reads the server's VmRSS before and after: memory per held connection (user space; the kernel's socket
     buffers are not in RSS);
  2. with those held, starts --streams streaming completions at once (--max-tokens each, ignore_eos) and, until
     they end, asks GET /health every 20 ms on a new connection: its latency p50/p99/max;
  3. reports how the streams ended: 200 streams run to [DONE], 429s (past --max-waiting) and how fast those came.
Client and server share the machine: on a small one the client's own work is in the latencies.
"""
import argparse
import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vmrss(pid):
    m = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) * 1024


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def request(port, raw):
    """Sends raw bytes, reads until the server closes; (status, body bytes, seconds)."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body, time.perf_counter() - t0


async def stream(port, i, max_tokens):
    body = json.dumps({"prompt": [2, 100 + i % 1000, 7], "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body) + body)
    status, data, seconds = await request(port, raw)
    return status, b"data: [DONE]" in data, seconds


async def health_probes(port, until):
    latencies = []
    raw = b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    while not until.done():
        status, _, seconds = await request(port, raw)
        assert status == 200, status
        latencies.append(seconds)
        await asyncio.sleep(0.02)
    return latencies


async def load(port, pid, args):
    rss_before = vmrss(pid)
    idle = []
    for _ in range(args.idle):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\nX-Slow: ")
        idle.append(writer)
    await asyncio.sleep(1)  # the server has read every half header
    rss_idle = vmrss(pid)
    t0 = time.perf_counter()
    streams = asyncio.ensure_future(asyncio.gather(*(stream(port, i, args.max_tokens) for i in range(args.streams))))
    latencies = await health_probes(port, streams)
    results = await streams
    wall = time.perf_counter() - t0
    rss_load = vmrss(pid)
    # Connections the server holds now, the one asking included: the idle ones were held all along.
    _, metrics, _ = await request(port, b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
    held = int(float(re.search(rb"^qatserve_http_connections (\S+)$", metrics, re.M).group(1))) - 1
    for w in idle:
        w.close()
    return {
        "rss_before": rss_before, "rss_idle": rss_idle, "rss_load": rss_load, "held": held, "latencies": latencies,
        "results": results, "wall": wall,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--max-waiting", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="serve --threads (0: its default, one per core)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.idle + args.streams + 256:
        sys.exit(f"the open-file limit {hard} is too low for {args.idle + args.streams} connections")
    with tempfile.TemporaryDirectory(prefix="qatserve-http-load-") as tmp:
        model = Path(tmp) / "tiny-e2b"
        subprocess.run([args.binary, "synth", "--preset", "e2b-tiny", "--out", str(model), "--tokenizer",
                        str(ROOT / "configs" / "demo-tokenizer"), "--quiet"], check=True, capture_output=True)
        port = free_port()
        log = open(Path(tmp) / "serve.log", "wb")
        server = subprocess.Popen([args.binary, "serve", "--model", str(model), "--port", str(port),
                                   "--max-running", str(args.max_running), "--max-waiting", str(args.max_waiting),
                                   "--header-timeout", "600",
                                   *(["--threads", str(args.threads)] if args.threads else [])],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while True:
                try:
                    status, _, _ = asyncio.run(request(port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"))
                    if status == 200:
                        break
                except OSError:
                    pass
                assert time.time() < deadline and server.poll() is None, "the server did not get ready"
                time.sleep(0.05)
            r = asyncio.run(load(port, server.pid, args))
        finally:
            server.terminate()
            server.wait(timeout=60)
    lat = [x * 1000 for x in r["latencies"]]
    ok = [s for s in r["results"] if s[0] == 200 and s[1]]
    busy = [s for s in r["results"] if s[0] == 429]
    per_connection = (r["rss_idle"] - r["rss_before"]) / max(1, args.idle)
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "unknown")
    print(f"http_load: {args.idle} idle (half-header) connections + {args.streams} streaming clients "
          f"(max_tokens {args.max_tokens}, --max-running {args.max_running} --max-waiting {args.max_waiting}, "
          f"--threads {args.threads or 'default'}); "
          f"{os.cpu_count()} cores, {cpu}")
    print(f"| measure | value |\n|---|---|")
    print(f"| idle connections held through the load | {r['held']} of {args.idle} |")
    print(f"| /health probes during the streams | {len(lat)} |")
    print(f"| /health latency p50 / p99 / max | {percentile(lat, 50):.1f} / {percentile(lat, 99):.1f} / "
          f"{max(lat):.1f} ms |")
    print(f"| streams run to [DONE] / answered 429 / other | {len(ok)} / {len(busy)} / "
          f"{len(r['results']) - len(ok) - len(busy)} |")
    if busy:
        print(f"| 429 answered within (max) | {max(s[2] for s in busy) * 1000:.1f} ms |")
    print(f"| wall time of the streams | {r['wall']:.2f} s |")
    print(f"| server VmRSS: ready / {args.idle} idle held / after the streams | {r['rss_before'] / 2**20:.1f} / "
          f"{r['rss_idle'] / 2**20:.1f} / {r['rss_load'] / 2**20:.1f} MiB |")
    print(f"| VmRSS per idle connection | {per_connection / 1024:.2f} KiB |")


if __name__ == "__main__":
    main()
