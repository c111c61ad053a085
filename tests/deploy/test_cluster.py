#!/usr/bin/env python3
"""Replicas behind nginx on loopback: `scripts/cluster.sh` with deploy/nginx/qatserve.conf.template, real nginx.

usage: test_cluster.py QATSERVE_BINARY

Bad input to cluster.sh (missing or wrong options, no binary, a replica that cannot load) exits non-zero with a
message and leaves nothing running; with two cores per replica each replica runs on its own cores. Two clusters of two replicas of the tiny E2B checkpoint. The first: every response names its replica
(X-Qatserve-Replica); an X-Session-Id goes to one replica every time; a multi-turn workload gets more prefix-cache
hits (the replicas' own vllm:prefix_cache_hits_total) with the affinity key than without; then kill -9 of one replica
under a streaming load: the streams it was running end cut (no [DONE], no hang; the official openai client
raises APIConnectionError), only requests that reached it fail,
every request sent once it is gone succeeds on the other replica (a refused connection is retried there, also for
an affinity key that hashed to the dead one); Ctrl-C (SIGINT) stops cluster.sh with exit 0. The second: SIGTERM to
one replica while it streams: its streams run to their full length, new requests all go to the other replica while
it drains, it exits 0; SIGTERM stops cluster.sh with exit 0. Waits end on events; their deadlines only stop a hang.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no nginx, no demo tokenizer).
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

from cluster_util import (CLUSTER_SH, Checks, Cluster, HANG_STOP, Stream, free_port_run, skip_unless, synth_model,
                          wait_for)

LONG = {"max_tokens": 1500, "ignore_eos": True, "temperature": 1.0}  # seconds of streaming, even on a fast machine


def hits(cluster):
    """Prefix-cache hit tokens summed over the replicas that are up (each read directly)."""
    total = 0
    for r in cluster.replicas:
        if r.alive():
            total += sum(v for k, v in cluster.metrics(r).items() if k.startswith("vllm:prefix_cache_hits_total{"))
    return total


class Suite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, workdir
        self.model = synth_model(binary, workdir)
        self.key_replica = {}  # affinity key -> the replica it reached

    # ---- routing ------------------------------------------------------------------------------------------------

    def replica_header(self):
        names = {r.name for r in self.c.replicas}
        for path, body in [("/health", None), ("/v1/models", None),
                           ("/v1/completions", {"prompt": "Hello", "max_tokens": 2})]:
            status, headers, _ = self.c.request("POST" if body else "GET", path, body)
            assert status == 200 and headers.get("x-qatserve-replica") in names, (path, status, headers)

    def affinity(self):
        for i in range(16):
            key = f"session-{i}"
            seen = set()
            for _ in range(3):
                status, headers, _ = self.c.request("POST", "/v1/completions", {"prompt": f"Turn of {key}",
                                                    "max_tokens": 2}, {"X-Session-Id": key})
                assert status == 200, status
                seen.add(headers["x-qatserve-replica"])
            assert len(seen) == 1, (key, seen)
            self.key_replica[key] = seen.pop()
        counts = {n: list(self.key_replica.values()).count(n) for n in {r.name for r in self.c.replicas}}
        print(f"  16 keys, 3 requests each, one replica per key; keys per replica: {counts}")
        assert all(counts.values()), counts  # the hash spreads keys over both

    def multi_turn(self, tag, affinity):
        """5 conversations of 4 turns, taken in turn (each history a prefix of its next prompt); hits gained."""
        before = hits(self.c)
        filler = " ".join(f"rule {i}: answer briefly and politely." for i in range(12))
        histories = {s: [{"role": "system", "content": f"Conversation {tag}-{s}. {filler}"}] for s in range(5)}
        for turn in range(4):
            for s, history in histories.items():
                messages = history + [{"role": "user", "content": f"Question {turn}: tell me about item {turn}."}]
                headers = {"X-Session-Id": f"{tag}-{s}"} if affinity else {}
                status, _, body = self.c.request("POST", "/v1/chat/completions",
                                                 {"messages": messages, "max_tokens": 8, "temperature": 0}, headers)
                assert status == 200, (status, body)
                reply = json.loads(body)["choices"][0]["message"]["content"] or ""
                histories[s] = messages + [{"role": "assistant", "content": reply}]
        return hits(self.c) - before

    def prefix_cache_affinity(self):
        with_key = self.multi_turn("affine", affinity=True)
        without = self.multi_turn("spread", affinity=False)
        print(f"  prefix-cache hit tokens, 5 conversations x 4 turns: {with_key:.0f} with X-Session-Id, "
              f"{without:.0f} without")
        assert with_key > without, (with_key, without)

    # ---- failures -----------------------------------------------------------------------------------------------

    def kill_under_load(self):
        victim, survivor = self.c.replicas
        streams, lock, gone = [], threading.Lock(), threading.Event()
        after_gone = {}

        def worker(w):
            rng = random.Random(w)
            while after_gone.get(w, 0) < 2:
                s = Stream(self.c.port, {"prompt": f"Worker {w} says {rng.random()}", **LONG})
                with lock:
                    streams.append(s)
                sent_after = gone.is_set()
                s.run()
                if sent_after:
                    after_gone[w] = after_gone.get(w, 0) + 1

        # And the official openai client, streaming on the victim (an affinity key of it): what does it see?
        dead_keys = [k for k, n in self.key_replica.items() if n == victim.name]
        client = {"chunks": 0, "replica": None, "outcome": None}

        def openai_stream():
            api = openai.OpenAI(base_url=f"http://127.0.0.1:{self.c.port}/v1", api_key="unused", max_retries=0,
                                timeout=HANG_STOP)
            raw = api.completions.with_raw_response.create(model="tiny-e2b", prompt="Long story", stream=True,
                                                           extra_headers={"X-Session-Id": dead_keys[0]},
                                                           max_tokens=LONG["max_tokens"],
                                                           extra_body={"ignore_eos": True})
            client["replica"] = raw.headers.get("x-qatserve-replica")
            try:
                for _ in raw.parse():
                    client["chunks"] += 1
                client["outcome"] = "ended normally"
            except openai.APIError as e:
                client["outcome"] = type(e).__name__

        threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(6)]
        threads.append(threading.Thread(target=openai_stream, daemon=True))
        for t in threads:
            t.start()

        def streaming_on_both():  # streams well under way on both replicas
            with lock:
                live = {s.replica for s in streams if s.tokens >= 20 and s.end is None}
            return live >= {victim.name, survivor.name} and client["chunks"] >= 20
        wait_for(streaming_on_both, "streams running on both replicas")
        os.kill(victim.pid, signal.SIGKILL)
        # Gone = reaped by cluster.sh. Not sooner: the killed process shows as a zombie while its other threads still
        # exit, and until the last one does its listening socket stays open and takes connections (then resets them).
        wait_for(lambda: f"{victim.name} (pid {victim.pid}) exited with status 137" in self.c.log_text(),
                 f"{victim.name} reaped after kill -9")
        gone_at = time.time()
        gone.set()
        # an affinity key that hashed to the dead replica now goes to the other one
        for key in dead_keys:
            status, headers, _ = self.c.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                                                {"X-Session-Id": key})
            assert status == 200 and headers["x-qatserve-replica"] == survivor.name, (key, status, headers)
        for t in threads:
            t.join(HANG_STOP)
            assert not t.is_alive(), "a stream hung after kill -9"

        cut = [s for s in streams if s.end != "done"]
        interrupted = [s for s in cut if s.first_token_at and s.first_token_at < gone_at and s.end == "cut"]
        late = [s for s in streams if s.sent_at > gone_at]
        print(f"  {len(streams)} streams: {len(interrupted)} cut mid-stream on {victim.name}, "
              f"{len(cut) - len(interrupted)} other failures {sorted(s.end for s in cut if s not in interrupted)}, {len(late)} sent after it was gone (all succeeded); "
              f"{len(dead_keys)} affinity keys of {victim.name} moved to {survivor.name}")
        print(f"  the openai client's stream on {client['replica']}: {client['outcome']} after {client['chunks']} chunks")
        assert client["replica"] == victim.name and client["outcome"] == "APIConnectionError", client
        assert interrupted, "no stream was running on the killed replica"
        for s in cut:  # only requests that reached the dead replica fail, and they end (an error, not a hang)
            assert s.replica == victim.name and s.sent_at < gone_at, vars(s)
        assert late and all(s.end == "done" and s.replica == survivor.name for s in late), [vars(s) for s in late]
        retried = [line for line in self.c.access_log().splitlines()
                   if f"upstream=[{victim.addr}, {survivor.addr}]" in line and line.split('"')[2].split()[0] == "200"]
        print(f"  requests retried on {survivor.name} after a refused connection (access log): {len(retried)}")

    def sigterm_drains(self):
        c = self.c2
        victim, survivor = c.replicas
        streams = []
        for i in range(4):  # least connections alternates them over the two replicas
            s = Stream(c.port, {"prompt": f"Drain stream {i}", **LONG})
            streams.append(s)
            threading.Thread(target=s.run, daemon=True).start()
            wait_for(lambda: s.replica is not None, "a stream's headers")
        wait_for(lambda: any(s.replica == victim.name and s.tokens >= 1 and s.end is None for s in streams),
                 f"a stream running on {victim.name}")
        os.kill(victim.pid, signal.SIGTERM)
        victim_log = c.run_dir / f"{victim.name}.log"
        draining = wait_for(lambda: [line for line in victim_log.read_text().splitlines() if "finishing" in line],
                            f"{victim.name} logging its drain")
        for i in range(8):  # while it drains, new work goes to the other replica only
            headers = {"X-Session-Id": f"session-{i}"} if i % 2 else {}
            status, h, _ = c.request("POST", "/v1/completions", {"prompt": "New work", "max_tokens": 2}, headers)
            assert status == 200 and h["x-qatserve-replica"] == survivor.name, (status, h)
        wait_for(lambda: all(s.end for s in streams), "the streams ending")
        on_victim = [s for s in streams if s.replica == victim.name]
        print(f"  {draining[0].strip()}; its {len(on_victim)} streams: "
              f"{[(s.end, s.finish_reason, s.tokens) for s in on_victim]}")
        assert all(s.end == "done" and s.finish_reason == "length" for s in streams), [vars(s) for s in streams]
        wait_for(lambda: f"{victim.name} (pid {victim.pid}) exited with status 0" in c.log_text(),
                 f"{victim.name} exiting 0 after its drain")

    def bad_input(self):
        env = dict(os.environ, QATSERVE_BIN=self.binary)
        not_a_model = Path(self.workdir) / "not-a-model"
        not_a_model.mkdir()
        for args, env_change, message in [
            (["--replicas", "2", "--port", "18000"], {}, "--model DIR is required"),
            (["--model", str(not_a_model / "x"), "--port", "18000"], {}, "is not a directory"),
            (["--model", str(self.model), "--replicas", "0", "--port", "18000"], {}, "--replicas must be a positive"),
            (["--model", str(self.model), "--port", "18001", "--replica-port", "18000"], {}, "is one of the replicas"),
            (["--model", str(self.model), "--port", "18000"], {"QATSERVE_BIN": "/nonexistent/qatserve"},
             "no qatserve binary at '/nonexistent/qatserve'"),
            # a replica that cannot load: cluster.sh shows its log, stops the others, exit 1
            (["--model", str(not_a_model), "--port", str(free_port_run(3)), "--run-dir",
              str(Path(self.workdir) / "bad-run")], {}, "replica-0 exited with status 1 while loading"),
        ]:
            out = subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=HANG_STOP,
                                 env={**env, **env_change})
            assert out.returncode in (1, 2) and message in out.stderr, (args, out.returncode, out.stderr[-1500:])
        leftover = subprocess.run(["pgrep", "-f", f"serve --model {not_a_model}"], capture_output=True, text=True)
        assert not leftover.stdout.strip(), f"replicas left running: {leftover.stdout}"

    def pinning(self):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            print("  one core: nothing to pin")
            return
        per = len(cpus) // 2 if len(cpus) >= 4 else len(cpus)  # two replicas when there are 4 cores, else one
        c = Cluster(self.binary, self.model, self.workdir, "cluster-pinned", replicas=len(cpus) // per)
        try:
            for i, r in enumerate(c.replicas):
                allowed = sorted(os.sched_getaffinity(r.pid))
                assert allowed == cpus[i * per:(i + 1) * per], (r.name, allowed, cpus)
                assert f"--threads {per}" in Path(f"/proc/{r.pid}/cmdline").read_text().replace("\0", " ")
                print(f"  {r.name}: cores {allowed}, --threads {per}")
            assert c.stop() == 0
        finally:
            c.kill()

    def run(self):
        self.check("bad input to cluster.sh: exit 1 or 2 with a message naming it", self.bad_input)
        self.check("two cores or more per replica: each pinned to its own, --threads = their count", self.pinning)
        self.c = Cluster(self.binary, self.model, self.workdir, "cluster-a")
        try:
            for name, fn in [("every response names its replica (X-Qatserve-Replica)", self.replica_header),
                             ("an X-Session-Id reaches one replica every time", self.affinity),
                             ("more prefix-cache hits with the affinity key on a multi-turn workload",
                              self.prefix_cache_affinity),
                             ("kill -9 of a replica under a streaming load", self.kill_under_load)]:
                self.check(name, fn)
            self.check("Ctrl-C (SIGINT) stops cluster.sh, exit 0",
                       lambda: assert_stopped(self.c, signal.SIGINT))
        finally:
            self.c.kill()
        # A drain timeout far beyond what the streams need on a slow machine: it only stops a hang.
        self.c2 = Cluster(self.binary, self.model, self.workdir, "cluster-b",
                          serve_args=["--drain-timeout", str(HANG_STOP)])
        try:
            self.check("SIGTERM to a replica: it drains, nginx sends it no new work", self.sigterm_drains)
            self.check("SIGTERM stops cluster.sh, exit 0", lambda: assert_stopped(self.c2, signal.SIGTERM))
        finally:
            self.c2.kill()
        print(f"\ncluster checks: {len(self.passed)} passed, {len(self.failed)} failed")
        if self.failed:
            for c in (self.c, self.c2):
                print(f"--- {c.log_path}:\n{c.log_text()[-3000:]}\n--- nginx error.log:")
                err = c.run_dir / "error.log"
                print(err.read_text()[-2000:] if err.exists() else "(none)")
        return 1 if self.failed else 0


def assert_stopped(cluster, sig):
    rc = cluster.stop(sig)
    assert rc == 0, (rc, cluster.log_text()[-2000:])
    assert not any(r.alive() for r in cluster.replicas), "a replica outlived cluster.sh"
    assert "cluster: stopped" in cluster.log_text()


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    skip_unless("nginx", "cluster test")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-cluster-test-") as tmp:
        rc = Suite(os.path.abspath(sys.argv[1]), tmp).run()
    print(f"cluster test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
