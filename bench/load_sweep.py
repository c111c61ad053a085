#!/usr/bin/env python3
"""Decode through `qatserve serve` beside `qatserve bench` in the same run: streams 1/2/4/8/16 at depths 0 and 4096.

usage: load_sweep.py --model DIR [--binary build/qatserve] [--levels 1,2,4,8,16] [--depths 0,4096]
                     [--precisions bf16,int8] [--max-tokens 64] [--rounds 1] [--no-bench] [--json FILE]
                     [-- extra serve flags]

For each precision: `qatserve bench --streams LEVELS --depths DEPTHS --precision P` measures decode straight through
the model (no sampling, no HTTP), then `qatserve serve --precision P` starts on a free port and, for each depth D and
concurrency level C, C streaming /v1/completions run at once (greedy, ignore_eos, --max-tokens each). Depth D > 0:
one request first puts a D-token prompt in the prefix cache, then every stream sends that prompt plus two tokens of
its own, so each adopts the D cached positions and decodes at depth D as bench's rows do (a prompt of D fresh tokens
per stream would measure prefill instead). Depth 0: distinct 8-token prompts.

Server decode tok/s is the sum over streams of (tokens - 1) / (last token - first token): every stream of a level
starts decoding in the same engine step, so this is the batch's decode rate as the clients see it, prefill and TTFT
left out as bench leaves them out. The table gives it beside bench's, their ratio, the aggregate relative to one
stream, and the wall-clock output tok/s (prefill included), TTFT and TPOT. The serving goals (below, check_goals) are
checked at the end. Standard library only.
"""
import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, timeout=900):
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
    """Streams one completion; appends (start, first_token, last_token, tokens) in perf_counter seconds to out."""
    body = json.dumps({"model": "qatserve", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first = last = None
    tokens = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("choices"):  # a token arrived (its text may be held back as incomplete UTF-8 or a stop prefix)
            last = time.perf_counter()
            first = first or last
    end = time.perf_counter()
    out.append((start, first or end, last or end, tokens))


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_level(port, concurrency, depth_prefix, args, rng, vocab):
    results = []
    start = time.perf_counter()
    decode_rates = []
    for _ in range(args.rounds):
        tail = 2 if depth_prefix else 8
        prompts = [depth_prefix + [rng.randrange(10, vocab) for _ in range(tail)] for _ in range(concurrency)]
        if not depth_prefix:
            prompts = [[2] + p[1:] for p in prompts]
        round_results = []
        threads = [threading.Thread(target=one_request, args=(port, p, args.max_tokens, round_results))
                   for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(round_results) != concurrency:
            sys.exit(f"concurrency {concurrency}: {concurrency - len(round_results)} requests failed")
        decode_rates.append(sum((r[3] - 1) / max(1e-9, r[2] - r[1]) for r in round_results))
        results += round_results
    wall = time.perf_counter() - start
    ttft = [r[1] - r[0] for r in results]
    tpot = [(r[2] - r[1]) / max(1, r[3] - 1) for r in results]
    return {"streams": concurrency, "requests": len(results), "output_tokens": sum(r[3] for r in results),
            "wall_s": wall, "output_tokens_per_s": sum(r[3] for r in results) / wall,
            "decode_tokens_per_s": statistics.median(decode_rates),
            "ttft_median_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 0.99),
            "tpot_median_s": statistics.median(tpot), "tpot_p99_s": percentile(tpot, 0.99)}


def bench_rows(args, precision):
    """qatserve bench's decode rows: {(streams, depth): tok/s}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        subprocess.run([args.binary, "bench", "--model", args.model, "--prompts", "16", "--streams", args.levels,
                        "--depths", args.depths, "--decode-tokens", str(args.bench_decode_tokens), "--precision",
                        precision, "--repeat", str(args.rounds), "--json", str(out), *args.bench_args],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = json.loads(out.read_text())
    return {(r["streams"], r["depth"]): r["tokens_per_second"] for r in report["rows"] if r["phase"] == "decode"}


def serve_rows(args, precision, vocab):
    port = free_port()
    log = open(Path(tempfile.gettempdir()) / f"load_sweep_{port}.log", "wb")
    proc = subprocess.Popen([args.binary, "serve", "--model", args.model, "--port", str(port), "--precision",
                             precision, *args.serve_args], stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        wait_ready(port, proc)
        rng = random.Random(1)
        for depth in (int(d) for d in args.depths.split(",")):
            prefix = [2] + [rng.randrange(10, vocab) for _ in range(depth - 1)] if depth else []
            if prefix:  # into the prefix cache: later prompts adopt its complete blocks
                one_request(port, prefix + [11], 1, [])
            for c in (int(c) for c in args.levels.split(",")):
                row = run_level(port, c, prefix, args, rng, vocab)
                row.update(depth=depth, precision=precision)
                rows.append(row)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows


def check_goals(rows):
    """The serving goals: 1 stream >= 0.95x bench; aggregate never drops as streams rise; 8 streams >= 4x one stream
    (bf16) or >= 6x (int8)."""
    lines = []
    for (precision, depth) in sorted({(r["precision"], r["depth"]) for r in rows}):
        level = sorted((r for r in rows if r["precision"] == precision and r["depth"] == depth),
                       key=lambda r: r["streams"])
        one = next((r for r in level if r["streams"] == 1), None)
        eight = next((r for r in level if r["streams"] == 8), None)
        where = f"{precision}, depth {depth}"
        if one and one.get("bench_tokens_per_s"):
            ratio = one["decode_tokens_per_s"] / one["bench_tokens_per_s"]
            lines.append(f"{where}: 1 stream through the server is {ratio:.2f}x bench (goal >= 0.95)")
        drops = [f"{a['streams']}->{b['streams']}" for a, b in zip(level, level[1:])
                 if b["decode_tokens_per_s"] < a["decode_tokens_per_s"]]
        lines.append(f"{where}: aggregate " + (f"drops at {', '.join(drops)}" if drops else "never drops"))
        if one and eight:
            goal = 6 if precision == "int8" else 4
            lines.append(f"{where}: 8 streams {eight['decode_tokens_per_s'] / one['decode_tokens_per_s']:.2f}x one "
                         f"stream (goal >= {goal}x)")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--binary", default=str(ROOT / "build" / "qatserve"))
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--depths", default="0,4096")
    parser.add_argument("--precisions", default="bf16", help="comma-separated: bf16 (exact), int8, f32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--bench-decode-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per level (median); bench --repeat too")
    parser.add_argument("--no-bench", action="store_true", help="the server only")
    parser.add_argument("--bench-args", default="", help="extra qatserve bench flags, space-separated")
    parser.add_argument("--json")
    parser.add_argument("serve_args", nargs="*", help="extra flags for qatserve serve (after --)")
    args = parser.parse_args()
    args.bench_args = args.bench_args.split()
    config = json.loads((Path(args.model) / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]

    rows = []
    for precision in args.precisions.split(","):
        bench = {} if args.no_bench else bench_rows(args, precision)
        for row in serve_rows(args, precision, vocab):
            row["bench_tokens_per_s"] = bench.get((row["streams"], row["depth"]))
            rows.append(row)

    print(f"{args.max_tokens} tokens generated per request, {args.rounds} round(s); bench: "
          f"{args.bench_decode_tokens} decode steps per row")
    print("| precision | depth | streams | bench tok/s | server decode tok/s | server/bench | vs 1 stream | "
          "output tok/s (wall) | TTFT median | TPOT median | TPOT p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        one = next(x for x in rows if x["precision"] == r["precision"] and x["depth"] == r["depth"])
        bench = r["bench_tokens_per_s"]
        bench_cell = f"{bench:.2f}" if bench else "-"
        ratio_cell = f"{r['decode_tokens_per_s'] / bench:.2f}" if bench else "-"
        print(f"| {r['precision']} | {r['depth']} | {r['streams']} | {bench_cell} | "
              f"{r['decode_tokens_per_s']:.2f} | {ratio_cell} | "
              f"{r['decode_tokens_per_s'] / one['decode_tokens_per_s'] * one['streams']:.2f}x | "
              f"{r['output_tokens_per_s']:.2f} | {r['ttft_median_s']:.2f} s | {r['tpot_median_s'] * 1000:.0f} ms | "
              f"{r['tpot_p99_s'] * 1000:.0f} ms |")
    for line in check_goals(rows):
        print("- " + line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
