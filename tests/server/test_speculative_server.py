#!/usr/bin/env python3
"""Speculative decoding through `qatserve serve`, with the official `openai` client.

usage: test_speculative_server.py QATSERVE_BINARY

On the trained demo model (models/gemma4-tiny-qat, which copies text, so prompt lookup drafts are accepted): a
server with `--speculative ngram` by default gives, for greedy completions and chats (streaming and not), exactly
the tokens of the same requests that opt out with "speculative": false and of `qatserve generate --print-ids`
without speculation; a server with `--draft-model` (the model drafting for itself) gives them too. /metrics counts
the drafted and accepted tokens under qatserve's and vLLM's names (prometheus_client's parser), and a bad
"speculative" field or a draft model or assistant the server lacks is a 400 naming the field.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai / prometheus_client package).
"""
import subprocess
import sys
import tempfile
from pathlib import Path

from server_harness import SKIP, Checks, Server, ids_from_logprobs, sample_values  # noqa: F401 (SKIP on import)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
PASSAGE = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
           "want of a wife.")
PROMPTS = [PASSAGE + "\n" + PASSAGE + "\n" + PASSAGE[:40], PASSAGE + "\n" + PASSAGE[:25], "Hello"]
MAX_TOKENS = 40
PLAIN = {"speculative": False}


def completion_ids(client, prompt, extra, stream=False):
    """Greedy token ids of a completion, read back from logprobs as token ids."""
    kw = dict(model="m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=0,
              extra_body={"return_tokens_as_token_ids": True, **extra})
    if not stream:
        return ids_from_logprobs(client.completions.create(**kw).choices[0].logprobs.tokens)
    tokens = []
    for chunk in client.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
    return ids_from_logprobs(tokens)


def chat_text(client, prompt, extra):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                       max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
    return r.choices[0].message.content


def cli_ids(binary, server, prompt):
    """`qatserve generate --print-ids` without speculation, on the server's tokens of the prompt."""
    status, body = server.json("POST", "/tokenize", {"prompt": prompt})
    assert status == 200, body
    out = subprocess.run([binary, "generate", "--model", str(MODEL), "--tokens", ",".join(map(str, body["tokens"])),
                          "--max-tokens",
                          str(MAX_TOKENS), "--temperature", "0", "--print-ids"], capture_output=True, text=True,
                         check=True).stdout
    return [int(x) for x in out.strip().splitlines()[-1].split(",") if x]


class SpeculativeSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, workdir

    def run(self):
        ngram = Server(self.binary, MODEL, self.workdir, "ngram", "--speculative", "ngram", "--num-speculative-tokens",
                       "5")
        try:
            ngram.wait_ready()
            self.client = ngram.client()
            self.server = ngram
            self.check("greedy completions: ngram by default = opted out = generate", self.same_as_plain)
            self.check("streamed completions and chats are the same too", self.streams_and_chats)
            self.check("metrics count drafted and accepted tokens", self.metrics)
            self.check("bad speculative fields are 400s naming them", self.bad_fields)
        finally:
            ngram.stop()
        draft = Server(self.binary, MODEL, self.workdir, "draft", "--draft-model", str(MODEL))
        try:
            draft.wait_ready()
            self.server = draft
            self.check("a draft model gives the same tokens", lambda: self.draft_model(draft))
        finally:
            draft.stop()
        return self.summary("speculative server test", self.server)

    def same_as_plain(self):
        self.plain = [completion_ids(self.client, p, PLAIN) for p in PROMPTS]
        for p, want in zip(PROMPTS, self.plain):
            assert completion_ids(self.client, p, {}) == want, p
            assert cli_ids(self.binary, self.server, p) == want, p

    def streams_and_chats(self):
        for p, want in zip(PROMPTS, self.plain):
            assert completion_ids(self.client, p, {}, stream=True) == want, p
            assert chat_text(self.client, p, {}) == chat_text(self.client, p, PLAIN), p

    def metrics(self):
        m = self.server.metrics()
        label = '{model_name="gemma4-tiny-qat",engine="0"}'
        drafted = m["qatserve_spec_decode_draft_tokens_total"]
        accepted = m["qatserve_spec_decode_accepted_tokens_total"]
        assert 0 < accepted <= drafted, (accepted, drafted)
        assert m["vllm:spec_decode_num_draft_tokens_total" + label] == drafted, m
        assert m["vllm:spec_decode_num_accepted_tokens_total" + label] == accepted, m
        assert m["vllm:spec_decode_num_drafts_total" + label] == m["qatserve_spec_decode_drafts_total"] > 0, m
        assert abs(m["qatserve_spec_decode_acceptance_rate"] - accepted / drafted) < 1e-9, m

    def bad_fields(self):
        for body, what in [({"speculative": {"method": "eagle"}}, "speculative.method"),
                           ({"speculative": {"method": "ngram", "num_speculative_tokens": 99}},
                            "speculative.num_speculative_tokens"),
                           ({"speculative": 3}, "speculative must be an object"),
                           ({"speculative": {"method": "draft_model"}}, "no draft model is loaded"),
                           ({"speculative": {"method": "assistant"}}, "no assistant drafter is loaded")]:
            status, r = self.server.json("POST", "/v1/completions",
                                         {"prompt": "Hello", "max_tokens": 4, **body})
            assert status == 400 and what in r["error"]["message"], (status, r)

    def draft_model(self, server):
        client = server.client()
        for p, want in zip(PROMPTS, self.plain):
            assert completion_ids(client, p, {}) == want, p
        m = server.metrics()
        assert m["qatserve_spec_decode_accepted_tokens_total"] == m["qatserve_spec_decode_draft_tokens_total"] > 0, m


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-spec-server-") as tmp:
        return SpeculativeSuite(str(Path(sys.argv[1]).resolve()), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
