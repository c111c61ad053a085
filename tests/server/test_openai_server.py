#!/usr/bin/env python3
"""End-to-end test of `qatserve serve` with the official `openai` client and raw HTTP.

usage: test_openai_server.py QATSERVE_BINARY

Synthesizes the tiny E2B checkpoint with the demo tokenizer, starts servers on free ports and checks every endpoint:
streaming and not, usage, stop strings, seeds, n > 1, logprobs, 16 concurrent streams, a client that disconnects
mid-stream, bad JSON / parameters / bodies, API keys, queue overflow (429), greedy output equal to
`qatserve generate --print-ids` (alone and in a batch of 8), /metrics read by prometheus_client's parser, and
SIGTERM/SIGINT draining to exit 0 (a stream signalled midway runs to its full length; past --drain-timeout it is
aborted). No check depends on how fast the machine is: waits end on events (a log line, a metric, the end of a
stream), and their deadlines only stop a hung test.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no demo tokenizer, or no openai / prometheus_client
package).
"""
import concurrent.futures as futures
import http.client
import errno
import json
import os
import random
import re
import signal
import socket
import struct
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


class Suite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary = binary
        self.workdir = Path(workdir)
        self.model = self.workdir / "tiny-e2b"

    # ---- the main server ----------------------------------------------------------------------------------------

    def health_and_models(self):
        body = self.health
        assert body["status"] == "ok" and body["backend"] == "cpu", body
        assert body["device"] == cpu_model_name(), body
        assert body["model"] == "tiny-e2b", body
        # the synthetic embedding lies on the QAT grid, so the LM head is its lossless int4 repack
        assert body["precision"] == {"weights": "bf16", "lm_head": "w4_int4", "activations": "bf16", "kv_cache": "bf16"}, body
        if self.a.saw_loading is not None:
            assert self.a.saw_loading["status"] == "loading"
        models = self.client.models.list()
        assert [m.id for m in models.data] == ["tiny-e2b"], models
        status, raw = self.a.json("GET", "/v1/models")
        assert status == 200 and raw["object"] == "list" and raw["data"][0]["max_model_len"] == 4096, raw

    def tokenize_detokenize(self):
        status, t = self.a.json("POST", "/tokenize", {"prompt": "Hello world"})
        assert status == 200 and t["tokens"][0] == 2 and t["count"] == len(t["tokens"]), t
        status, d = self.a.json("POST", "/detokenize", {"tokens": t["tokens"]})
        assert status == 200 and d["prompt"] == "<bos>Hello world", d
        status, c = self.a.json("POST", "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200 and c["tokens"][0] == 2 and c["count"] > 3, c
        status, e = self.a.json("POST", "/detokenize", {"tokens": [-5]})
        assert status == 400 and e["error"]["param"] == "tokens", e

    def chat(self):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
        r = self.client.chat.completions.create(model="tiny-e2b", messages=messages, max_tokens=12, temperature=0)
        assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
        c = r.choices[0]
        assert c.message.role == "assistant" and isinstance(c.message.content, str), c
        _, tok = self.a.json("POST", "/tokenize", {"messages": messages})
        assert r.usage.prompt_tokens == tok["count"], (r.usage, tok["count"])
        assert c.finish_reason in ("stop", "length"), c
        if c.finish_reason == "length":
            assert r.usage.completion_tokens == 12, r.usage
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

        # Streaming: a role chunk, content deltas, a finish chunk, a usage chunk; the same text as above.
        stream = self.client.chat.completions.create(model="tiny-e2b", messages=messages, max_tokens=12, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == c.message.content, (text, c.message.content)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert finishes == [c.finish_reason], finishes
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens, chunks[-1]
        assert all(ch.usage is None for ch in chunks[:-1])

        # Raw SSE: strict UTF-8 per body, [DONE] last, every chunk the same id.
        status, headers, data = self.a.request("POST", "/v1/chat/completions", {
            "messages": messages, "max_tokens": 12, "temperature": 0, "stream": True})
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), headers
        frames = sse_frames(data)
        assert frames[-1] == "[DONE]" and len({f["id"] for f in frames[:-1]}) == 1
        assert all("usage" not in f for f in frames[:-1])  # no include_usage: no usage field
        assert "".join(f["choices"][0]["delta"].get("content") or "" for f in frames[:-1]) == text

    def completions(self):
        prompt = "Once upon a time"
        r = self.client.completions.create(model="tiny-e2b", prompt=prompt, max_tokens=10, temperature=0)
        assert r.object == "text_completion" and r.id.startswith("cmpl-"), r
        _, tok = self.a.json("POST", "/tokenize", {"prompt": prompt})
        assert r.usage.prompt_tokens == tok["count"], (r.usage, tok)
        s = self.client.completions.create(model="tiny-e2b", prompt=prompt, max_tokens=10, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(s)
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert text == r.choices[0].text, (text, r.choices[0].text)
        assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
        # A prompt given as token ids is used as is.
        ids = self.client.completions.create(model="tiny-e2b", prompt=tok["tokens"], max_tokens=10, temperature=0)
        assert ids.choices[0].text == r.choices[0].text and ids.usage.prompt_tokens == tok["count"]

    def stop_strings(self):
        base = dict(model="tiny-e2b", prompt="The weather today", max_tokens=40, temperature=0)
        full = self.client.completions.create(**base).choices[0].text
        assert len(full) >= 8, full
        probe = full[len(full) // 2:len(full) // 2 + 3]
        cut = full.find(probe)
        r = self.client.completions.create(**base, stop=[probe, "\u2603never"])
        assert r.choices[0].text == full[:cut] and r.choices[0].finish_reason == "stop", (r.choices[0], probe, full)
        s = self.client.completions.create(**base, stop=probe, stream=True)
        chunks = list(s)
        assert "".join(ch.choices[0].text for ch in chunks) == full[:cut]
        assert chunks[-1].choices[0].finish_reason == "stop"

    def seeds(self):
        def sample(seed, **kw):
            return self.client.chat.completions.create(
                model="tiny-e2b", messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=16,
                temperature=1.0, top_p=1.0, seed=seed, extra_body={"top_k": 0}, **kw)
        a, b, c = sample(1234), sample(1234), sample(5678)
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.choices[0].message.content != c.choices[0].message.content
        # n > 1: choice i samples with seed + i, so it equals a single request with that seed.
        n = sample(1234, n=3)
        assert [ch.index for ch in n.choices] == [0, 1, 2]
        assert n.choices[0].message.content == a.choices[0].message.content
        single = [sample(1234 + i).choices[0].message.content for i in (1, 2)]
        assert [ch.message.content for ch in n.choices[1:]] == single
        assert n.usage.completion_tokens == sum(
            sample(1234 + i).usage.completion_tokens for i in range(3)), n.usage
        # n > 1 streaming: deltas of each index add up to that choice's text.
        stream = sample(1234, n=3, stream=True)
        texts = {}
        for ch in stream:
            for choice in ch.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        assert [texts[i] for i in range(3)] == [ch.message.content for ch in n.choices], texts

    def logprobs(self):
        r = self.client.chat.completions.create(
            model="tiny-e2b", messages=[{"role": "user", "content": "Count"}], max_tokens=8, temperature=0,
            logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
        for entry in content:
            assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
            # Greedy with no penalties: the chosen token is the most likely one.
            assert abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-6, entry
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        c = self.client.completions.create(model="tiny-e2b", prompt="Count", max_tokens=6, temperature=0, logprobs=2)
        lp = c.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        assert len(lp.tokens) == c.usage.completion_tokens
        assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)

    def concurrent_streams(self):
        prompts = [f"Question number {i}: what is {i} plus {i}?" for i in range(16)]
        expected = [self.client.chat.completions.create(
            model="tiny-e2b", messages=[{"role": "user", "content": p}], max_tokens=48, temperature=0)
            for p in prompts]

        def stream(i):
            s = self.client.chat.completions.create(model="tiny-e2b", messages=[{"role": "user", "content": prompts[i]}],
                                                    max_tokens=48, temperature=0, stream=True)
            text, finish = "", None
            for ch in s:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
            return text, finish

        with futures.ThreadPoolExecutor(16) as pool:
            got = list(pool.map(stream, range(16)))
        assert any(any(ord(ch) > 127 for ch in text) for text, _ in got), "no multi-byte characters streamed"
        for i, (text, finish) in enumerate(got):
            assert finish == expected[i].choices[0].finish_reason, (i, finish)
            assert text == expected[i].choices[0].message.content, (i, text, expected[i].choices[0].message.content)

    def disconnect(self):
        # The client resets the connection after 5 frames of a 4000-token stream. The server counts an abort and
        # the engine drops the sequence: its batch empties after far fewer steps than the 4000 tokens would take.
        max_tokens = 4000
        before = self.a.metrics()
        body = json.dumps({"prompt": [2, 10, 11, 12], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
                           "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.a.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        received = b""
        while received.count(b"data: ") < 5:
            data = s.recv(65536)
            assert data, received
            received += data
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, as a killed client
        s.close()

        def gone():
            m = self.a.metrics()
            aborted = m['qatserve_requests_total{outcome="abort"}'] - before['qatserve_requests_total{outcome="abort"}']
            return m if aborted == 1 and m["qatserve_requests_running"] == 0 else None

        m = wait_for(gone, "the abort counted and the running batch empty")
        steps = m["qatserve_engine_steps_total"] - before["qatserve_engine_steps_total"]
        assert steps < max_tokens, f"the engine kept generating for a client that left: {steps} steps"
        generated = m["qatserve_generation_tokens_total"] - before["qatserve_generation_tokens_total"]
        assert 5 <= generated < max_tokens, generated
        print(f"  client gone after {generated} of {max_tokens} tokens; the engine took {steps} steps", flush=True)
        # The server still serves.
        r = self.client.completions.create(model="tiny-e2b", prompt="ok", max_tokens=2, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")

    def bad_requests(self):
        status, headers, data = self.a.request("POST", "/v1/chat/completions", b"{not json")
        err = json.loads(data)
        assert status == 400 and err["error"]["type"] == "invalid_request_error" and "code" in err["error"], err
        status, err = self.a.json("POST", "/v1/completions", [1, 2])
        assert status == 400, err
        msgs = [{"role": "user", "content": "x"}]
        for patch, param in [({"temperature": "hot"}, "temperature"), ({"top_p": 2}, "top_p"), ({"n": 0}, "n"),
                             ({"top_k": 1.5}, "top_k"), ({"logit_bias": {"x": 1}}, "logit_bias"),
                             ({"presence_penalty": 9}, "presence_penalty"), ({"stop": 3}, "stop"),
                             ({"max_tokens": -1}, "max_tokens"), ({"top_logprobs": 2}, "top_logprobs"),
                             ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
                             ({"messages": "x"}, "messages")]:
            body = {"messages": msgs, **patch}
            status, err = self.a.json("POST", "/v1/chat/completions", body)
            assert status == 400 and err["error"]["param"] == param, (patch, status, err)
            assert err["error"]["type"] == "invalid_request_error" and err["error"]["code"] is None, err
        # Through the client: a BadRequestError whose body names the parameter.
        try:
            self.client.chat.completions.create(model="tiny-e2b", messages=msgs, temperature=-1)
            raise AssertionError("temperature -1 accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == "temperature", e.body
        # Unknown fields are ignored.
        status, ok = self.a.json("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "whatever": [1]})
        assert status == 200, ok
        # The context: a prompt too long, and max_tokens beyond what is left; the message gives the numbers.
        status, err = self.a.json("POST", "/v1/completions", {"prompt": [2] * 5000, "max_tokens": 1})
        assert status == 400 and err["error"]["param"] == "prompt" and "4096" in err["error"]["message"], err
        status, err = self.a.json("POST", "/v1/completions", {"prompt": [2, 3, 4], "max_tokens": 4094})
        assert status == 400 and err["error"]["param"] == "max_tokens" and "4097" in err["error"]["message"], err
        # Oversized body: 413 with an error body.
        big = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'
        status, _, data = self.a.request("POST", "/v1/completions", big)
        assert status == 413 and "error" in json.loads(data), (status, data[:200])
        # No such route.
        status, err = self.a.json("GET", "/v1/nothing")
        assert status == 404 and "error" in err, err

    def greedy_matches_generate(self):
        rng = random.Random(7)
        prompts = [[2] + [rng.randrange(3, 4096) for _ in range(n)] for n in (2, 5, 9, 14, 22, 31, 47, 64)]
        max_tokens = 24

        def generate(p):
            out = subprocess.run([self.binary, "generate", "--model", str(self.model), "--tokens",
                                  ",".join(map(str, p)), "--temperature", "0", "--max-tokens", str(max_tokens),
                                  "--print-ids"], capture_output=True, text=True, timeout=60, check=True)
            line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
            return [int(x) for x in line.split(",") if x]

        def served(p, stream):
            body = {"prompt": p, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0,
                    "return_tokens_as_token_ids": True, "stream": stream}
            status, _, data = self.a.request("POST", "/v1/completions", body)
            assert status == 200, data
            if not stream:
                return ids_from_logprobs(json.loads(data)["choices"][0]["logprobs"]["tokens"])
            ids = []
            for f in sse_frames(data)[:-1]:
                if f["choices"][0]["logprobs"]:
                    ids += ids_from_logprobs(f["choices"][0]["logprobs"]["tokens"])
            return ids

        with futures.ThreadPoolExecutor(4) as pool:
            expected = list(pool.map(generate, prompts))
        assert any(len(e) == max_tokens for e in expected), expected
        # Alone, not streaming and streaming.
        for p, e in zip(prompts[:3], expected[:3]):
            assert served(p, False) == e, (p, e)
            assert served(p, True) == e, (p, e)
        # In a batch of 8 running together, streaming and not.
        with futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: served(prompts[i], i % 2 == 1), range(8)))
        for i in range(8):
            assert got[i] == expected[i], (i, got[i], expected[i])

    def metrics_exposition(self):
        # prometheus_client's parser reads the whole body (it raises on anything malformed); every family has its
        # type and help, the labels it should, and histograms whose buckets are cumulative and end at +Inf = count.
        # (vLLM's names for the same measurements: vllm_metrics.)
        families = {n: f for n, f in self.a.metric_families().items() if n.startswith("qatserve_")}
        counters = ["qatserve_requests", "qatserve_prompt_tokens", "qatserve_generation_tokens",
                    "qatserve_prefix_cache_hit_tokens", "qatserve_prefix_cache_query_tokens",
                    "qatserve_prefix_cache_tier_hit_tokens", "qatserve_preemptions",
                    "qatserve_engine_steps", "qatserve_http_connections_refused", "qatserve_http_timeouts",
                    "qatserve_media_encode", "qatserve_media_cache_hits",
                    "qatserve_spec_decode_drafts", "qatserve_spec_decode_draft_tokens",
                    "qatserve_spec_decode_accepted_tokens"]
        histograms = ["qatserve_time_to_first_token_seconds", "qatserve_time_per_output_token_seconds",
                      "qatserve_inter_token_latency_seconds", "qatserve_e2e_request_latency_seconds"]
        gauges = ["qatserve_ready", "qatserve_requests_running", "qatserve_requests_waiting",
                  "qatserve_kv_cache_used_tokens", "qatserve_kv_cache_total_tokens", "qatserve_kv_cache_used_bytes",
                  "qatserve_kv_cache_total_bytes", "qatserve_kv_cache_blocks_used", "qatserve_kv_cache_blocks_total",
                  "qatserve_kv_cache_info", "qatserve_resident_memory_bytes", "qatserve_planned_resident_bytes", "qatserve_weight_bytes",
                  "qatserve_http_connections", "qatserve_spec_decode_acceptance_rate"]
        expected = {**{n: "counter" for n in counters}, **{n: "histogram" for n in histograms},
                    **{n: "gauge" for n in gauges}}
        assert {n: f.type for n, f in families.items()} == expected, {n: f.type for n, f in families.items()}
        for name, f in families.items():
            assert f.documentation, f"{name} has no HELP"
            for sample in f.samples:
                assert sample.value >= 0 and sample.timestamp is None, (name, sample)
                if f.type == "counter":
                    assert sample.name == name + "_total", sample
        outcomes = {s.labels["outcome"] for s in families["qatserve_requests"].samples}
        assert outcomes == {"stop", "length", "abort", "error", "rejected"}, outcomes
        assert [s.labels for s in families["qatserve_weight_bytes"].samples] == [{"device": "cpu"}]
        assert [s.labels for s in families["qatserve_kv_cache_info"].samples] == [{"dtype": "bf16"}]
        tiers = [s.labels for s in families["qatserve_prefix_cache_tier_hit_tokens"].samples]
        assert tiers == [{"tier": "ram"}, {"tier": "disk"}], tiers
        unlabelled = set(families) - {"qatserve_requests", "qatserve_weight_bytes", "qatserve_kv_cache_info",
                                      "qatserve_prefix_cache_tier_hit_tokens", *histograms}
        for name in unlabelled:
            assert [s.labels for s in families[name].samples] == [{}], (name, families[name].samples)
        for name in histograms:
            samples = families[name].samples
            buckets = [s for s in samples if s.name == name + "_bucket"]
            assert all(set(s.labels) == {"le"} for s in buckets), buckets
            bounds = [float(s.labels["le"]) for s in buckets]
            counts = [s.value for s in buckets]
            assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), (name, bounds)
            assert bounds[-1] == float("inf"), (name, bounds)
            assert counts == sorted(counts), (name, counts)
            total = {s.name: s.value for s in samples if s.name != name + "_bucket"}
            assert set(total) == {name + "_sum", name + "_count"}, total
            assert counts[-1] == total[name + "_count"] > 0, (name, counts[-1], total)
        m = self.a.metrics()
        assert m['qatserve_requests_total{outcome="length"}'] > 0 and m['qatserve_requests_total{outcome="rejected"}'] > 0
        assert m["qatserve_prompt_tokens_total"] > 0 and m["qatserve_generation_tokens_total"] > 0
        assert m['qatserve_weight_bytes{device="cpu"}'] > 0 and m["qatserve_resident_memory_bytes"] > 1e6
        assert m["qatserve_kv_cache_total_tokens"] > 0 and m["qatserve_ready"] == 1
        assert 0 <= m["qatserve_kv_cache_blocks_used"] <= m["qatserve_kv_cache_blocks_total"] > 0
        # One log line per request with its numbers.
        lines = [l for l in self.a.log_text().splitlines() if " prompt=" in l and " outcome=" in l]
        assert len(lines) > 20 and all("ttft=" in l and "tok/s" in l for l in lines), lines[:3]

    # ---- other servers ------------------------------------------------------------------------------------------

    def slow_loading_server(self, name):
        """A server whose config.json is a named pipe: the model load waits until the test writes it. Meanwhile the
        server already listens. Returns (server, config bytes, pipe path) once /health has answered."""
        slow = self.workdir / name
        subprocess.run(["cp", "-r", str(self.model), str(slow)], check=True)
        config = (slow / "config.json").read_bytes()
        (slow / "config.json").unlink()
        os.mkfifo(slow / "config.json")
        d = Server(self.binary, slow, self.workdir, f"server-{name}")
        try:
            def health():
                assert d.proc.poll() is None, d.log_text()
                try:
                    return d.json("GET", "/health")
                except (ConnectionRefusedError, ConnectionResetError):
                    return None

            status, body = wait_for(health, "the server listening")
            assert status == 503 and body["status"] == "loading", (status, body)
        except BaseException:
            d.kill()  # it would wait on the pipe forever
            raise
        return d, config, slow / "config.json"

    def loading(self):
        # /health answers 503 "loading" and generation 503 until the model has loaded and run once.
        d, config, pipe = self.slow_loading_server("tiny-e2b-slow")
        try:
            status, err = d.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
            assert status == 503 and "loading" in err["error"]["message"], (status, err)
            write_fifo(pipe, config)
            ready = d.wait_ready()
            assert ready["status"] == "ok" and ready["model"] == "tiny-e2b-slow", ready
            r = d.client().completions.create(model="tiny-e2b-slow", prompt="hi", max_tokens=2)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert d.stop() == 0, d.log_text()
        finally:
            d.kill()
        # SIGTERM while loading is a clean stop too.
        e, _, _ = self.slow_loading_server("tiny-e2b-stuck")
        try:
            assert e.stop() == 0, e.log_text()
            assert "interrupted while loading" in e.log_text(), e.log_text()
        finally:
            e.kill()

    def startup_failures(self):
        # A busy port and a missing model: exit 1 with the reason, at once.
        for args, reason in [(["--model", str(self.model), "--port", str(self.a.port)], "cannot listen"),
                             (["--model", str(self.workdir / "no-such-model"), "--port", str(free_port())],
                              "no-such-model")]:
            out = subprocess.run([self.binary, "serve", *args], capture_output=True, text=True, timeout=20)
            assert out.returncode == 1 and reason in out.stderr, (args, out.returncode, out.stderr)
        assert self.a.request("GET", "/health")[0] == 200  # the first server still owns its port

    def api_key(self):
        b = Server(self.binary, self.model, self.workdir, "server-key", "--api-key", "sekrit")
        try:
            b.wait_ready()
            assert b.request("GET", "/health")[0] == 200  # open without a key
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
                status, err = b.json("GET", "/v1/models", headers=headers)
                assert status == 401 and err["error"]["code"] == "invalid_api_key", (headers, status, err)
            assert b.request("GET", "/metrics")[0] == 401
            try:
                b.client("wrong").chat.completions.create(model="tiny-e2b", messages=[{"role": "user", "content": "x"}])
                raise AssertionError("wrong key accepted")
            except openai.AuthenticationError as e:
                assert e.status_code == 401
            r = b.client("sekrit").chat.completions.create(
                model="tiny-e2b", messages=[{"role": "user", "content": "x"}], max_tokens=3)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert b.stop(signal.SIGINT) == 0, b.log_text()
        finally:
            b.kill()

    def queue_overflow(self):
        c = Server(self.binary, self.model, self.workdir, "server-queue", "--max-running", "1", "--max-waiting", "1")
        try:
            c.wait_ready()
            body = {"prompt": [2, 5, 6, 7], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
            with futures.ThreadPoolExecutor(12) as pool:
                results = list(pool.map(lambda _: c.request("POST", "/v1/completions", body), range(12)))
            statuses = [r[0] for r in results]
            assert 200 in statuses and 429 in statuses, statuses
            assert set(statuses) <= {200, 429}, statuses
            for status, headers, data in results:
                if status == 429:
                    err = json.loads(data)["error"]
                    assert headers.get("retry-after") and err["type"] and "capacity" in err["message"], (headers, err)
                else:
                    assert json.loads(data)["usage"]["completion_tokens"] == 1000
            m = c.metrics()
            assert m['qatserve_requests_total{outcome="rejected"}'] == statuses.count(429), m
            assert c.stop(signal.SIGTERM) == 0, c.log_text()
        finally:
            c.kill()

    # ---- what an operator configures, and the metrics routers read (vLLM's names) ------------------------------

    def vllm_metrics(self):
        """/metrics has vLLM's families with vLLM's types and labels, from the same measurements as ours; KV usage
        is a fraction, read while a stream holds KV."""
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 8  # several complete KV blocks
        for _ in range(2):  # the second adopts the first's blocks from the prefix cache
            self.client.completions.create(model="tiny-e2b", prompt=long_prompt, max_tokens=2, temperature=0)
        conn = http.client.HTTPConnection("127.0.0.1", self.a.port, timeout=HANG_STOP)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "prompt": "Tell me a long story about the sea", "max_tokens": 3000, "ignore_eos": True, "stream": True}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.readline().startswith(b"data: ")  # the stream is running: it holds KV blocks
        labels = '{model_name="tiny-e2b",engine="0"}'
        # The engine updates its KV gauges at the end of a step, after handing out the step's tokens.
        during = wait_for(lambda: (m := self.a.metrics())["vllm:kv_cache_usage_perc" + labels] > 0 and m,
                          "KV usage counted while the stream runs")
        conn.close()
        assert during["vllm:num_requests_running" + labels] >= 1, during
        assert 0 < during["vllm:kv_cache_usage_perc" + labels] <= 1, during

        families = self.a.metric_families()
        expected = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
                    "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_hits": "counter",
                    "vllm:prefix_cache_queries": "counter", "vllm:num_preemptions": "counter",
                    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
                    "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
                    "vllm:inter_token_latency_seconds": "histogram",
                    "vllm:time_per_output_token_seconds": "histogram",
                    "vllm:request_time_per_output_token_seconds": "histogram",
                    "vllm:e2e_request_latency_seconds": "histogram", "vllm:spec_decode_num_drafts": "counter",
                    "vllm:spec_decode_num_draft_tokens": "counter", "vllm:spec_decode_num_accepted_tokens": "counter"}
        for name, kind in expected.items():
            assert name in families, f"{name} missing"
            assert families[name].type == kind, (name, families[name].type)
            for sample in families[name].samples:
                assert sample.labels["model_name"] == "tiny-e2b" and sample.labels["engine"] == "0", sample
        assert "vllm:lora_requests_info" not in families, "written without LoRA serving"  # as vLLM without --enable-lora
        cache = families["vllm:cache_config_info"].samples
        assert [s.value for s in cache] == [1] and cache[0].labels["engine"] == "0", cache
        assert cache[0].labels["cache_dtype"] == "bfloat16" and cache[0].labels["block_size"] == "16", cache
        # Every value below from that one scrape (the stream closed above may end between two).
        m = sample_values(families)
        usage = m["vllm:kv_cache_usage_perc" + labels]
        assert 0 <= usage <= 1, usage
        success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples
                   if s.name == "vllm:request_success_total"}
        for reason in ("stop", "length", "abort"):
            assert success[reason] == m[f'qatserve_requests_total{{outcome="{reason}"}}'], (reason, success, m)
        assert "rejected" not in success
        hits, queries = m["vllm:prefix_cache_hits_total" + labels], m["vllm:prefix_cache_queries_total" + labels]
        assert 0 < hits <= queries, (hits, queries)
        assert hits == m["qatserve_prefix_cache_hit_tokens_total"], (hits, m)
        assert m["vllm:e2e_request_latency_seconds_count" + labels] == m["qatserve_e2e_request_latency_seconds_count"]
        assert m["vllm:inter_token_latency_seconds_count" + labels] > 0
        print(f"  kv usage {usage:.4f} now, {during['vllm:kv_cache_usage_perc' + labels]:.4f} during a stream; "
              f"prefix cache {hits:.0f} of {queries:.0f} tokens hit", flush=True)

    def operator_flags(self):
        """--served-model-name (vLLM's 404 for other names), --max-model-len, --threads, --api-key-file and
        --log-format json, end to end with the openai client; every log line is one JSON object."""
        key_file = self.workdir / "api-key"
        key_file.write_text("sk-from-file\n")
        o = Server(self.binary, self.model, self.workdir, "server-operator", "--served-model-name", "gemma-test",
                   "--max-model-len", "64", "--threads", "1", "--api-key-file", str(key_file), "--log-format", "json")
        try:
            o.wait_ready()
            client = o.client("sk-from-file")
            assert [m.id for m in client.models.list().data] == ["gemma-test"]
            status, raw = o.json("GET", "/v1/models", headers={"Authorization": "Bearer sk-from-file"})
            assert status == 200 and raw["data"][0]["max_model_len"] == 64, raw
            r = client.chat.completions.create(model="gemma-test", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=4, temperature=0)
            assert r.model == "gemma-test" and r.choices[0].finish_reason in ("stop", "length"), r
            try:
                client.chat.completions.create(model="tiny-e2b", messages=[{"role": "user", "content": "Hi"}])
                raise AssertionError("a request for another model was served")
            except openai.NotFoundError as e:
                err = e.response.json()["error"]
                assert e.status_code == 404 and err["type"] == "NotFoundError" and err["code"] == 404, err
                assert err["message"] == "The model `tiny-e2b` does not exist.", err
            try:
                client.completions.create(model="gemma-test", prompt="word " * 80, max_tokens=4)
                raise AssertionError("a prompt past --max-model-len was served")
            except openai.BadRequestError as e:
                assert "64" in e.response.json()["error"]["message"], e.response.text
            try:
                o.client("sk-wrong").models.list()
                raise AssertionError("a wrong key was let in")
            except openai.AuthenticationError:
                pass
            status, _, data = o.request("GET", "/metrics", headers={"Authorization": "Bearer sk-from-file"})
            assert status == 200, status
            running = [s for f in text_string_to_metric_families(data.decode()) for s in f.samples
                       if s.name == "vllm:num_requests_running"]
            assert [s.labels for s in running] == [{"model_name": "gemma-test", "engine": "0"}], running
            assert o.stop(signal.SIGTERM) == 0
            lines = [json.loads(line) for line in o.log_text().splitlines() if line.strip()]
            events = {line["event"]: line for line in lines}
            for event in ("listening", "loaded", "kv_pool", "warm_up", "ready", "request", "draining", "stopped"):
                assert event in events, (event, [line["event"] for line in lines])
            assert events["loaded"]["max_model_len"] == 64 and events["loaded"]["threads"] == 1, events["loaded"]
            # The default KV pool is sized for --max-running contexts of 64 tokens, not of the model's 4096.
            main_pool = self.a.metrics()["qatserve_kv_cache_total_bytes"]
            assert events["kv_pool"]["kv_bytes"] < main_pool / 8, (events["kv_pool"], main_pool)
            assert "memory plan" in events["kv_pool"]["source"], events["kv_pool"]
            request = next(line for line in lines if line["event"] == "request" and line["outcome"] != "abort")
            for field in ("id", "path", "n", "prompt_tokens", "completion_tokens", "ttft_s", "tokens_per_s",
                          "latency_s", "outcome", "time", "level", "message"):
                assert field in request, (field, request)
            rejected = [line for line in lines if line["event"] == "rejected"]
            assert any(line["status"] == 404 for line in rejected), rejected
        finally:
            o.kill()

    def api_key_from_environment(self):
        """QATSERVE_API_KEY sets the key, out of sight of `ps`."""
        e = Server(self.binary, self.model, self.workdir, "server-env-key",
                   env={**os.environ, "QATSERVE_API_KEY": "sk-from-env"})
        try:
            e.wait_ready()
            assert "sk-from-env" not in " ".join(e.proc.args)
            assert [m.id for m in e.client("sk-from-env").models.list().data] == ["tiny-e2b"]
            status, _ = e.json("GET", "/v1/models")
            assert status == 401, status
            assert e.stop(signal.SIGTERM) == 0
        finally:
            e.kill()

    def stream_through_sigterm(self, server, max_tokens=4000, frames_before_signal=8):
        """Streams a completion of max_tokens (ignore_eos) from `server` and sends it SIGTERM at the given frame.
        Once the log says the shutdown began, a new connection must be refused. Returns (token ids before the
        signal, token ids after it, the finish reason, the exit status, the shutdown log line)."""
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_STOP)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "prompt": [2, 9, 8], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        before, after, finish, frames = [], [], None, 0
        for line in iter(r.readline, b""):
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            choice = json.loads(line[len(b"data: "):])["choices"][0]
            (after if frames >= frames_before_signal else before).extend(
                ids_from_logprobs(choice["logprobs"]["tokens"]) if choice["logprobs"] else [])
            finish = choice["finish_reason"] or finish
            frames += 1
            if frames == frames_before_signal:
                server.proc.send_signal(signal.SIGTERM)
                wait_for(lambda: server.log_has("serve: shutting down"), "the shutdown log line")
                try:
                    server.request("GET", "/health", timeout=HANG_STOP)
                    raise AssertionError("still accepting connections after SIGTERM")
                except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
                    pass
        conn.close()
        rc = server.stop(timeout=HANG_STOP)
        shutdown = [l for l in server.log_text().splitlines() if "serve: shutting down" in l]
        return before, after, finish, rc, shutdown[0]

    def sigterm_drains(self):
        # The main server (--drain-timeout 300) is signalled at the 8th frame of a 4000-token stream. The log proves
        # the stream was still running when the drain began; it then runs to its full length, exit 0.
        before, after, finish, rc, shutdown = self.stream_through_sigterm(self.a)
        print(f"  {len(before)} tokens before the signal, {len(after)} after; {shutdown}", flush=True)
        assert "finishing 1 running and 0 waiting sequences" in shutdown, (shutdown, len(before))
        assert len(after) > 0, "no token arrived after the signal"
        assert finish == "length" and len(before) + len(after) == 4000, (finish, len(before), len(after))
        assert rc == 0, (rc, self.a.log_text()[-2000:])
        assert "serve: stopped" in self.a.log_text()

    def sigterm_past_drain_timeout_aborts(self):
        # With --drain-timeout 0 the stream running at the signal ends at once with finish_reason "abort", exit 0.
        d = Server(self.binary, self.model, self.workdir, "server-no-grace", "--drain-timeout", "0")
        try:
            d.wait_ready()
            before, after, finish, rc, shutdown = self.stream_through_sigterm(d)
            print(f"  {len(before)} tokens before the signal, {len(after)} after; {shutdown}", flush=True)
            assert "finishing 1 running and 0 waiting sequences (up to 0 s)" in shutdown, (shutdown, len(before))
            assert finish == "abort" and len(before) + len(after) < 4000, (finish, len(before), len(after))
            assert rc == 0, (rc, d.log_text()[-2000:])
        finally:
            d.kill()

    def run(self):
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(self.model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        # A drain timeout far beyond what the SIGTERM check's stream needs on a slow machine: it only stops a hang.
        self.a = Server(self.binary, self.model, self.workdir, "server-main", "--drain-timeout", str(HANG_STOP))
        try:
            self.health = self.a.wait_ready()
            self.client = self.a.client()
            for name, fn in [
                ("health and models", self.health_and_models),
                ("tokenize and detokenize", self.tokenize_detokenize),
                ("chat completions, streaming and not, usage", self.chat),
                ("completions, streaming and not", self.completions),
                ("stop strings", self.stop_strings),
                ("seeds and n > 1", self.seeds),
                ("logprobs", self.logprobs),
                ("16 concurrent streams", self.concurrent_streams),
                ("client disconnects mid-stream", self.disconnect),
                ("bad requests", self.bad_requests),
                ("greedy output equals qatserve generate, alone and in a batch of 8", self.greedy_matches_generate),
                ("metrics and request log", self.metrics_exposition),
                ("503 while loading, then ready; SIGTERM while loading", self.loading),
                ("startup failures exit 1", self.startup_failures),
                ("api key", self.api_key),
                ("vLLM's metric names for routers", self.vllm_metrics),
                ("operator flags: served model name, max model len, threads, key file, JSON log", self.operator_flags),
                ("api key from QATSERVE_API_KEY", self.api_key_from_environment),
                ("queue overflow -> 429", self.queue_overflow),
                ("SIGTERM past --drain-timeout aborts the stream, exits 0", self.sigterm_past_drain_timeout_aborts),
                ("SIGTERM drains a running stream to its full length and exits 0", self.sigterm_drains),
            ]:
                self.check(name, fn)
        finally:
            self.a.kill()
        return self.summary("server checks", self.a)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    if not (DEMO_TOKENIZER / "tokenizer.json").exists():
        print(f"server test skipped: {DEMO_TOKENIZER}/tokenizer.json is missing")
        return SKIP
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-server-test-") as tmp:
        rc = Suite(binary, tmp).run()
    print(f"server test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
