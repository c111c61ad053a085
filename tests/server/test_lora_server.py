#!/usr/bin/env python3
"""LoRA adapters served per request (`serve --lora NAME=DIR`), with the official `openai` client against PEFT.

usage: test_lora_server.py QATSERVE_BINARY

PEFT (pinned in tools/python/requirements.txt) puts seeded random LoRA adapters on the demo model
(models/gemma4-tiny-qat, loaded by transformers in float32) and saves them with save_pretrained, as
tools/python/check_lora_external.py does on the fixtures. One server (--precision f32) serves the base and two
adapters; then:

  - /v1/models lists the base and each adapter with vLLM's `parent` (the base's id) and `root` (the adapter's dir);
  - greedy completions and chats for model=ADAPTER give PEFT's greedy tokens (PeftModel.from_pretrained, full
    forward passes), and their logprobs are PEFT's log-softmax within LOGPROB_TOLERANCE; model=BASE gives the base's;
    the Responses and Messages APIs answer model=ADAPTER with the chat's text, naming the adapter as their model;
  - requests for the two adapters and the base in flight at once each get their own answer;
  - /metrics, read by prometheus_client's parser while streams on both adapters run, has vLLM's
    vllm:lora_requests_info (max_lora = --max-loras, the running adapters comma-joined, value a Unix time: the
    latest series is the current sets, and the empty sets once the streams end), qatserve_lora_requests_total per
    adapter, and vllm:cache_config_info with the KV pool's block size, blocks and dtype;
  - an unknown model is vLLM's 404 (openai.NotFoundError);
  - POST /v1/load_lora_adapter serves a new adapter (PEFT's tokens again); a duplicate name, a bad directory, a rank
    over --max-lora-rank and a load past --max-loras are 400s saying so; /v1/unload_lora_adapter of an unknown name
    is vLLM's 404; a stream running on an adapter unloaded meanwhile still finishes with PEFT's tokens, and later
    requests for that name get 404;
  - `plan --max-loras 2 --max-lora-rank 16` reserves exactly two of PEFT's `all-linear` rank-16 adapters (A and B as
    f32);
  - a server without --enable-lora-runtime-loading answers those routes 404, and one started with an adapter over
    --max-lora-rank exits with an error naming the flag;
  - `qatserve chat --lora DIR` (scripted stdin, greedy, --ignore-eos) prints for the chat message the text of
    `generate --lora DIR --messages` on the same message, whose --print-ids are PEFT's greedy tokens (which differ
    from the base's, so an adapter ignored fails), over the same prompt tokens; `chat` without it prints another.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai / peft package).
"""
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from server_harness import SKIP, Checks, Server, free_port, ids_from_logprobs

try:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
except ImportError as e:
    print(f"LoRA server test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "python"))
from gemma4_fixture_run import load_model  # noqa: E402

MODEL = ROOT / "models" / "gemma4-tiny-qat"
BASE = "gemma4-tiny-qat"
ATTENTION_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name: LoraConfig arguments, seed
ADAPTERS = {
    "austen-a": (dict(r=8, lora_alpha=16, target_modules=ATTENTION_MLP), 1),
    "austen-b": (dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj", "down_proj"]), 2),
    "austen-c": (dict(r=16, lora_alpha=16, target_modules=["o_proj", "up_proj"]), 3),    # loaded at run time
    "too-big": (dict(r=32, lora_alpha=32, target_modules=["q_proj"]), 4),               # over --max-lora-rank 16
}
MAX_TOKENS = 12
# The server runs at f32 precision: its logits agree with transformers' within 5e-6 of the peak (lora_external);
# a log-softmax moves by at most twice that.
LOGPROB_TOLERANCE = 1e-4
PROMPT = "It is a truth universally acknowledged, that"
CHAT = [{"role": "user", "content": "Tell me a story."}]
SPEED_LINE = re.compile(r"^\[(\d+) prompt tokens, [^;]*; (\d+) generated", re.M)  # print_speed's line on stderr


def make_adapter(lora_args, seed, out):
    model = get_peft_model(load_model(MODEL, torch.float32), LoraConfig(**lora_args))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:  # a fresh adapter's B is zero: give it values that matter
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / p.shape[1] ** 0.5))
    model.save_pretrained(out)


@torch.no_grad()
def peft_greedy(adapter, tokens):
    """(greedy token ids, their log-probabilities) by full forward passes, as PEFT runs the adapter (None: base)."""
    model = load_model(MODEL, torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    seq, logprobs = list(tokens), []
    for _ in range(MAX_TOKENS):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].double()
        token = int(logits.argmax())
        logprobs.append(float(torch.log_softmax(logits, -1)[token]))
        seq.append(token)
    return seq[len(tokens):], logprobs


def close(got, want):
    return len(got) == len(want) and all(abs(a - b) <= LOGPROB_TOLERANCE for a, b in zip(got, want))


class LoraSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        self.dirs = {name: self.workdir / name for name in ADAPTERS}

    def run(self):
        for name, (args, seed) in ADAPTERS.items():
            make_adapter(args, seed, self.dirs[name])
        server = Server(self.binary, MODEL, self.workdir, "lora", "--precision", "f32", "--lora",
                        f"austen-a={self.dirs['austen-a']}", "--lora", f"austen-b={self.dirs['austen-b']}",
                        "--max-loras", "3", "--enable-lora-runtime-loading")
        self.server = server
        try:
            server.wait_ready()
            self.client = server.client()
            self.prepare_references()
            self.check("/v1/models lists the base and the adapters with parent and root", self.models)
            self.check("completions and chats per adapter give PEFT's greedy tokens and logprobs", self.per_adapter)
            self.check("Responses and Messages pick the adapter by model", self.other_apis)
            self.check("two adapters and the base in flight at once each get their own answer", self.concurrent)
            self.check("/metrics: vllm:lora_requests_info, per-adapter counts, vllm:cache_config_info", self.lora_metrics)
            self.check("an unknown model is vLLM's 404", self.unknown_model)
            self.check("runtime load serves a new adapter; bad loads are 400s", self.runtime_load)
            self.check("a stream keeps its adapter through an unload; then the name is 404", self.unload_in_flight)
        finally:
            server.stop()
        self.check("without --enable-lora-runtime-loading the routes are 404", self.routes_disabled)
        self.check("serve --lora with a rank over --max-lora-rank exits naming the flag", self.startup_refusal)
        self.check("chat --lora prints generate --lora's text, PEFT's greedy tokens", self.chat_command)
        self.check("plan --max-loras reserves PEFT's all-linear adapters of --max-lora-rank", self.plan_reserve)
        return self.summary("LoRA server test", server)

    def greedy_cli(self, command, *flags, stdin=None):
        """A greedy run of `qatserve COMMAND` on the demo model at f32, as the server runs (--precision f32)."""
        r = subprocess.run([self.binary, command, "--model", MODEL, "--precision", "f32", "--temperature", "0",
                            "--max-tokens", str(MAX_TOKENS), "--ignore-eos", *map(str, flags)],
                           input=stdin, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (command, flags, r.stderr[-2000:])
        return r

    def chat_command(self):
        # An adapter whose greedy tokens on CHAT are not the base's (some move the logprobs alone), so that a chat
        # that ignored the adapter would fail.
        base_ids = self.want[None]["chat"][0]
        changed = [n for n in ["austen-a", "austen-b", "austen-c"] if self.want[n]["chat"][0] != base_ids]
        assert changed, "no adapter changes the greedy chat tokens"
        adapter, messages = self.dirs[changed[0]], self.workdir / "chat.json"
        messages.write_text(json.dumps({"messages": CHAT}))
        want_ids = self.want[changed[0]]["chat"][0]
        ids = self.greedy_cli("generate", "--lora", adapter, "--messages", messages, "--print-ids").stdout
        assert [int(t) for t in ids.split(",")] == want_ids, (ids, want_ids)
        generated = self.greedy_cli("generate", "--lora", adapter, "--messages", messages)
        turn = CHAT[0]["content"] + "\n"
        chat = self.greedy_cli("chat", "--lora", adapter, stdin=turn)
        # chat prints "> " before it reads each line: the message's, then the end of input's.
        assert chat.stdout == "> " + generated.stdout + "> ", (chat.stdout, generated.stdout)
        speed = [SPEED_LINE.findall(r.stderr) for r in (chat, generated)]
        assert speed[0] == speed[1] == [(str(len(self.chat_ids)), str(MAX_TOKENS))], speed
        base = self.greedy_cli("chat", stdin=turn)
        assert base.stdout != chat.stdout, (base.stdout, chat.stdout)

    def tokens(self, body):
        status, r = self.server.json("POST", "/tokenize", body)
        assert status == 200, r
        return r["tokens"]

    def prepare_references(self):
        self.prompt_ids = self.tokens({"prompt": PROMPT})
        self.chat_ids = self.tokens({"messages": CHAT, "add_generation_prompt": True})
        self.want = {}
        for name in [None, "austen-a", "austen-b", "austen-c"]:
            adapter = self.dirs[name] if name else None
            self.want[name] = {"prompt": peft_greedy(adapter, self.prompt_ids), "chat": peft_greedy(adapter, self.chat_ids)}
        base = self.want[None]["prompt"][1]
        for name in ["austen-a", "austen-b", "austen-c"]:  # an adapter ignored would fail the comparisons
            moved = max(abs(a - b) for a, b in zip(self.want[name]["prompt"][1], base))
            assert moved > 100 * LOGPROB_TOLERANCE, (name, "the adapter should move the logprobs", moved)

    def completion(self, model, stream=False):
        kw = dict(model=model, prompt=self.prompt_ids, max_tokens=MAX_TOKENS, temperature=0, logprobs=0,
                  extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
        if not stream:
            r = self.client.completions.create(**kw)
            assert r.model == model, r.model
            return ids_from_logprobs(r.choices[0].logprobs.tokens), r.choices[0].logprobs.token_logprobs
        return self.client.completions.create(stream=True, **kw)

    def chat(self, model):
        r = self.client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                                logprobs=True,
                                                extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
        assert r.model == model, r.model
        content = r.choices[0].logprobs.content
        return ids_from_logprobs([c.token for c in content]), [c.logprob for c in content], r.choices[0].message.content

    def assert_peft(self, model, reference_name, kind="prompt"):
        ids, logprobs = self.completion(model) if kind == "prompt" else self.chat(model)[:2]
        want_ids, want_logprobs = self.want[reference_name][kind]
        assert ids == want_ids, (model, kind, ids, want_ids)
        assert close(logprobs, want_logprobs), (model, kind, logprobs, want_logprobs)

    def models(self):
        data = {m.id: m for m in self.client.models.list().data}
        assert list(data) == [BASE, "austen-a", "austen-b"], list(data)
        for name in ["austen-a", "austen-b"]:
            extra = data[name].model_extra
            assert extra["parent"] == BASE and extra["root"] == str(self.dirs[name]), extra
        assert data[BASE].model_extra["parent"] is None, data[BASE].model_extra

    def per_adapter(self):
        for model, ref in [("austen-a", "austen-a"), ("austen-b", "austen-b"), (BASE, None)]:
            self.assert_peft(model, ref, "prompt")
            self.assert_peft(model, ref, "chat")

    def other_apis(self):
        r = self.client.chat.completions.create(model="austen-a", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
        text = r.choices[0].message.content
        assert r.model == "austen-a" and text, r
        r = self.client.responses.create(model="austen-a", input=CHAT[0]["content"], max_output_tokens=MAX_TOKENS,
                                         temperature=0)
        assert r.model == "austen-a" and r.output_text == text, (r.model, r.output_text, text)
        status, m = self.server.json("POST", "/v1/messages", {"model": "austen-a", "messages": CHAT,
                                                             "max_tokens": MAX_TOKENS, "temperature": 0})
        assert status == 200 and m["model"] == "austen-a", (status, m)
        assert m["content"][0]["text"] == text, (m["content"], text)

    def concurrent(self):
        results, errors = {}, []

        def one(model):
            try:
                results[model] = self.completion(model)[0]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((model, e))

        for _ in range(2):
            threads = [threading.Thread(target=one, args=(m,)) for m in ["austen-a", "austen-b", BASE]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
            for model, ref in [("austen-a", "austen-a"), ("austen-b", "austen-b"), (BASE, None)]:
                assert results[model] == self.want[ref]["prompt"][0], (model, results[model])

    def lora_info(self):
        """(the vllm:lora_requests_info sample with the latest value, every family) of one scrape."""
        families = self.server.metric_families()
        assert "vllm:lora_requests_info" in families, sorted(families)
        info = families["vllm:lora_requests_info"]
        assert info.type == "gauge" and info.documentation == "Running stats on lora requests.", info
        for s in info.samples:
            assert set(s.labels) == {"max_lora", "waiting_lora_adapters", "running_lora_adapters"}, s
            assert s.labels["max_lora"] == "3" and abs(s.value - time.time()) < 3600, s
        return max(info.samples, key=lambda s: s.value), families

    def lora_metrics(self):
        before = self.server.metrics()
        # Long streams on both adapters, each read to its first token: both then run while /metrics is scraped.
        kw = dict(prompt=self.prompt_ids, max_tokens=2000, temperature=0, extra_body={"ignore_eos": True})
        streams = [self.client.completions.create(model=m, stream=True, **kw) for m in ["austen-a", "austen-b"]]
        try:
            for stream in streams:
                next(iter(stream))
            latest, families = self.lora_info()
            assert latest.labels["running_lora_adapters"] == "austen-a,austen-b", latest
        finally:
            for stream in streams:
                stream.close()  # the server aborts them
        deadline = time.time() + 30
        while True:
            latest, families = self.lora_info()
            if latest.labels["running_lora_adapters"] == "" or time.time() > deadline:
                break
            time.sleep(0.05)
        assert latest.labels == {"max_lora": "3", "running_lora_adapters": "", "waiting_lora_adapters": ""}, latest
        assert len(families["vllm:lora_requests_info"].samples) >= 2, families["vllm:lora_requests_info"]
        after = self.server.metrics()
        for name in ["austen-a", "austen-b"]:
            key = f'qatserve_lora_requests_total{{lora_name="{name}"}}'
            assert after[key] == before.get(key, 0) + 1, (name, before.get(key), after[key])
            assert after[f'qatserve_lora_requests_running{{lora_name="{name}"}}'] == 0, after
        cache = families["vllm:cache_config_info"].samples
        assert len(cache) == 1 and cache[0].value == 1, cache
        labels = cache[0].labels
        assert labels["engine"] == "0" and labels["block_size"] == "16" and labels["enable_prefix_caching"] == "True"
        assert labels["cache_dtype"] == "float32", labels  # --precision f32: an f32 KV cache
        assert int(labels["num_gpu_blocks"]) * 16 == int(labels["kv_cache_size_tokens"]), labels
        assert int(labels["kv_cache_size_tokens"]) == after["qatserve_kv_cache_total_tokens"], labels

    def unknown_model(self):
        try:
            self.client.completions.create(model="austen-z", prompt=PROMPT, max_tokens=2)
        except Exception as e:  # noqa: BLE001 - the type is the check
            assert type(e).__name__ == "NotFoundError" and "The model `austen-z` does not exist." in str(e), e
            return
        raise AssertionError("an unknown model was served")

    def admin(self, path, body):
        status, _, data = self.server.request("POST", path, body)
        return status, data.decode()

    def bad_loads(self, cases):
        for body, words in cases:
            status, text = self.admin("/v1/load_lora_adapter", body)
            assert status == 400 and words in text, (body, status, text)

    def runtime_load(self):
        self.bad_loads([({"lora_name": "austen-a", "lora_path": str(self.dirs["austen-b"])}, "has already been loaded"),
                        ({"lora_name": "x", "lora_path": str(self.workdir / "absent")}, "absent"),
                        ({"lora_name": "x", "lora_path": str(self.dirs["too-big"])}, "--max-lora-rank"),
                        ({"lora_name": "x"}, "must be provided"),
                        ({"lora_name": BASE, "lora_path": str(self.dirs["austen-b"])}, "base model")])
        status, text = self.admin("/v1/load_lora_adapter", {"lora_name": "austen-c", "lora_path": str(self.dirs["austen-c"])})
        assert status == 200 and text == "Success: LoRA adapter 'austen-c' added successfully.", (status, text)
        assert [m.id for m in self.client.models.list().data][-1] == "austen-c"
        self.assert_peft("austen-c", "austen-c")
        self.bad_loads([({"lora_name": "x", "lora_path": str(self.dirs["austen-b"])}, "--max-loras")])  # 3 loaded
        status, text = self.admin("/v1/unload_lora_adapter", {"lora_name": "nope"})
        assert status == 404 and "The lora adapter 'nope' cannot be found." in text, (status, text)
        self.assert_peft("austen-a", "austen-a")  # nothing else disturbed

    def unload_in_flight(self):
        stream = self.completion("austen-c", stream=True)
        tokens = []
        chunks = iter(stream)
        first = next(chunks)
        tokens += first.choices[0].logprobs.tokens
        status, text = self.admin("/v1/unload_lora_adapter", {"lora_name": "austen-c"})
        assert status == 200 and text == "Success: LoRA adapter 'austen-c' removed successfully.", (status, text)
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].logprobs:
                tokens += chunk.choices[0].logprobs.tokens
        assert ids_from_logprobs(tokens) == self.want["austen-c"]["prompt"][0], tokens
        assert "austen-c" not in [m.id for m in self.client.models.list().data]
        self.unknown_model_named("austen-c")

    def unknown_model_named(self, name):
        status, r = self.server.json("POST", "/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 2})
        assert status == 404 and r["error"]["type"] == "NotFoundError", (status, r)

    def routes_disabled(self):
        plain = Server(self.binary, MODEL, self.workdir, "plain", "--lora", f"austen-a={self.dirs['austen-a']}")
        try:
            plain.wait_ready()
            for path in ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]:
                status, _, data = plain.request("POST", path, {"lora_name": "austen-b",
                                                               "lora_path": str(self.dirs["austen-b"])})
                assert status == 404 and b"--enable-lora-runtime-loading" in data, (path, status, data)
        finally:
            plain.stop()

    def startup_refusal(self):
        r = subprocess.run([self.binary, "serve", "--model", str(MODEL), "--port", str(free_port()), "--lora",
                            f"big={self.dirs['too-big']}"], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "--max-lora-rank" in r.stderr and "big=" in r.stderr, (r.returncode, r.stderr)

    def plan_reserve(self):
        out = self.workdir / "all-linear"
        make_adapter(dict(r=16, lora_alpha=16, target_modules="all-linear"), 5, out)
        from safetensors import safe_open
        with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
            values = sum(f.get_slice(k).get_shape()[0] * f.get_slice(k).get_shape()[1] for k in f.keys())
        reserve = {}
        for loras in (0, 2):
            r = subprocess.run([self.binary, "plan", "--model", str(MODEL), "--device", "8G", "--json", "--max-loras",
                                str(loras), "--max-lora-rank", "16"], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            reserve[loras] = json.loads(r.stdout)["runtime_reserve"]
        # A and B held in f32 for each of two slots; the reserve grows by exactly that and nothing else
        assert reserve[2]["adapters"] == 2 * values * 4, (reserve[2]["adapters"], values)
        assert reserve[2]["total"] - reserve[0]["total"] == 2 * values * 4 and reserve[0]["adapters"] == 0, reserve


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-lora-server-test-") as tmp:
        return LoraSuite(str(Path(sys.argv[1]).resolve()), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
