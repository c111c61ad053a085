"""The OpenAI API on the main server of test_openai_server.py: models, tokenize, chat and text completions streaming
and not, stop strings, seeds and n > 1, logprobs, concurrent streams, a client gone mid-stream, bad requests, and
greedy output equal to `qatserve generate`."""
import concurrent.futures as futures
import json
import random
import socket
import struct
import subprocess

from server_harness import cpu_model_name, ids_from_logprobs, sse_frames, wait_for

import openai  # after server_harness, which exits 77 without it


class ApiChecks:
    """The checks of the OpenAI API on the main server.

    Mixed into test_openai_server.Suite, which sets self.binary, self.model (the synthesized checkpoint),
    self.workdir, self.a (the main server) and self.client (the openai client on it).
    """

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
