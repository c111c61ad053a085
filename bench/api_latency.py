#!/usr/bin/env python3
"""The same request through /v1/chat/completions, /v1/responses and /v1/messages: what the newer APIs add to a
request's latency.

usage: bench/api_latency.py QATSERVE_BINARY [--model DIR] [--rounds N] [--max-tokens T]

Starts `serve` on a free loopback port (the demo model by default) and sends one streaming request per API, in
rotating order each round (A/B/C, B/C/A, C/A/B, ...) so that drift in the machine's speed falls on every API alike:
the same user message, greedy, at most T new tokens (the same tokens through every API: the script checks the
counts each reports once, not streaming, before measuring). Per API it
reports the median time to the first event with generated text (TTFT: a chat delta with content, a
response.output_text.delta, a content_block_delta's text_delta) and the median total latency (request sent to the stream's end), then each newer API's
medians against chat's. The prompt is identical across APIs (the Responses and Messages bodies render to the chat
request's prompt tokens: test_responses_api / test_anthropic_messages), so the difference is the protocol layer.
A measuring tool, not a test: it asserts nothing about speed.
"""
import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prompt_scoring import free_port, wait_ready  # this folder's serve helpers

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Write a sentence about the weather."


def bodies(max_tokens):
    """path, body and the test of an SSE event carrying generated text, per API."""
    common = {"temperature": 0, "stream": True}
    return {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                          "max_tokens": max_tokens, **common}, chat_text),
        "responses": ("/v1/responses", {"input": QUESTION, "max_output_tokens": max_tokens, "store": False, **common},
                      responses_text),
        "messages": ("/v1/messages", {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens,
                                      **common}, messages_text),
    }


# Whether an SSE data payload carries generated text, per API.
def chat_text(event):
    return any(c.get("delta", {}).get("content") for c in event.get("choices", []))


def responses_text(event):
    return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))


def messages_text(event):
    return event.get("type") == "content_block_delta" and bool(event.get("delta", {}).get("text"))


def timed(port, path, body, has_text):
    """(seconds to the first event with generated text, seconds to the end of the stream). The stream is read in
    whatever chunks the socket gives, and only until the first text event are events parsed: the client's own
    per-line work would otherwise count against the API that sends more lines (Responses sends 3 per event)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"{path}: HTTP {r.status}: {r.read()[:300]!r}")
    first, pending = None, b""
    while chunk := r.read1(65536):
        if first is not None:
            continue
        *events, pending = (pending + chunk).split(b"\n\n")
        if any(has_text(json.loads(line[6:])) for e in events for line in e.split(b"\n")
               if line.startswith(b"data: {") and b'"delta"' in line):
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    conn.close()
    return first if first is not None else total, total


def output_tokens(port, path, body, has_text):
    """The completion's token count as the API reports it, not streaming."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps({**body, "stream": False}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        usage = json.loads(r.read())["usage"]
    return usage.get("completion_tokens", usage.get("output_tokens"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--model", default=str(ROOT / "models" / "gemma4-tiny-qat"))
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    apis = bodies(args.max_tokens)
    names = list(apis)
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([args.binary, "serve", "--model", args.model, "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, proc)
            counts = {name: output_tokens(port, *apis[name]) for name in names}  # warm: the prefix cache too
            if len(set(counts.values())) != 1:
                sys.exit(f"the APIs generated different numbers of tokens: {counts}")
            samples = {name: [] for name in names}
            for i in range(args.rounds):
                order = names[i % len(names):] + names[:i % len(names)]
                for name in order:
                    samples[name].append(timed(port, *apis[name]))
        finally:
            proc.terminate()
            proc.wait()
    chat_ttft = statistics.median(s[0] for s in samples["chat"])
    chat_total = statistics.median(s[1] for s in samples["chat"])
    print(f"{args.rounds} rounds, {counts['chat']} tokens each (max {args.max_tokens}), streaming, rotating order\n")
    print("| API | median TTFT (ms) | median total (ms) | TTFT vs chat | total vs chat |")
    print("|---|---|---|---|---|")
    for name in names:
        ttft = statistics.median(s[0] for s in samples[name])
        total = statistics.median(s[1] for s in samples[name])
        print(f"| {apis[name][0]} | {ttft * 1e3:.2f} | {total * 1e3:.2f} | {ttft / chat_ttft - 1:+.1%} | "
              f"{total / chat_total - 1:+.1%} |")


if __name__ == "__main__":
    main()
