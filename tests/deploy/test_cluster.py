#!/usr/bin/env python3
"""Replicas behind nginx on loopback: `scripts/cluster.sh` with deploy/nginx/qatserve.conf.template, real nginx.

usage: test_cluster.py QATSERVE_BINARY

Bad input to cluster.sh (missing or wrong options, no binary, a replica that cannot load) exits non-zero with a
message and leaves nothing running. Cores (read back from each replica's /proc: its allowed CPUs and its command
line): one replica pinned (taskset) to all of them with --threads = their count; cluster.sh started under
`taskset -c` with one core: its replica on that core, --threads 1; two replicas each pinned to its own half when there
are 4 cores or more, else both on every core with --threads = cores / 2. On a machine with fewer than 4 cores the
split itself (two replicas on disjoint cores) is not exercised; the test says so.

Two clusters of two replicas of the tiny E2B checkpoint, given a 64K context (streams of tens of thousands of tokens,
minutes long, where its own 4096 take a second). The first: every response names its replica (X-Qatserve-Replica);
an X-Session-Id goes to one replica every time; a multi-turn workload gets at least the prefix-cache hits the affinity
key guarantees (a turn whose previous prompt ran past the first 256-token prefill chunk adopts that chunk) and more
than without the key (the replicas' own vllm:prefix_cache_hits_total). Then kill -9 of one replica while it holds
exactly five requests, known from its own /metrics before the kill (three streams, the official openai client's
stream, one non-streamed completion) and the other replica streams two: the contract is that a request nginx had
delivered to the dead replica fails and nothing else does. Each stream it held ends cut (no [DONE], no hang; the
openai client raises APIConnectionError), the non-streamed one gets nginx's 502, none is retried elsewhere (the access
log shows each with the dead replica alone); the other replica's streams carry on; every request sent once it is
gone succeeds on the other replica, those nginx first tried on the dead one retried after the refused connection
(at least one with and one without an affinity key). Ctrl-C (SIGINT) stops cluster.sh with exit 0. The second:
SIGTERM to one replica while it streams (its own drain log counts them): its streams run to their full length, new
requests all go to the other replica while it drains, it exits 0; SIGTERM stops cluster.sh with exit 0. Waits end on
events; their deadlines only stop a hang.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no nginx, no demo tokenizer).
"""
import http.client
import json
import os
import re
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

CONTEXT = 65536  # the fixture's positions
# A request known (from the replica's own /metrics) to be running when the kill is sent is still running when it
# lands: 60000 tokens are minutes of generation, the kill follows the reading at once.
ENDLESS = {"max_tokens": 60000, "ignore_eos": True, "temperature": 1.0}
# Streams a drain runs to their end: seconds (the first 4096 tokens take about one).
DRAINED = {"max_tokens": 8000, "ignore_eos": True, "temperature": 1.0}
# Prompt positions one prefill step computes (src/engine/engine.h, prefill_chunk). The fixture's sliding-window layers
# keep K/V only for their last 4 positions, so the prefix cache can adopt a prefix only where the sliding blocks
# before its end were still live: at the end of a prefill chunk or in decoding, never in the middle of a chunk.
PREFILL_CHUNK = 256
ACCESS = re.compile(r'"[^"]*" (?P<status>\d+) .* upstream=\[(?P<upstream>[^\]]*)\] .* session="(?P<session>[^"]*)"')


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
        self.model = synth_model(binary, workdir, max_position_embeddings=CONTEXT)
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
        """5 conversations of 4 turns, taken in turn (each history a prefix of its next prompt). Returns the hit tokens
        gained, and the hits an affinity key guarantees: a turn whose previous prompt ran past the first prefill chunk
        finds that chunk on the replica that computed it (nothing is evicted: the pool holds thousands of these
        prompts), so it adopts at least PREFILL_CHUNK positions."""
        before = hits(self.c)
        filler = " ".join(f"rule {i}: answer briefly and politely." for i in range(12))
        histories = {s: [{"role": "system", "content": f"Conversation {tag}-{s}. {filler}"}] for s in range(5)}
        prompt_tokens = {s: [] for s in histories}
        for turn in range(4):
            for s, history in histories.items():
                messages = history + [{"role": "user", "content": f"Question {turn}: tell me about item {turn}."}]
                headers = {"X-Session-Id": f"{tag}-{s}"} if affinity else {}
                status, _, body = self.c.request("POST", "/v1/chat/completions",
                                                 {"messages": messages, "max_tokens": 8, "temperature": 0}, headers)
                assert status == 200, (status, body)
                answer = json.loads(body)
                reply = answer["choices"][0]["message"]["content"] or ""
                prompt_tokens[s].append(answer["usage"]["prompt_tokens"])
                histories[s] = messages + [{"role": "assistant", "content": reply}]
        guaranteed = PREFILL_CHUNK * sum(p > PREFILL_CHUNK for turns in prompt_tokens.values() for p in turns[:-1])
        return hits(self.c) - before, guaranteed

    def prefix_cache_affinity(self):
        with_key, guaranteed = self.multi_turn("affine", affinity=True)
        without, _ = self.multi_turn("spread", affinity=False)
        print(f"  prefix-cache hit tokens, 5 conversations x 4 turns: {with_key:.0f} with X-Session-Id (at least "
              f"{guaranteed}: {PREFILL_CHUNK} for each turn whose previous prompt ran past {PREFILL_CHUNK} tokens), "
              f"{without:.0f} without")
        assert with_key >= guaranteed > 0, (with_key, guaranteed)
        assert with_key > without, (with_key, without)

    # ---- failures -----------------------------------------------------------------------------------------------

    def kill_under_load(self):
        """kill -9 of a replica holding five requests. The contract (docs/deploy.md, "N replicas on one machine"): a request
        nginx had delivered to the dead replica fails, as a cut stream (its headers were sent) or as nginx's 502 (no
        byte of an answer yet), and is not sent to another replica (a POST without `non_idempotent`); a request nginx
        could not deliver (connection refused) is retried on another replica. Nothing is sent during the kill itself:
        while the killed process's threads exit its listening socket still accepts connections, and a request
        delivered then is a 502 too (received, never answered)."""
        victim, survivor = self.c.replicas
        dead_keys = sorted(k for k, n in self.key_replica.items() if n == victim.name)
        live_keys = sorted(k for k, n in self.key_replica.items() if n == survivor.name)
        on_victim = [Stream(self.c.port, {"prompt": f"Stream {i} on the victim", **ENDLESS},
                            {"X-Session-Id": dead_keys[i % len(dead_keys)]}) for i in range(3)]
        on_survivor = [Stream(self.c.port, {"prompt": f"Stream {i} on the survivor", **ENDLESS},
                              {"X-Session-Id": live_keys[i % len(live_keys)]}) for i in range(2)]
        streams = on_victim + on_survivor
        blocking = {"status": None}  # a completion that is not streamed: its status line would come at its end

        def blocking_request():
            try:
                status, headers, _ = self.c.request("POST", "/v1/completions", {"prompt": "Not streamed", **ENDLESS},
                                                    {"X-Session-Id": dead_keys[0]}, timeout=HANG_STOP)
                blocking.update(status=status, replica=headers.get("x-qatserve-replica"))
            except (OSError, http.client.HTTPException) as e:
                blocking.update(status=type(e).__name__)

        # And the official openai client, streaming on the victim (an affinity key of it): what does it see?
        client = {"chunks": 0, "replica": None, "outcome": None}

        def openai_stream():
            api = openai.OpenAI(base_url=f"http://127.0.0.1:{self.c.port}/v1", api_key="unused", max_retries=0,
                                timeout=HANG_STOP)
            raw = api.completions.with_raw_response.create(model="tiny-e2b", prompt="Long story", stream=True,
                                                           extra_headers={"X-Session-Id": dead_keys[0]},
                                                           max_tokens=ENDLESS["max_tokens"],
                                                           extra_body={"ignore_eos": True})
            client["replica"] = raw.headers.get("x-qatserve-replica")
            try:
                for _ in raw.parse():
                    client["chunks"] += 1
                client["outcome"] = "ended normally"
            except openai.APIError as e:
                client["outcome"] = type(e).__name__

        threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
        threads += [threading.Thread(target=f, daemon=True) for f in (blocking_request, openai_stream)]
        for t in threads:
            t.start()
        held = len(on_victim) + 2  # its streams, the openai client's, the blocking completion

        def all_held():  # every stream under way, and each replica's own count of what it holds matches ours
            ended = [vars(s) for s in streams if s.end] + ([blocking] if blocking["status"] else [])
            assert not ended and client["outcome"] is None, ("ended before the kill", ended, client)
            if not (all(s.tokens >= 1 for s in streams) and client["chunks"] >= 1):
                return False
            return self.c.in_flight(victim) == held and self.c.in_flight(survivor) == len(on_survivor)
        wait_for(all_held, f"{held} requests running on {victim.name}, {len(on_survivor)} on {survivor.name}")
        log_at_kill = len(self.c.access_log())
        os.kill(victim.pid, signal.SIGKILL)
        # Gone = reaped by cluster.sh. Not sooner: the killed process shows as a zombie while its other threads still
        # exit, and until the last one does its listening socket stays open and takes connections (then resets them).
        wait_for(lambda: f"{victim.name} (pid {victim.pid}) exited with status 137" in self.c.log_text(),
                 f"{victim.name} reaped after kill -9")
        for t in threads[:len(on_victim)] + threads[len(streams):]:
            t.join(HANG_STOP)
            assert not t.is_alive(), "a request on the killed replica hung"

        # What it held failed, each in the way the contract says.
        assert all(s.replica == victim.name and s.end == "cut" and s.finish_reason is None for s in on_victim), \
            [vars(s) for s in on_victim]
        assert client["replica"] == victim.name and client["outcome"] == "APIConnectionError", client
        assert blocking["status"] == 502 and blocking["replica"] == victim.name, blocking
        # The other replica's streams carried on: more tokens after the kill, then the client hangs up.
        counts = [s.tokens for s in on_survivor]
        wait_for(lambda: all(s.end is None and s.tokens > n for s, n in zip(on_survivor, counts)) or
                 [vars(s) for s in on_survivor if s.end], f"the streams on {survivor.name} going on")
        assert all(s.end is None and s.replica == survivor.name for s in on_survivor), [vars(s) for s in on_survivor]
        for s, t in zip(on_survivor, threads[len(on_victim):len(streams)]):
            s.close()
            t.join(HANG_STOP)
            assert s.end == "closed", vars(s)

        # Everything sent now succeeds on the other replica: with no key (least connections) and with the keys that
        # hashed to the dead one, streamed and not.
        for i in range(4):
            status, headers, _ = self.c.request("POST", "/v1/completions", {"prompt": f"After {i}", "max_tokens": 2})
            assert status == 200 and headers["x-qatserve-replica"] == survivor.name, (status, headers)
        for key in dead_keys:
            status, headers, _ = self.c.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                                                {"X-Session-Id": key})
            assert status == 200 and headers["x-qatserve-replica"] == survivor.name, (key, status, headers)
        after = Stream(self.c.port, {"prompt": "Streamed after", "max_tokens": 16, "ignore_eos": True}).run()
        assert after.end == "done" and after.replica == survivor.name, vars(after)

        # nginx's own account (access log, from the kill on): the five delivered to the victim, each alone on it (not
        # retried: the cut streams 200, the completion 502); every other request that tried it retried on the other.
        def since_kill():
            lines = [ACCESS.search(line) for line in self.c.access_log()[log_at_kill:].splitlines()]
            assert all(lines), self.c.access_log()[log_at_kill:]
            return [m for m in lines if victim.addr in m["upstream"]]

        def all_logged():  # nginx writes a request's line as it ends it, maybe just after the client saw the end
            lines = since_kill()
            return lines if sum(m["upstream"] == victim.addr for m in lines) >= held else None
        delivered = wait_for(all_logged, "the access log lines of the requests the killed replica held")
        alone = sorted(m["status"] for m in delivered if m["upstream"] == victim.addr)
        retried = [m for m in delivered if m["upstream"] != victim.addr]
        assert alone == ["200"] * (held - 1) + ["502"], alone
        assert all(m["upstream"] == f"{victim.addr}, {survivor.addr}" and m["status"] == "200" for m in retried), \
            [m.group(0) for m in retried]
        keyed = [m for m in retried if m["session"] not in ("", "-")]  # nginx logs an empty variable as "-"
        print(f"  {victim.name} held {held} requests: its {len(on_victim)} streams and the openai client's cut "
              f"(client: {client['outcome']} after {client['chunks']} chunks), the completion a {blocking['status']}; "
              f"{survivor.name}'s {len(on_survivor)} streams went on; {len(dead_keys)} affinity keys of {victim.name} "
              f"moved to {survivor.name}; requests retried on {survivor.name} after a refused connection: "
              f"{len(retried) - len(keyed)} without a key, {len(keyed)} with one")
        # Each pool tries the dead replica before it counts three failures there (max_fails=3; a cut stream is not
        # one, a 502 is): at least one request of each was retried.
        assert len(keyed) >= 1 and len(retried) - len(keyed) >= 1, [m.group(0) for m in retried]

    def sigterm_drains(self):
        c = self.c2
        victim, survivor = c.replicas
        streams = []
        for i in range(4):  # least connections alternates them over the two replicas
            s = Stream(c.port, {"prompt": f"Drain stream {i}", **DRAINED})
            streams.append(s)
            threading.Thread(target=s.run, daemon=True).start()
            wait_for(lambda: s.replica is not None, "a stream's headers")
        on_victim = [s for s in streams if s.replica == victim.name]
        assert on_victim, [vars(s) for s in streams]

        def victim_streaming():  # its streams under way, and its own count of what it holds matches
            assert not any(s.end for s in on_victim), ("ended before SIGTERM", [vars(s) for s in on_victim])
            return all(s.tokens >= 1 for s in on_victim) and c.in_flight(victim) == len(on_victim)
        wait_for(victim_streaming, f"{len(on_victim)} streams running on {victim.name}")
        os.kill(victim.pid, signal.SIGTERM)
        victim_log = c.run_dir / f"{victim.name}.log"
        draining = wait_for(lambda: [line for line in victim_log.read_text().splitlines() if "finishing" in line],
                            f"{victim.name} logging its drain")
        held = re.search(r"finishing (\d+) running and (\d+) waiting", draining[0])
        assert held and int(held[1]) + int(held[2]) >= 1, draining[0]  # its own word: it had streams to drain
        for i in range(8):  # while it drains, new work goes to the other replica only
            headers = {"X-Session-Id": f"session-{i}"} if i % 2 else {}
            status, h, _ = c.request("POST", "/v1/completions", {"prompt": "New work", "max_tokens": 2}, headers)
            assert status == 200 and h["x-qatserve-replica"] == survivor.name, (status, h)
        wait_for(lambda: all(s.end for s in streams), "the streams ending")
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
        """One replica on every core: pinned to them (taskset), --threads = their count; cluster.sh itself started
        with one core (taskset -c): the replica on that core only, not pinned (one core for one replica), --threads 1.
        Two replicas are checked on the first cluster (cores_of_two)."""
        cpus = sorted(os.sched_getaffinity(0))
        runs = [("cluster-one-core", ["taskset", "-c", str(cpus[0])], cpus[:1])]
        if len(cpus) >= 2:
            runs.insert(0, ("cluster-pinned", [], cpus))
        for name, wrapper, allowed in runs:
            c = Cluster(self.binary, self.model, self.workdir, name, replicas=1, wrapper=wrapper)
            try:
                print(f"  {' '.join(wrapper + ['cluster.sh'])} --replicas 1 on cores {allowed}:")
                check_cores(c, allowed)
                assert c.stop() == 0
            finally:
                c.kill()

    def cores_of_two(self):
        """cluster.sh's rule for two replicas: each pinned to its own half of the cores when there are 4 or more,
        else both on every core with --threads = cores / 2 (at least 1)."""
        cpus = sorted(os.sched_getaffinity(0))
        check_cores(self.c, cpus)
        if len(cpus) < 4:
            print(f"  {len(cpus)} cores: the two replicas share them; the split (each replica pinned to its own "
                  f"cores) needs 4 and is not exercised on this machine")

    def run(self):
        self.check("bad input to cluster.sh: exit 1 or 2 with a message naming it", self.bad_input)
        self.check("one replica: pinned to its cores when it has 2 or more (cluster.sh's own, as taskset -c sets)",
                   self.pinning)
        self.c = Cluster(self.binary, self.model, self.workdir, "cluster-a")
        try:
            for name, fn in [("two replicas: own cores when there are 2 each, else shared (/proc)", self.cores_of_two),
                             ("every response names its replica (X-Qatserve-Replica)", self.replica_header),
                             ("an X-Session-Id reaches one replica every time", self.affinity),
                             ("prefix-cache hits with the affinity key: its guaranteed ones, more than without",
                              self.prefix_cache_affinity),
                             ("kill -9 of a replica holding 5 requests: exactly those fail", self.kill_under_load)]:
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


def allowed_cpus(pid):
    """A process's Cpus_allowed_list from /proc, as a sorted list of CPU ids."""
    text = Path(f"/proc/{pid}/status").read_text()
    listed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", text, re.M)[1]
    ids = []
    for part in listed.split(","):
        first, _, last = part.partition("-")
        ids += range(int(first), int(last or first) + 1)
    return sorted(ids)


def check_cores(cluster, cpus):
    """Each replica's allowed CPUs, --threads and replicas.tsv's cores column, against cluster.sh's rule: with at
    least two cores per replica, replica i pinned to cores [i*per, (i+1)*per) of cpus (per = cores / replicas), else
    every replica on every core ("shared"), --threads = cores / replicas (at least 1)."""
    n = len(cluster.replicas)
    per = max(1, len(cpus) // n)
    for i, r in enumerate(cluster.replicas):
        pinned = len(cpus) >= 2 * n
        want = cpus[i * per:(i + 1) * per] if pinned else cpus
        cmdline = Path(f"/proc/{r.pid}/cmdline").read_text().split("\0")
        threads = cmdline[cmdline.index("--threads") + 1]
        print(f"  {r.name} (pid {r.pid}): Cpus_allowed_list {allowed_cpus(r.pid)}, --threads {threads}, "
              f"replicas.tsv cores {r.cores}")
        assert allowed_cpus(r.pid) == want, (r.name, allowed_cpus(r.pid), want)
        assert threads == str(per), (r.name, cmdline)
        assert r.cores == (",".join(map(str, want)) if pinned else "shared"), (r.name, r.cores)


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
