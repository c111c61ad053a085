#!/usr/bin/env python3
"""GuideLLM (the pinned guidellm in .venv) benchmarking `qatserve serve` on the demo model, as its users run it.

usage: test_guidellm.py QATSERVE_BINARY

Serves models/gemma4-tiny-qat and runs `guidellm run` with a scenario file: the openai_http backend on
/v1/chat/completions (streaming, as GuideLLM sends it), the concurrent profile at 2 streams, synthetic prompts of 32
tokens asking for 16 output tokens, the demo model's own tokenizer, stopped after 8 requests; the JSON report must
show requests completed and none errored or incomplete, each with the output tokens asked for.
Exit status: 0 passed, 1 failed, 77 skipped (no openai or guidellm in .venv).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import SKIP, Checks, Server  # noqa: E402 (exits 77 without openai)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
GUIDELLM = Path(sys.executable).parent / "guidellm"
REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 8, 32, 16

if not GUIDELLM.exists():
    print("guidellm test skipped: guidellm is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)


def scenario(target, report):
    """The run GuideLLM's built-in rhaiis/concurrent-* scenarios describe, made small."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": target, "model": "gemma4-tiny-qat",
                    "request_format": "/v1/chat/completions"},
        "profile": {"kind": "concurrent", "streams": 2},
        "tokenizer": {"kind": "huggingface_auto", "model": str(MODEL)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}],
        "constraints": [{"kind": "max_requests", "count": REQUESTS}],
        "outputs": [{"kind": "json", "path": str(report)}]}}


class GuideLLMSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)

    def concurrent_run(self):
        report = self.workdir / "report.json"
        config = self.workdir / "scenario.json"
        config.write_text(json.dumps(scenario(f"http://127.0.0.1:{self.server.port}", report)))
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        run = subprocess.run([str(GUIDELLM), "run", "-c", str(config), "--disable-console-interactive"],
                             capture_output=True, text=True, timeout=600, env=env, cwd=self.workdir)
        assert run.returncode == 0, f"guidellm exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        benchmarks = json.loads(report.read_text())["benchmarks"]
        assert len(benchmarks) == 1, [b.get("config") for b in benchmarks]
        requests = benchmarks[0]["requests"]
        completed = requests.get("successful", [])
        assert len(completed) >= REQUESTS - 2, f"{len(completed)} requests completed"  # the tail may be cancelled
        assert not requests.get("errored") and not requests.get("incomplete"), (
            requests.get("errored"), requests.get("incomplete"))
        for r in completed:
            assert r["output_metrics"]["text_tokens"] == OUTPUT_TOKENS, r["output_metrics"]
        print(f"  {len(completed)} requests completed, {OUTPUT_TOKENS} output tokens each, none errored")

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "guidellm", "--served-model-name", "gemma4-tiny-qat")
        try:
            self.server.wait_ready()
            self.check("guidellm run, concurrent profile: requests completed, none errored", self.concurrent_run)
        finally:
            self.server.stop()
        return self.summary("guidellm test", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-guidellm-") as tmp:
        return GuideLLMSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
