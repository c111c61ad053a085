#!/usr/bin/env python3
"""Completions echo (prompt scoring), the tokenizer routes and the fields benchmark clients send, end to end.

usage: test_completions_echo.py QATSERVE_BINARY

Against `serve --model models/gemma4-tiny-qat --precision f32`, with the official openai client and raw HTTP, every
reference computed here at test time (the demo model is retrained from time to time):
- echo with logprobs (string, token-id and batched prompts; max_tokens 0 and > 0): the text starts with the prompt,
  tokens are the Hugging Face tokenizer's, token_logprobs[0] and top_logprobs[0] are null, every other prompt
  token's logprob equals transformers' float32 log-softmax within 1e-4 and the best entry of its top_logprobs is
  transformers' best; a scored prompt's blocks are then adopted by a plain request for it (prefix cache metrics).
- echo while streaming (the openai SDK's streaming completions): each choice's first chunk starts with its prompt,
  as vLLM streams it; the chunks' text and logprobs reassemble to the non-streamed response's, and the prompt's
  scores equal transformers' (string and batched token-id prompts, max_tokens 0 and > 0).
- bad input: echo with n > 1 or best_of, logprobs out of range, max_tokens 0 without echo, a malformed batch,
  a bad X-Request-Id: 400s naming the field.
- POST /tokenize and /detokenize equal the Hugging Face tokenizer (ids, count, max_model_len, prompt text);
  GET /tokenizer_info has tokenizer_config.json's special tokens, the chat template file and model_max_length.
- benchmark clients' fields: max_completion_tokens (chat), ignore_eos, stream_options.continuous_usage_stats (usage in
  every chunk, the SDK's own parse), X-Request-Id echoed in the response headers and in the request's log line,
  chat logprobs/top_logprobs while streaming.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no transformers / openai in .venv).
"""
import json
import os
import sys
import tempfile
from pathlib import Path

from server_harness import SKIP, Checks, Server, sse_frames, wait_for  # noqa: E402

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    print(f"echo test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
TOLERANCE = 1e-4
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "It was a bright cold day in April, and the clocks"]


class EchoSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        self.tokenizer = AutoTokenizer.from_pretrained(MODEL)
        self.model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()

    @torch.no_grad()
    def reference(self, ids):
        """transformers' float32 log-softmax at every position of `ids`."""
        return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def check_scored(self, ids, logprobs, k):
        """The echoed prompt's part of a legacy logprobs object against transformers."""
        ref = self.reference(ids)
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None, logprobs.token_logprobs[:2]
        assert logprobs.text_offset[0] == 0
        assert logprobs.tokens[:len(ids)] == [self.tokenizer.decode([i]) for i in ids], logprobs.tokens
        for p in range(1, len(ids)):
            want = ref[p - 1, ids[p]].item()
            assert abs(logprobs.token_logprobs[p] - want) <= TOLERANCE, (p, logprobs.token_logprobs[p], want)
            top = logprobs.top_logprobs[p]
            assert k <= len(top) <= k + 1, top
            best = ref[p - 1].max().item()
            assert abs(max(top.values()) - best) <= TOLERANCE, (p, top, best)

    # ---- echo ----------------------------------------------------------------------------------------------------

    def echo_string_prompt(self):
        ids = self.tokenizer(PROMPTS[0]).input_ids  # <bos> first, as serve adds it to a string prompt
        r = self.client.completions.create(model="m", prompt=PROMPTS[0], echo=True, logprobs=3, max_tokens=0)
        c = r.choices[0]
        assert c.text == PROMPTS[0] and c.finish_reason == "length", c
        assert len(c.logprobs.tokens) == len(ids) and r.usage.completion_tokens == 0, (c.logprobs.tokens, r.usage)
        assert r.usage.prompt_tokens == len(ids), r.usage
        self.check_scored(ids, c.logprobs, 3)

    def echo_with_generation(self):
        ids = self.tokenizer(PROMPTS[1]).input_ids
        r = self.client.completions.create(model="m", prompt=PROMPTS[1], echo=True, logprobs=1, max_tokens=4,
                                           temperature=0, extra_body={"ignore_eos": True})
        c = r.choices[0]
        assert c.text.startswith(PROMPTS[1]) and len(c.text) > len(PROMPTS[1]), c.text
        assert len(c.logprobs.tokens) == len(ids) + 4 and r.usage.completion_tokens == 4, (c.logprobs, r.usage)
        self.check_scored(ids, c.logprobs, 1)
        # The generated tokens are transformers' greedy ones, with their logprobs.
        seq = list(ids)
        for j in range(4):
            row = self.reference(seq)[-1]
            tok = row.argmax().item()
            assert c.logprobs.tokens[len(ids) + j] == self.tokenizer.decode([tok]), (j, c.logprobs.tokens, tok)
            assert abs(c.logprobs.token_logprobs[len(ids) + j] - row[tok].item()) <= TOLERANCE, j
            seq.append(tok)
        offsets = c.logprobs.text_offset
        assert offsets == sorted(offsets), offsets

    def echo_token_and_batched_prompts(self):
        batch = [self.tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]
        r = self.client.completions.create(model="m", prompt=batch, echo=True, logprobs=2, max_tokens=0)
        assert [c.index for c in r.choices] == [0, 1], r.choices
        assert r.usage.prompt_tokens == sum(map(len, batch)), r.usage
        for c, ids in zip(r.choices, batch):
            assert c.text == self.tokenizer.decode(ids), (c.text, ids)
            self.check_scored(ids, c.logprobs, 2)
        strings = self.client.completions.create(model="m", prompt=PROMPTS, echo=True, max_tokens=0)
        assert [c.text for c in strings.choices] == PROMPTS and strings.choices[0].logprobs is None, strings

    def streamed(self, **kwargs):
        """The openai SDK's streaming completion, reassembled per choice: text, legacy logprobs, finish_reason."""
        out = {}
        for chunk in self.client.completions.create(model="m", stream=True, **kwargs):
            for c in chunk.choices:
                r = out.setdefault(c.index, {"text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [],
                                             "text_offset": [], "finish_reason": None, "chunks": []})
                r["text"] += c.text
                r["chunks"].append(c.text)
                if c.logprobs:
                    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                        r[key] += getattr(c.logprobs, key)
                r["finish_reason"] = c.finish_reason or r["finish_reason"]
        return [out[i] for i in sorted(out)]

    def echo_streaming(self):
        request = dict(prompt=PROMPTS[1], echo=True, logprobs=2, max_tokens=3, temperature=0,
                       extra_body={"ignore_eos": True})
        whole = self.client.completions.create(model="m", **request).choices[0]
        (streamed,) = self.streamed(**request)
        assert streamed["chunks"][0].startswith(PROMPTS[1]), streamed["chunks"]  # the prompt comes first
        assert streamed["text"] == whole.text and streamed["finish_reason"] == whole.finish_reason, (streamed, whole)
        assert streamed["tokens"] == whole.logprobs.tokens, (streamed["tokens"], whole.logprobs.tokens)
        assert streamed["text_offset"] == whole.logprobs.text_offset, streamed["text_offset"]
        for got, want in zip(streamed["token_logprobs"], whole.logprobs.token_logprobs):
            assert (got is None and want is None) or abs(got - want) <= TOLERANCE, (got, want)
        self.check_scored(self.tokenizer(PROMPTS[1]).input_ids, whole.logprobs, 2)
        ids = self.tokenizer(PROMPTS[1]).input_ids
        for p in range(1, len(ids)):  # the streamed prompt scores against transformers too
            assert abs(streamed["token_logprobs"][p] - self.reference(ids)[p - 1, ids[p]].item()) <= TOLERANCE, p
        # A batch of token-id prompts scored only: each choice is its prompt alone, then its finish.
        batch = [self.tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]
        choices = self.streamed(prompt=batch, echo=True, logprobs=1, max_tokens=0)
        assert len(choices) == 2, choices
        for c, ids in zip(choices, batch):
            assert c["text"] == self.tokenizer.decode(ids) and c["finish_reason"] == "length", c
            assert c["token_logprobs"][0] is None and len(c["tokens"]) == len(ids), c
            ref = self.reference(ids)
            for p in range(1, len(ids)):
                assert abs(c["token_logprobs"][p] - ref[p - 1, ids[p]].item()) <= TOLERANCE, (p, c)

    def scoring_publishes_prefix_blocks(self):
        prompt = " ".join([PROMPTS[0]] * 6)  # several KV blocks
        before = self.server.metrics()
        first = self.client.completions.create(model="m", prompt=prompt, echo=True, logprobs=0, max_tokens=0)
        again = self.client.completions.create(model="m", prompt=prompt, echo=True, logprobs=0, max_tokens=0)
        assert first.choices[0].logprobs.token_logprobs == again.choices[0].logprobs.token_logprobs
        self.client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0)
        after = self.server.metrics()
        hits = after["qatserve_prefix_cache_hit_tokens_total"] - before["qatserve_prefix_cache_hit_tokens_total"]
        assert hits >= 16, f"a plain request adopted {hits} positions of the scored prompt"

    def bad_input(self):
        cases = [({"echo": True, "n": 2}, "n"), ({"echo": True, "best_of": 2}, "best_of"),
                 ({"echo": "yes"}, "echo"),
                 ({"echo": True, "logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"),
                 ({"max_tokens": 0}, "max_tokens"), ({"prompt": ["a", 3]}, "prompt"),
                 ({"prompt": [[1, 2], []]}, "prompt"), ({"prompt": [[1, 999999]]}, "prompt")]
        for patch, param in cases:
            status, body = self.server.json("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2, **patch})
            assert status == 400 and body["error"]["param"] == param, (patch, status, body)
        status, _, data = self.server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1},
                                              headers={"X-Request-Id": "has space"})
        assert status == 400 and json.loads(data)["error"]["param"] == "X-Request-Id", (status, data)

    # ---- tokenizer routes ----------------------------------------------------------------------------------------

    def tokenizer_routes(self):
        for add_special in (True, False):
            status, body = self.server.json("POST", "/tokenize",
                                            {"prompt": PROMPTS[1], "add_special_tokens": add_special})
            want = self.tokenizer(PROMPTS[1], add_special_tokens=add_special).input_ids
            assert status == 200 and body["tokens"] == want and body["count"] == len(want), (body, want)
            assert body["max_model_len"] > len(want), body
        ids = self.tokenizer(PROMPTS[0]).input_ids
        status, body = self.server.json("POST", "/detokenize", {"tokens": ids})
        assert status == 200 and body["prompt"] == self.tokenizer.decode(ids), body
        status, info = self.server.json("GET", "/tokenizer_info")
        config = json.loads((MODEL / "tokenizer_config.json").read_text())
        assert status == 200, info
        for key in ("eos_token", "bos_token", "pad_token"):
            assert info[key] == config[key] == getattr(self.tokenizer, key), (key, info.get(key))
        assert info["chat_template"] == (MODEL / "chat_template.jinja").read_text()
        status, models = self.server.json("GET", "/v1/models")
        assert info["model_max_length"] == models["data"][0]["max_model_len"], (info, models)

    # ---- benchmark clients' fields --------------------------------------------------------------------------------

    def max_completion_tokens_and_ignore_eos(self):
        r = self.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                                max_completion_tokens=5, temperature=0,
                                                extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length", r

    def continuous_usage_stats(self):
        chunks = list(self.client.completions.create(
            model="m", prompt=PROMPTS[0], max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True}))
        prompt_tokens = len(self.tokenizer(PROMPTS[0]).input_ids)
        assert all(c.usage is not None and c.usage.prompt_tokens == prompt_tokens for c in chunks), chunks
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 6, counts
        assert all(c.usage.total_tokens == prompt_tokens + c.usage.completion_tokens for c in chunks)
        plain = list(self.client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=2, stream=True,
                                                    stream_options={"include_usage": True}))
        assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 2, plain

    def request_id_header(self):
        rid = "bench-req-0042"
        for body, path in [({"prompt": "Hi", "max_tokens": 2}, "/v1/completions"),
                           ({"prompt": "Hi", "max_tokens": 2, "stream": True}, "/v1/completions"),
                           ({"prompt": "Hi"}, "/tokenize")]:
            status, headers, _ = self.server.request("POST", path, body, headers={"X-Request-Id": rid})
            assert status == 200 and headers.get("x-request-id") == rid, (path, status, headers)
        wait_for(lambda: self.server.log_has(f"x-request-id={rid}"), "the request's log line with its X-Request-Id")
        status, headers, _ = self.server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        assert headers.get("x-request-id", "").startswith("cmpl-"), headers  # none sent: the request's own id

    def chat_stream_logprobs(self):
        status, _, data = self.server.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "stream": True,
            "logprobs": True, "top_logprobs": 2, "ignore_eos": True})
        assert status == 200, data
        entries = [e for f in sse_frames(data)[:-1] for ch in f["choices"] if ch.get("logprobs")
                   for e in ch["logprobs"]["content"]]
        assert len(entries) == 4 and all(len(e["top_logprobs"]) == 2 for e in entries), entries

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "echo", "--precision", "f32")
        try:
            self.server.wait_ready()
            self.client = self.server.client()
            for name, fn in [("echo: string prompt scored = transformers f32", self.echo_string_prompt),
                             ("echo with generation: prompt then greedy tokens", self.echo_with_generation),
                             ("echo: token-id and batched prompts", self.echo_token_and_batched_prompts),
                             ("echo while streaming = non-streamed = transformers", self.echo_streaming),
                             ("a scored prompt's blocks serve later requests", self.scoring_publishes_prefix_blocks),
                             ("bad input: 400s naming the field", self.bad_input),
                             ("/tokenize, /detokenize, /tokenizer_info = the HF tokenizer", self.tokenizer_routes),
                             ("max_completion_tokens and ignore_eos", self.max_completion_tokens_and_ignore_eos),
                             ("stream_options.continuous_usage_stats", self.continuous_usage_stats),
                             ("X-Request-Id in headers and log", self.request_id_header),
                             ("chat logprobs while streaming", self.chat_stream_logprobs)]:
                self.check(name, fn)
        finally:
            self.server.stop()
        return self.summary("echo and benchmark fields test", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-echo-") as tmp:
        return EchoSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
