#!/usr/bin/env python3
"""Prometheus (Debian's) scraping replicas started by scripts/cluster.sh, with deploy/prometheus/'s configuration.

usage: test_prometheus.py QATSERVE_BINARY

`promtool check config`, `promtool check rules` and `promtool test rules` (every alert fires when it should) on
deploy/prometheus/; then a real scrape: two replicas (--max-running 1, so requests queue) under a streaming load,
Prometheus with the same configuration at a 1 s scrape and evaluation interval, and PromQL over its HTTP API: per
replica throughput (rate of vllm:generation_tokens_total), queue length (vllm:num_requests_waiting) and KV usage
(vllm:kv_cache_usage_perc), the recording rules of the same, then a replica killed: `up` 0 and QatserveReplicaDown
pending for it. Waits end on events; their deadlines only stop a hang.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no prometheus/promtool/nginx, no demo tokenizer).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from cluster_util import HANG_STOP, ROOT, Checks, Cluster, Stream, free_port, skip_unless, synth_model, wait_for

CONFIG_DIR = ROOT / "deploy" / "prometheus"


def promtool(*args):
    out = subprocess.run(["promtool", *args], capture_output=True, text=True)
    assert out.returncode == 0, f"promtool {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout + out.stderr


class Prometheus:
    """prometheus --config.file=DIR/prometheus.yml on a free loopback port, its data in DIR/data."""

    def __init__(self, config, workdir):
        self.port = free_port()
        self.log_path = Path(workdir) / "prometheus.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={Path(workdir) / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._ready, "Prometheus ready")

    def _ready(self):
        assert self.proc.poll() is None, f"prometheus exited: {self.log_path.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def by_replica(self, promql):
        """An instant query's vector as {replica label: value}."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return {s["metric"].get("replica"): float(s["value"][1]) for s in data["result"]}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Suite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)

    def promtool_checks(self):
        promtool("check", "rules", str(CONFIG_DIR / "qatserve-rules.yml"))
        print("  " + promtool("test", "rules", str(CONFIG_DIR / "qatserve-rules.test.yml")).strip().replace("\n", " "))

    def live_config(self):
        """deploy/prometheus/ copied beside the targets cluster.sh wrote, at a 1 s scrape and evaluation interval."""
        run_dir = self.c.run_dir
        config = yaml.safe_load((CONFIG_DIR / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        (run_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        shutil.copy(CONFIG_DIR / "qatserve-rules.yml", run_dir / "qatserve-rules.yml")
        promtool("check", "config", str(run_dir / "prometheus.yml"))
        return run_dir / "prometheus.yml"

    def scrape(self):
        p = self.p
        replicas = {r.name for r in self.c.replicas}
        wait_for(lambda: p.by_replica('up{job="qatserve"}') == {r: 1.0 for r in replicas}, "both replicas scraped")
        # four long streams per replica; one runs (--max-running 1), the others wait
        streams = [Stream(self.c.port, {"prompt": f"Load {i}", "max_tokens": 3000, "ignore_eos": True})
                   for i in range(8)]
        threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
        for t in threads:
            t.start()
        queries = {
            "throughput": 'sum by (replica) (rate(vllm:generation_tokens_total{job="qatserve"}[5s]))',
            "queue": 'max by (replica) (vllm:num_requests_waiting{job="qatserve"})',
            "kv": 'max by (replica) (vllm:kv_cache_usage_perc{job="qatserve"})',
        }
        seen = {what: {} for what in queries}  # the largest value each query gave per replica during the load

        def loaded():
            for what, q in queries.items():
                for replica, value in p.by_replica(q).items():
                    seen[what][replica] = max(value, seen[what].get(replica, 0.0))
            return all(set(v) == replicas and all(x > 0 for x in v.values()) for v in seen.values())
        wait_for(loaded, "throughput, queue and KV usage above 0 for both replicas in Prometheus")
        for what, values in seen.items():
            print(f"  {what} (largest seen): " + ", ".join(f"{r} {v:.3g}" for r, v in sorted(values.items())))
        assert all(0 < v <= 1 for v in seen["kv"].values()), seen["kv"]
        # the recording rules have a series per replica
        for rule in ("qatserve:generation_tokens:rate1m", "qatserve:requests_waiting", "qatserve:kv_cache_usage"):
            wait_for(lambda: set(p.by_replica(rule)) == replicas, f"recording rule {rule} for both replicas")
        for t in threads:
            t.join(HANG_STOP)
        assert all(s.end == "done" for s in streams), [vars(s) for s in streams]

    def replica_down(self):
        victim = self.c.replicas[1]
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(lambda: self.p.by_replica('up{job="qatserve"}').get(victim.name) == 0.0, f"up == 0 for {victim.name}")

        def pending():
            alerts = self.p.api("alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "QatserveReplicaDown"
                    and a["labels"].get("replica") == victim.name]
        alert = wait_for(pending, "QatserveReplicaDown for the dead replica")[0]
        print(f"  QatserveReplicaDown {alert['state']} for {victim.name} ({alert['labels']['instance']})")
        assert alert["state"] in ("pending", "firing"), alert

    def run(self):
        self.check("promtool check rules, test rules (every alert)", self.promtool_checks)
        model = synth_model(self.binary, self.workdir)
        self.c = Cluster(self.binary, model, self.workdir, "cluster", serve_args=["--max-running", "1"])
        self.p = None
        try:
            self.p = Prometheus(self.live_config(), self.workdir)
            self.check("PromQL per replica: throughput, queue length, KV usage (a live scrape)", self.scrape)
            self.check("a killed replica: up 0, QatserveReplicaDown", self.replica_down)
        finally:
            if self.p:
                self.p.stop()
            self.c.stop()
            self.c.kill()
        print(f"\nprometheus checks: {len(self.passed)} passed, {len(self.failed)} failed")
        if self.failed and self.p:
            print(f"--- prometheus log:\n{self.p.log_path.read_text()[-3000:]}")
        return 1 if self.failed else 0


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    for tool in ("prometheus", "promtool", "nginx"):
        skip_unless(tool, "prometheus test")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-prometheus-test-") as tmp:
        rc = Suite(os.path.abspath(sys.argv[1]), tmp).run()
    print(f"prometheus test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
