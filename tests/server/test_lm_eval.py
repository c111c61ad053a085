#!/usr/bin/env python3
"""lm-evaluation-harness's log-likelihood path against `qatserve serve`, checked with transformers.

usage: test_lm_eval.py QATSERVE_BINARY

Writes a small multiple-choice task (8 questions, 4 choices: a task YAML and a jsonl, read offline) and runs the
pinned lm-eval's own `simple_evaluate` with `model=local-completions` against `serve --model
models/gemma4-tiny-qat --precision f32`, twice: with `tokenizer_backend=remote` (lm-eval's RemoteTokenizer reads
GET /tokenizer_info and tokenizes through POST /tokenize; batches of 4 token-id prompts per request) and with
`tokenizer_backend=huggingface` on the model folder (add_bos_token, one prompt per request). Every per-choice
log-likelihood lm-eval logged (log_samples) must equal transformers' float32 log-likelihood of that continuation
given that context on the same model folder within 1e-4 nats, and its is_greedy flag transformers' argmax check.
The requests lm-eval sent are recorded (requests.Session.request) and named: what it asked of each route, and that
its scoring requests were echo + logprobs + max_tokens 1 over token-id prompts.
References are computed here at test time, never stored: the demo model is retrained from time to time.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no lm_eval / transformers in .venv).
"""
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from server_harness import SKIP, Checks, Server  # noqa: E402

try:
    import lm_eval
    import requests
    import torch
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    print(f"lm-eval test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
TASK = "qatserve_tiny_mc"
TOLERANCE = 1e-4  # nats

QUESTIONS = [
    ("What colour is the sky on a clear day?", ["blue", "green", "red", "black"], 0),
    ("How many legs does a spider have?", ["six", "eight", "four", "ten"], 1),
    ("Which animal says moo?", ["cat", "dog", "cow", "duck"], 2),
    ("What do bees make?", ["milk", "silk", "wool", "honey"], 3),
    ("Which is the largest planet?", ["Jupiter", "Mars", "Venus", "Mercury"], 0),
    ("What is frozen water called?", ["steam", "ice", "sand", "glass"], 1),
    ("Which season is the coldest?", ["summer", "spring", "winter", "autumn"], 2),
    ("What does a thermometer measure?", ["weight", "length", "speed", "temperature"], 3),
]

TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def write_task(folder: Path):
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data))


class RecordedRequests:
    """Every HTTP request lm-eval makes through `requests` (its model calls and its RemoteTokenizer)."""

    def __init__(self):
        self.sent = []
        self._original = requests.Session.request

    def __enter__(self):
        recorder, original = self, self._original

        def request(session, method, url, *args, **kwargs):
            recorder.sent.append((method.upper(), urlparse(url).path, kwargs.get("json")))
            return original(session, method, url, *args, **kwargs)

        requests.Session.request = request
        return self

    def __exit__(self, *exc):
        requests.Session.request = self._original


class Reference:
    """transformers in float32 on the model folder: log-likelihoods of continuations as lm-eval defines them."""

    def __init__(self):
        self.tokenizer = AutoTokenizer.from_pretrained(MODEL)
        self.model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()

    def encode_pair(self, context, continuation, add_bos):
        """lm-eval's split (trailing spaces of the context move to the continuation), with the HF tokenizer."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tokenizer(context + continuation, add_special_tokens=add_bos).input_ids
        ctx = self.tokenizer(context, add_special_tokens=add_bos).input_ids
        return ctx, whole[len(ctx):]

    @torch.no_grad()
    def loglikelihood(self, context, continuation, add_bos):
        ctx, cont = self.encode_pair(context, continuation, add_bos)
        ids = torch.tensor([ctx + cont])
        logprobs = torch.log_softmax(self.model(ids).logits[0].float(), dim=-1)
        rows = logprobs[len(ctx) - 1:len(ctx) + len(cont) - 1]
        target = torch.tensor(cont)
        ll = rows.gather(1, target[:, None]).sum().item()
        greedy = bool((rows.argmax(dim=-1) == target).all())
        return ll, greedy


def evaluate(port, workdir, backend_args):
    backend_args = dict(backend_args)
    batch_size = backend_args.pop("batch_size", 1)
    model_args = {"model": "gemma4-tiny-qat", "base_url": f"http://127.0.0.1:{port}/v1/completions",
                  "num_concurrent": 1, "max_retries": 1, "max_length": 512, **backend_args}
    with RecordedRequests() as recorded:
        results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=[TASK],
                                          task_manager=TaskManager(include_path=str(workdir)), log_samples=True,
                                          batch_size=batch_size, random_seed=0)
    return results, recorded.sent


def describe_requests(sent):
    """One line per route with how often lm-eval called it, and the fields of its completions requests."""
    counts = Counter((m, p) for m, p, _ in sent)
    lines = [f"  {m} {p} x{n}" for (m, p), n in sorted(counts.items())]
    scoring = [body for m, p, body in sent if p == "/v1/completions"]
    if scoring:
        keys = sorted(scoring[0])
        lines.append(f"  /v1/completions bodies carry {keys}; echo={scoring[0].get('echo')} "
                     f"logprobs={scoring[0].get('logprobs')} max_tokens={scoring[0].get('max_tokens')}")
    return "\n".join(lines)


class LmEvalSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        write_task(self.workdir)
        self.reference = Reference()

    def compare(self, results, add_bos):
        samples = results["samples"][TASK]
        assert len(samples) == len(QUESTIONS), len(samples)
        compared, worst = 0, 0.0
        for sample in samples:
            assert len(sample["arguments"]) == 4 and len(sample["resps"]) == 4, sample
            for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
                ll, greedy = resp[0]
                want_ll, want_greedy = self.reference.loglikelihood(context, continuation, add_bos)
                worst = max(worst, abs(ll - want_ll))
                assert abs(ll - want_ll) <= TOLERANCE, (context, continuation, ll, want_ll)
                assert bool(greedy) == want_greedy, (context, continuation, greedy, want_greedy)
                compared += 1
        print(f"  {compared} log-likelihoods equal transformers' float32 ones (largest difference {worst:.2e} nats)")
        assert compared == 4 * len(QUESTIONS)

    def remote_tokenizer(self):
        results, sent = evaluate(self.server.port, self.workdir, {"tokenizer_backend": "remote", "batch_size": 4})
        print("  lm-eval sent:\n" + describe_requests(sent))
        routes = {(m, p) for m, p, _ in sent}
        assert ("GET", "/tokenizer_info") in routes and ("POST", "/tokenize") in routes, routes
        scoring = [body for m, p, body in sent if p == "/v1/completions"]
        assert scoring and all(b["echo"] is True and b["logprobs"] == 1 and b["max_tokens"] == 1 for b in scoring)
        assert any(isinstance(b["prompt"], list) and len(b["prompt"]) > 1 and isinstance(b["prompt"][0], list)
                   for b in scoring), "no batched token-id prompts were sent"
        self.compare(results, add_bos=False)

    def huggingface_tokenizer(self):
        results, sent = evaluate(self.server.port, self.workdir,
                                 {"tokenizer_backend": "huggingface", "tokenizer": str(MODEL), "add_bos_token": True})
        print("  lm-eval sent:\n" + describe_requests(sent))
        self.compare(results, add_bos=True)

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "lm-eval", "--precision", "f32")
        try:
            self.server.wait_ready()
            self.check("lm-eval remote tokenizer: log-likelihoods = transformers f32", self.remote_tokenizer)
            self.check("lm-eval huggingface tokenizer: log-likelihoods = transformers f32", self.huggingface_tokenizer)
        finally:
            self.server.stop()
        return self.summary("lm-eval test", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-lm-eval-") as tmp:
        return LmEvalSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
