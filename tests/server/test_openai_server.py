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

The checks are in openai_api_checks.py, server_metrics_checks.py, server_options_checks.py and
server_shutdown_checks.py; the harness (Server, Checks, waits), which the other server tests import too, in
server_harness.py.
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_harness import DEMO_TOKENIZER, HANG_STOP, SKIP, Checks, Server

from openai_api_checks import ApiChecks
from server_metrics_checks import MetricsChecks
from server_options_checks import OptionsChecks
from server_shutdown_checks import ShutdownChecks


class Suite(Checks, ApiChecks, MetricsChecks, OptionsChecks, ShutdownChecks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary = binary
        self.workdir = Path(workdir)
        self.model = self.workdir / "tiny-e2b"

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
