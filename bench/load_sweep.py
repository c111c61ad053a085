#!/usr/bin/env python3
"""Load sweep against `qatserve serve`: concurrency 1, 2, 4, 8, 16 streaming completions.

usage: load_sweep.py --model DIR [--binary build/qatserve] [--levels 1,2,4,8,16] [--prompt-tokens 64]
                     [--max-tokens 64] [--rounds 1] [--json FILE] [-- extra serve flags]

Starts the server on a free port, waits for /health, then for each concurrency level C sends C streaming
/v1/completions requests at once (token-id prompts of distinct random ids, greedy, ignore_eos so every request
generates exactly --max-tokens) and repeats that --rounds times. Reports per level: aggregate output tokens/s
(all tokens over the level's wall time), time to first token and time per output token (median and p99 over
requests), and the aggregate relative to one stream. Standard library only.
"""
import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode} while loading")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("server not ready in time")


def one_request(port, prompt, max_tokens, out):
    """Streams one completion; appends (ttft_s, tpot_s, tokens, total_s) to out."""
    body = json.dumps({"model": "qatserve", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first = None
    tokens = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            first = time.perf_counter()
    end = time.perf_counter()
    first = first or end
    out.append((first - start, (end - first) / max(1, tokens - 1), tokens, end - start))


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_level(port, concurrency, args, rng, vocab):
    results = []
    start = time.perf_counter()
    for _ in range(args.rounds):
        prompts = [[2] + [rng.randrange(10, vocab) for _ in range(args.prompt_tokens - 1)] for _ in range(concurrency)]
        threads = [threading.Thread(target=one_request, args=(port, p, args.max_tokens, results)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - start
    if len(results) != concurrency * args.rounds:
        sys.exit(f"concurrency {concurrency}: {concurrency * args.rounds - len(results)} requests failed")
    ttft = [r[0] for r in results]
    tpot = [r[1] for r in results]
    return {"concurrency": concurrency, "requests": len(results), "output_tokens": sum(r[2] for r in results),
            "wall_s": wall, "tokens_per_s": sum(r[2] for r in results) / wall,
            "ttft_median_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 0.99),
            "tpot_median_s": statistics.median(tpot), "tpot_p99_s": percentile(tpot, 0.99)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--binary", default=str(ROOT / "build" / "qatserve"))
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("serve_args", nargs="*", help="extra flags for qatserve serve (after --)")
    args = parser.parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]

    port = free_port()
    log = open(Path("/tmp") / f"load_sweep_{port}.log", "wb")
    proc = subprocess.Popen([args.binary, "serve", "--model", args.model, "--port", str(port), *args.serve_args],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc)
        rng = random.Random(1)
        rows = [run_level(port, int(c), args, rng, vocab) for c in args.levels.split(",")]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    base = rows[0]["tokens_per_s"] / rows[0]["concurrency"] if rows[0]["concurrency"] == 1 else None
    print(f"prompt {args.prompt_tokens} tokens, {args.max_tokens} generated per request, {args.rounds} round(s)")
    print("| streams | output tok/s | vs 1 stream | TTFT median | TTFT p99 | TPOT median | TPOT p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        print(f"| {r['concurrency']} | {r['tokens_per_s']:.2f} | {ratio} | {r['ttft_median_s']:.2f} s | "
              f"{r['ttft_p99_s']:.2f} s | {r['tpot_median_s'] * 1000:.0f} ms | {r['tpot_p99_s'] * 1000:.0f} ms |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
