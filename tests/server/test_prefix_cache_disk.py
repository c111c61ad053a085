#!/usr/bin/env python3
"""The prefix cache's disk tier through `serve --prefix-cache-dir`, across a restart.

usage: test_prefix_cache_disk.py QATSERVE_BINARY

For the demo model at f32 and at bf16 activations:
- restart: a server prefills a long prompt (the first server has nothing cached: a fresh prefill) and is stopped
  (SIGTERM: its cached blocks are written at exit); a second server over the same directory answers the same
  prompt with the same greedy tokens and exactly the same top logprobs, and its /metrics report the prefix as a
  disk-tier hit (qatserve_prefix_cache_tier_hit_tokens_total{tier="disk"}), blocks loaded, none rejected.
- damaged files: every block file of the directory truncated or with a flipped byte; a third server warns, rejects
  them (the counter), computes the prompt afresh and answers exactly as the first did.
- a full disk: --prefix-cache-disk-bytes smaller than one block: nothing is written (the write-error counter), and
  serving goes on with the same answer.
Counters only; no wall time is asserted.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai / prometheus_client in .venv).
"""
import sys
from pathlib import Path

from server_harness import SKIP, Checks, Server, run_suite_main  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
# ~900 tokens of the model's held-out Austen text: many blocks of 16, the 64-token sliding window crossed often.
PROMPT = (MODEL / "held_out.txt").read_text()[:3600]
DISK_HITS = 'qatserve_prefix_cache_tier_hit_tokens_total{tier="disk"}'


def ask(server):
    """The greedy completion of PROMPT with its top logprobs (what the logits decide, exactly as printed)."""
    status, body = server.json("POST", "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 5, "ignore_eos": True})
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    return body["choices"][0]["text"], lp["token_logprobs"], lp["top_logprobs"], body["usage"]["prompt_tokens"]


def block_files(directory):
    return sorted(Path(directory).rglob("*.kvb"))


class DiskTierSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        self.server = None

    def serve(self, name, precision, *extra):
        self.server = Server(self.binary, MODEL, self.workdir, name, "--precision", precision, *extra)
        self.server.wait_ready()
        return self.server

    def restart(self, precision):
        cache = self.workdir / f"cache-{precision}"
        first = self.serve(f"first-{precision}", precision, "--prefix-cache-dir", str(cache))
        fresh = ask(first)
        assert fresh[3] > 600, f"the prompt is {fresh[3]} tokens"
        assert first.stop() == 0, first.log_text()[-2000:]
        assert block_files(cache), "no block written at exit"

        second = self.serve(f"second-{precision}", precision, "--prefix-cache-dir", str(cache))
        again = ask(second)
        m = second.metrics()
        second.stop()
        assert again == fresh, (again, fresh)
        whole_blocks = (fresh[3] - 1) // 16 * 16
        assert m[DISK_HITS] == whole_blocks, (m[DISK_HITS], whole_blocks)
        assert m["qatserve_prefix_cache_disk_loaded_blocks_total"] > 0, m
        assert m["qatserve_prefix_cache_disk_rejected_files_total"] == 0, m
        self.fresh, self.cache = fresh, cache

    def damaged_files(self):
        files = block_files(self.cache)
        for i, f in enumerate(files):
            data = bytearray(f.read_bytes())
            if i % 2:
                data[len(data) // 2] ^= 0x01
            else:
                del data[-5:]
            f.write_bytes(bytes(data))
        third = self.serve("damaged", "f32", "--prefix-cache-dir", str(self.cache))
        again = ask(third)
        m = third.metrics()
        third.stop()
        assert again == self.fresh, (again, self.fresh)
        assert m[DISK_HITS] == 0, m[DISK_HITS]
        assert m["qatserve_prefix_cache_disk_rejected_files_total"] >= 1, m
        assert "is not used" in third.log_text(), third.log_text()[-2000:]

    def full_disk(self):
        cache = self.workdir / "cache-full"
        s = self.serve("full", "f32", "--prefix-cache-dir", str(cache), "--prefix-cache-disk-bytes", "1K")
        first = ask(s)
        s.stop()
        assert first == self.fresh, (first, self.fresh)
        assert not block_files(cache)
        restarted = self.serve("full-again", "f32", "--prefix-cache-dir", str(cache), "--prefix-cache-disk-bytes", "1K")
        again = ask(restarted)
        m = restarted.metrics()
        restarted.stop()
        assert again == self.fresh and m[DISK_HITS] == 0, (again, m[DISK_HITS])
        assert "exceeds --prefix-cache-disk-bytes" in s.log_text(), s.log_text()[-2000:]

    def run(self):
        # bf16 first: the f32 run's answer is the one the later checks compare against.
        self.check("restart_bf16", lambda: self.restart("bf16"))
        self.check("restart_f32", lambda: self.restart("f32"))
        self.check("damaged_files", self.damaged_files)
        self.check("full_disk", self.full_disk)
        return self.summary("prefix cache disk tier", self.server)


def main():
    return run_suite_main(__doc__, DiskTierSuite, "qatserve-disk-tier-")


if __name__ == "__main__":
    sys.exit(main())
