"""SIGTERM during a stream: within --drain-timeout the stream runs to its full length, past it the stream is aborted;
either way the listener closes at once and the server exits 0."""
import http.client
import json
import signal

from server_harness import HANG_STOP, Server, ids_from_logprobs, wait_for


class ShutdownChecks:
    """The checks of a SIGTERM during a stream.

    Mixed into test_openai_server.Suite, which sets self.binary, self.model (the synthesized checkpoint),
    self.workdir, self.a (the main server) and self.client (the openai client on it).
    """

    def stream_through_sigterm(self, server, max_tokens=4000, frames_before_signal=8):
        """Streams a completion of max_tokens (ignore_eos) from `server` and sends it SIGTERM at the given frame.
        Once the log says the shutdown began, a new connection must be refused. Returns (token ids before the
        signal, token ids after it, the finish reason, the exit status, the shutdown log line)."""
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_STOP)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "prompt": [2, 9, 8], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        before, after, finish, frames = [], [], None, 0
        for line in iter(r.readline, b""):
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            choice = json.loads(line[len(b"data: "):])["choices"][0]
            (after if frames >= frames_before_signal else before).extend(
                ids_from_logprobs(choice["logprobs"]["tokens"]) if choice["logprobs"] else [])
            finish = choice["finish_reason"] or finish
            frames += 1
            if frames == frames_before_signal:
                server.proc.send_signal(signal.SIGTERM)
                wait_for(lambda: server.log_has("serve: shutting down"), "the shutdown log line")
                try:
                    server.request("GET", "/health", timeout=HANG_STOP)
                    raise AssertionError("still accepting connections after SIGTERM")
                except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
                    pass
        conn.close()
        rc = server.stop(timeout=HANG_STOP)
        shutdown = [l for l in server.log_text().splitlines() if "serve: shutting down" in l]
        return before, after, finish, rc, shutdown[0]

    def sigterm_drains(self):
        # The main server (--drain-timeout 300) is signalled at the 8th frame of a 4000-token stream. The log proves
        # the stream was still running when the drain began; it then runs to its full length, exit 0.
        before, after, finish, rc, shutdown = self.stream_through_sigterm(self.a)
        print(f"  {len(before)} tokens before the signal, {len(after)} after; {shutdown}", flush=True)
        assert "finishing 1 running and 0 waiting sequences" in shutdown, (shutdown, len(before))
        assert len(after) > 0, "no token arrived after the signal"
        assert finish == "length" and len(before) + len(after) == 4000, (finish, len(before), len(after))
        assert rc == 0, (rc, self.a.log_text()[-2000:])
        assert "serve: stopped" in self.a.log_text()

    def sigterm_past_drain_timeout_aborts(self):
        # With --drain-timeout 0 the stream running at the signal ends at once with finish_reason "abort", exit 0.
        d = Server(self.binary, self.model, self.workdir, "server-no-grace", "--drain-timeout", "0")
        try:
            d.wait_ready()
            before, after, finish, rc, shutdown = self.stream_through_sigterm(d)
            print(f"  {len(before)} tokens before the signal, {len(after)} after; {shutdown}", flush=True)
            assert "finishing 1 running and 0 waiting sequences (up to 0 s)" in shutdown, (shutdown, len(before))
            assert finish == "abort" and len(before) + len(after) < 4000, (finish, len(before), len(after))
            assert rc == 0, (rc, d.log_text()[-2000:])
        finally:
            d.kill()
