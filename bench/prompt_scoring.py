#!/usr/bin/env python3
"""Prompt-only scoring (completions echo + logprobs, max_tokens 0: what lm-eval's log-likelihood tasks send) against
plain prefill (the same prompts, max_tokens 1, no echo) through `qatserve serve`.

usage: bench/prompt_scoring.py QATSERVE_BINARY [--model DIR] [--requests N] [--prompt-tokens L] [--concurrency C]

Starts `serve --precision f32` on a free loopback port, sends N requests of L random token ids each (distinct
prompts, so the prefix cache serves neither side), C at a time, for each kind in turn, and prints requests/s and
prompt tokens/s for both. A measuring tool, not a test: it asserts nothing about speed.
"""
import argparse
import concurrent.futures as futures
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def wait_ready(port, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("serve did not become ready")


def run(port, prompts, body, concurrency):
    t0 = time.perf_counter()
    with futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: post(port, "/v1/completions", {"prompt": p, **body}), prompts))
    return time.perf_counter() - t0, results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--model", default=str(ROOT / "models" / "gemma4-tiny-qat"))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    vocab = (config.get("text_config") or config)["vocab_size"]
    rng = random.Random(0)

    def prompts():  # [bos] + random ids from the ordinary range (special tokens sit at the bottom)
        return [[2] + [rng.randrange(300, vocab) for _ in range(args.prompt_tokens - 1)] for _ in range(args.requests)]

    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([args.binary, "serve", "--model", args.model, "--port", str(port), "--precision", "f32"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, proc)
            run(port, prompts()[:2], {"max_tokens": 1}, 1)  # warm
            kinds = [("scoring (echo, logprobs 1, max_tokens 0)", {"echo": True, "logprobs": 1, "max_tokens": 0}),
                     ("plain prefill (max_tokens 1)", {"max_tokens": 1, "temperature": 0})]
            for name, body in kinds:
                seconds, results = run(port, prompts(), body, args.concurrency)
                tokens = sum(r["usage"]["prompt_tokens"] for r in results)
                print(f"{name}: {args.requests} requests x {args.prompt_tokens} tokens, concurrency "
                      f"{args.concurrency}: {args.requests / seconds:.1f} requests/s, {tokens / seconds:.0f} "
                      f"prompt tokens/s ({seconds:.2f} s)")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
