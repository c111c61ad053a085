"""What an operator starts `qatserve serve` with, each on a server of its own beside test_openai_server.py's main one:
the 503 while loading, startup failures, API keys (flag, file, environment), a full queue's 429, --served-model-name,
--max-model-len, --threads and the JSON log."""
import concurrent.futures as futures
import json
import os
import signal
import subprocess

from server_harness import Server, free_port, wait_for, write_fifo

import openai  # after server_harness, which exits 77 without it
from prometheus_client.parser import text_string_to_metric_families


class OptionsChecks:
    """The checks of serve's options and of its start.

    Mixed into test_openai_server.Suite, which sets self.binary, self.model (the synthesized checkpoint),
    self.workdir, self.a (the main server) and self.client (the openai client on it).
    """

    def slow_loading_server(self, name):
        """A server whose config.json is a named pipe: the model load waits until the test writes it. Meanwhile the
        server already listens. Returns (server, config bytes, pipe path) once /health has answered."""
        slow = self.workdir / name
        subprocess.run(["cp", "-r", str(self.model), str(slow)], check=True)
        config = (slow / "config.json").read_bytes()
        (slow / "config.json").unlink()
        os.mkfifo(slow / "config.json")
        d = Server(self.binary, slow, self.workdir, f"server-{name}")
        try:
            def health():
                assert d.proc.poll() is None, d.log_text()
                try:
                    return d.json("GET", "/health")
                except (ConnectionRefusedError, ConnectionResetError):
                    return None

            status, body = wait_for(health, "the server listening")
            assert status == 503 and body["status"] == "loading", (status, body)
        except BaseException:
            d.kill()  # it would wait on the pipe forever
            raise
        return d, config, slow / "config.json"

    def loading(self):
        # /health answers 503 "loading" and generation 503 until the model has loaded and run once.
        d, config, pipe = self.slow_loading_server("tiny-e2b-slow")
        try:
            status, err = d.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
            assert status == 503 and "loading" in err["error"]["message"], (status, err)
            write_fifo(pipe, config)
            ready = d.wait_ready()
            assert ready["status"] == "ok" and ready["model"] == "tiny-e2b-slow", ready
            r = d.client().completions.create(model="tiny-e2b-slow", prompt="hi", max_tokens=2)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert d.stop() == 0, d.log_text()
        finally:
            d.kill()
        # SIGTERM while loading is a clean stop too.
        e, _, _ = self.slow_loading_server("tiny-e2b-stuck")
        try:
            assert e.stop() == 0, e.log_text()
            assert "interrupted while loading" in e.log_text(), e.log_text()
        finally:
            e.kill()

    def startup_failures(self):
        # A busy port and a missing model: exit 1 with the reason, at once.
        for args, reason in [(["--model", str(self.model), "--port", str(self.a.port)], "cannot listen"),
                             (["--model", str(self.workdir / "no-such-model"), "--port", str(free_port())],
                              "no-such-model")]:
            out = subprocess.run([self.binary, "serve", *args], capture_output=True, text=True, timeout=20)
            assert out.returncode == 1 and reason in out.stderr, (args, out.returncode, out.stderr)
        assert self.a.request("GET", "/health")[0] == 200  # the first server still owns its port

    def api_key(self):
        b = Server(self.binary, self.model, self.workdir, "server-key", "--api-key", "sekrit")
        try:
            b.wait_ready()
            assert b.request("GET", "/health")[0] == 200  # open without a key
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
                status, err = b.json("GET", "/v1/models", headers=headers)
                assert status == 401 and err["error"]["code"] == "invalid_api_key", (headers, status, err)
            assert b.request("GET", "/metrics")[0] == 401
            try:
                b.client("wrong").chat.completions.create(model="tiny-e2b", messages=[{"role": "user", "content": "x"}])
                raise AssertionError("wrong key accepted")
            except openai.AuthenticationError as e:
                assert e.status_code == 401
            r = b.client("sekrit").chat.completions.create(
                model="tiny-e2b", messages=[{"role": "user", "content": "x"}], max_tokens=3)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert b.stop(signal.SIGINT) == 0, b.log_text()
        finally:
            b.kill()

    def queue_overflow(self):
        c = Server(self.binary, self.model, self.workdir, "server-queue", "--max-running", "1", "--max-waiting", "1")
        try:
            c.wait_ready()
            body = {"prompt": [2, 5, 6, 7], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
            with futures.ThreadPoolExecutor(12) as pool:
                results = list(pool.map(lambda _: c.request("POST", "/v1/completions", body), range(12)))
            statuses = [r[0] for r in results]
            assert 200 in statuses and 429 in statuses, statuses
            assert set(statuses) <= {200, 429}, statuses
            for status, headers, data in results:
                if status == 429:
                    err = json.loads(data)["error"]
                    assert headers.get("retry-after") and err["type"] and "capacity" in err["message"], (headers, err)
                else:
                    assert json.loads(data)["usage"]["completion_tokens"] == 1000
            m = c.metrics()
            assert m['qatserve_requests_total{outcome="rejected"}'] == statuses.count(429), m
            assert c.stop(signal.SIGTERM) == 0, c.log_text()
        finally:
            c.kill()

    def operator_flags(self):
        """--served-model-name (vLLM's 404 for other names), --max-model-len, --threads, --api-key-file and
        --log-format json, end to end with the openai client; every log line is one JSON object."""
        key_file = self.workdir / "api-key"
        key_file.write_text("sk-from-file\n")
        o = Server(self.binary, self.model, self.workdir, "server-operator", "--served-model-name", "gemma-test",
                   "--max-model-len", "64", "--threads", "1", "--api-key-file", str(key_file), "--log-format", "json")
        try:
            o.wait_ready()
            client = o.client("sk-from-file")
            assert [m.id for m in client.models.list().data] == ["gemma-test"]
            status, raw = o.json("GET", "/v1/models", headers={"Authorization": "Bearer sk-from-file"})
            assert status == 200 and raw["data"][0]["max_model_len"] == 64, raw
            r = client.chat.completions.create(model="gemma-test", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=4, temperature=0)
            assert r.model == "gemma-test" and r.choices[0].finish_reason in ("stop", "length"), r
            try:
                client.chat.completions.create(model="tiny-e2b", messages=[{"role": "user", "content": "Hi"}])
                raise AssertionError("a request for another model was served")
            except openai.NotFoundError as e:
                err = e.response.json()["error"]
                assert e.status_code == 404 and err["type"] == "NotFoundError" and err["code"] == 404, err
                assert err["message"] == "The model `tiny-e2b` does not exist.", err
            try:
                client.completions.create(model="gemma-test", prompt="word " * 80, max_tokens=4)
                raise AssertionError("a prompt past --max-model-len was served")
            except openai.BadRequestError as e:
                assert "64" in e.response.json()["error"]["message"], e.response.text
            try:
                o.client("sk-wrong").models.list()
                raise AssertionError("a wrong key was let in")
            except openai.AuthenticationError:
                pass
            status, _, data = o.request("GET", "/metrics", headers={"Authorization": "Bearer sk-from-file"})
            assert status == 200, status
            running = [s for f in text_string_to_metric_families(data.decode()) for s in f.samples
                       if s.name == "vllm:num_requests_running"]
            assert [s.labels for s in running] == [{"model_name": "gemma-test", "engine": "0"}], running
            assert o.stop(signal.SIGTERM) == 0
            lines = [json.loads(line) for line in o.log_text().splitlines() if line.strip()]
            events = {line["event"]: line for line in lines}
            for event in ("listening", "loaded", "kv_pool", "warm_up", "ready", "request", "draining", "stopped"):
                assert event in events, (event, [line["event"] for line in lines])
            assert events["loaded"]["max_model_len"] == 64 and events["loaded"]["threads"] == 1, events["loaded"]
            # The default KV pool is sized for --max-running contexts of 64 tokens, not of the model's 4096.
            main_pool = self.a.metrics()["qatserve_kv_cache_total_bytes"]
            assert events["kv_pool"]["kv_bytes"] < main_pool / 8, (events["kv_pool"], main_pool)
            assert "memory plan" in events["kv_pool"]["source"], events["kv_pool"]
            request = next(line for line in lines if line["event"] == "request" and line["outcome"] != "abort")
            for field in ("id", "path", "n", "prompt_tokens", "completion_tokens", "ttft_s", "tokens_per_s",
                          "latency_s", "outcome", "time", "level", "message"):
                assert field in request, (field, request)
            rejected = [line for line in lines if line["event"] == "rejected"]
            assert any(line["status"] == 404 for line in rejected), rejected
        finally:
            o.kill()

    def api_key_from_environment(self):
        """QATSERVE_API_KEY sets the key, out of sight of `ps`."""
        e = Server(self.binary, self.model, self.workdir, "server-env-key",
                   env={**os.environ, "QATSERVE_API_KEY": "sk-from-env"})
        try:
            e.wait_ready()
            assert "sk-from-env" not in " ".join(e.proc.args)
            assert [m.id for m in e.client("sk-from-env").models.list().data] == ["tiny-e2b"]
            status, _ = e.json("GET", "/v1/models")
            assert status == 401, status
            assert e.stop(signal.SIGTERM) == 0
        finally:
            e.kill()
