#!/usr/bin/env python3
"""http(s) image URLs end to end, on loopback only: a Python http.server holds the multimodal fixture's PNGs.

usage: test_media_urls.py QATSERVE_BINARY

1. `qatserve logits --messages` on tests/fixtures/mm_e2b_like/bf16, every image given as an http://127.0.0.1 URL
   with --allowed-media-domains 127.0.0.1: the tokens equal the HF processor's and the float32 logits are within
   check_multimodal_cli's bound of transformers' (the goldens in reference.safetensors), as with data URLs.
2. Without --allowed-media-domains the URL is refused, the error saying how the operator enables it; with it, a URL
   answering text/html, a 404 or a redirect to a host not allowed is refused naming the part and the reason, and
   a host listed through '*' only is refused for its loopback address.
3. `qatserve serve` takes the flags (ready on /health) and refuses a malformed allow-list entry at start, naming it.
The server does not read media parts yet (no towers in `serve`), so the fetch's answers are checked through the
command line, which reads chat messages with the server's own parser.
Exit status: 0 passed, 1 failed, 77 skipped (no openai package, as test_openai_server.py).
"""
import json
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from server_harness import ROOT, Checks, Server

sys.path.insert(0, str(ROOT / "tools" / "python"))
import numpy as np  # noqa: E402
from check_multimodal_cli import F32_REL, load_file  # noqa: E402
from make_multimodal_fixtures import cases  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "mm_e2b_like"


class MediaHandler(BaseHTTPRequestHandler):
    """/<name>.png: the fixture's image; /page: text/html; /away: a redirect to example.com; else 404."""

    def do_GET(self):
        png = FIXTURE / "media" / self.path.lstrip("/")
        if self.path.endswith(".png") and png.is_file():
            self.answer(200, "image/png", png.read_bytes())
        elif self.path == "/page":
            self.answer(200, "text/html", b"<html></html>")
        elif self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "http://example.com/odd_45x71.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.answer(404, "text/plain", b"no")

    def answer(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


def url_messages(conversation, base):
    """The conversation as OpenAI messages, each image an http URL on `base` (the fixture has no audio here)."""
    def part(p):
        if p["type"] == "text":
            return {"type": "text", "text": p["text"]}
        assert p["type"] == "image", p
        return {"type": "image_url", "image_url": {"url": f"{base}/{p['name']}.png"}}
    return [{"role": m["role"], "content": [part(p) for p in m["content"]]} for m in conversation]


class MediaUrlChecks(Checks):
    def __init__(self, binary, workdir, base):
        super().__init__()
        self.binary, self.workdir, self.base = binary, Path(workdir), base
        self.meta = json.loads((FIXTURE / "meta.json").read_text())
        self.ref = load_file(str(FIXTURE / "reference.safetensors"))
        self.conversations = cases(None, None, False)

    def logits(self, messages, *flags):
        path = self.workdir / "messages.json"
        path.write_text(json.dumps({"messages": messages}))
        out = self.workdir / "logits.safetensors"
        r = subprocess.run([self.binary, "logits", "--model", FIXTURE / "bf16", "--messages", path, "--out", out,
                            "--precision", "f32", *flags], capture_output=True, text=True)
        return r, out

    def images_by_url_match_transformers(self):
        image_cases = [c for c in self.meta["cases"] if c in self.conversations and c != "text_only"]
        assert image_cases, self.meta["cases"]
        for case in image_cases:
            r, out = self.logits(url_messages(self.conversations[case], self.base),
                                 "--allowed-media-domains", "127.0.0.1", "--media-fetch-timeout", "30")
            assert r.returncode == 0, r.stderr
            got = load_file(str(out))
            assert np.array_equal(got["tokens"], self.ref[f"{case}.input_ids"]), case
            rows, want = self.ref[f"{case}.logits_rows"], self.ref[f"{case}.logits_f32"]
            rel = float((np.abs(got["logits"][rows] - want).max(-1) / np.abs(want).max(-1)).max())
            assert rel <= F32_REL, (case, rel)
            print(f"  {case}: tokens equal, max|diff|/max|ref| = {rel:.3g}")

    def refusals_name_the_part(self):
        image = lambda path: [{"role": "user", "content": [  # noqa: E731
            {"type": "text", "text": "Look"}, {"type": "image_url", "image_url": {"url": self.base + path}}]}]
        where = "messages[0].content[1].image_url.url"
        r, _ = self.logits(image("/odd_45x71.png"))
        assert r.returncode != 0 and f"{where}: this server does not fetch images from URLs (its operator allows " \
            "hosts with --allowed-media-domains)" in r.stderr, r.stderr
        allowed = ("--allowed-media-domains", "127.0.0.1,*.b.org")
        for path, reason in [("/page", "its Content-Type is 'text/html', not image/*"),
                             ("/gone.png", "answered 404 Not Found"),
                             ("/away", "redirected to http://example.com/odd_45x71.png: the host 'example.com' is "
                                       "not one this server fetches media from")]:
            r, _ = self.logits(image(path), *allowed)
            assert r.returncode != 0 and f"{where}: {self.base}{path}: {reason}" in r.stderr, r.stderr
        r, _ = self.logits(image("/odd_45x71.png"), "--allowed-media-domains", "*")
        assert r.returncode != 0 and "127.0.0.1 is a non-public address (loopback)" in r.stderr, r.stderr

    def serve_takes_the_flags(self):
        bad = subprocess.run([self.binary, "serve", "--model", FIXTURE / "bf16", "--allowed-media-domains",
                              "a.com,http://b.org"], capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "allowed media host 'http://b.org' is not" in bad.stderr, bad.stderr
        server = Server(self.binary, FIXTURE / "bf16", self.workdir, "serve", "--allowed-media-domains",
                        "a.com, *.b.org,127.0.0.1", "--media-fetch-timeout", "2")
        try:
            server.wait_ready()
        finally:
            server.stop()


def main():
    binary = sys.argv[1]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), MediaHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            checks = MediaUrlChecks(binary, tmp, f"http://127.0.0.1:{httpd.server_address[1]}")
            checks.check("images by URL match transformers", checks.images_by_url_match_transformers)
            checks.check("refusals name the part and the reason", checks.refusals_name_the_part)
            checks.check("serve takes the flags", checks.serve_takes_the_flags)
            print(f"\nmedia URLs: {len(checks.passed)} passed, {len(checks.failed)} failed")
            return 1 if checks.failed else 0
    finally:
        httpd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
