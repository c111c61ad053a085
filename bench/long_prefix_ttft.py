#!/usr/bin/env python3
"""Time to first token of a long prompt: computed, then cached in RAM, then read back from the prefix cache's disk
tier after a restart; and decode speed at that depth.

usage: bench/long_prefix_ttft.py QATSERVE_BINARY --model DIR [--tokens N] [--kv-dtype bf16] [--kv-memory 2G]
                                 [--decode-tokens 32] [--cache-dir DIR] [--drop-caches]

Starts `serve --prefix-cache-dir` on a free loopback port and sends the same streamed /v1/completions request (N
seeded random token ids, greedy) three times: (1) on an empty cache, where the time to the first token is the
prefill; (2) again, its prefix adopted from RAM; (3) after stopping the server (which writes its cached blocks to the
disk tier) and starting it again on the same directory, its prefix read back from disk. Each answer must be the same
text. With --drop-caches (root: /proc/sys/vm/drop_caches) the kernel's page cache is emptied between the stop and the
restart, so that (3) reads the disk tier from the device, as after a reboot, rather than from memory.
Decode tokens/s is over the tokens after the first, at depth N. The disk tier's hit counter from /metrics says
how many prompt tokens came from disk. A measuring tool, not a test: it asserts only that the three answers agree.
The model must be one `serve` loads: a synthetic checkpoint needs a tokenizer (`qatserve synth --tokenizer DIR`)
and either its towers or a config.json whose vision_config and audio_config are null.
"""
import argparse
import http.client
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompt_scoring import free_port, wait_ready  # noqa: E402  this folder's serve helpers


def streamed_completion(port, prompt, max_tokens):
    """(seconds to the first token, seconds from the first token to the last, text, tokens) of one streamed request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=7200)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"/v1/completions: HTTP {resp.status}: {resp.read()[:300]!r}")
    first = last = None
    text, tokens = "", 0
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            if choice.get("text"):
                last = time.perf_counter()
                first = first or last
                text += choice["text"]
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    conn.close()
    return first - start, last - first, text, tokens


def disk_hit_tokens(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        m = re.search(r'^qatserve_prefix_cache_tier_hit_tokens_total\{tier="disk"\} (\S+)$', r.read().decode(), re.M)
    return int(float(m.group(1))) if m else 0


def start(args, port, cache_dir):
    cmd = [args.binary, "serve", "--model", args.model, "--port", str(port), "--kv-dtype", args.kv_dtype,
           "--kv-memory", args.kv_memory, "--max-model-len", str(args.tokens + args.decode_tokens + 16),
           "--prefix-cache-dir", str(cache_dir)]
    log = tempfile.TemporaryFile("w+")  # serve's messages, shown if it fails to start
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_ready(port, proc, timeout=1200)
    except SystemExit:
        log.seek(0)
        sys.exit(f"serve did not become ready: {' '.join(cmd)}\n" + log.read()[-2000:])
    return proc


def stop(proc):
    proc.terminate()
    proc.wait(timeout=600)


def drop_page_cache():
    """Writes dirty pages out, then empties the page cache: the next reads of the disk tier come from the device."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        sys.exit(f"--drop-caches: cannot write /proc/sys/vm/drop_caches ({e}); run as root")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--kv-dtype", default="bf16")
    ap.add_argument("--kv-memory", default="2G")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--cache-dir", type=Path, help="the disk tier's directory (default: a fresh temporary one)")
    ap.add_argument("--drop-caches", action="store_true", help="empty the page cache before the restart (root)")
    args = ap.parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    rng = random.Random(4141)
    prompt = [rng.randrange(vocab // 4, vocab) for _ in range(args.tokens)]  # past the special and control tokens
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="qatserve-ttft-"))
    port = free_port()
    rows = []
    proc = start(args, port, cache_dir)
    try:
        rows.append(("computed (empty cache)", *streamed_completion(port, prompt, args.decode_tokens)))
        rows.append(("cached in RAM", *streamed_completion(port, prompt, args.decode_tokens)))
    finally:
        stop(proc)
    if args.drop_caches:
        drop_page_cache()
    proc = start(args, port, cache_dir)
    try:
        rows.append(("read from disk after a restart", *streamed_completion(port, prompt, args.decode_tokens)))
        from_disk = disk_hit_tokens(port)
    finally:
        stop(proc)
    if not args.cache_dir:
        shutil.rmtree(cache_dir)
    if len({r[3] for r in rows}) != 1:
        sys.exit("the three answers differ: " + " | ".join(repr(r[3]) for r in rows))
    prefill = rows[0][1]
    print(f"{args.tokens} prompt tokens, {args.kv_dtype} KV, {args.decode_tokens} tokens decoded; "
          f"{from_disk} prompt tokens read from disk after the restart"
          f"{' (page cache dropped before it)' if args.drop_caches else ''}")
    print("| prompt | time to first token (s) | of the prefill | decode tok/s at depth |")
    print("| --- | --- | --- | --- |")
    for name, ttft, rest, _, tokens in rows:
        print(f"| {name} | {ttft:.2f} | {ttft / prefill:.3f} | {(tokens - 1) / rest:.2f} |")
    print(f"prefill: {args.tokens / prefill:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
