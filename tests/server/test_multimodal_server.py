#!/usr/bin/env python3
"""Images and audio through `qatserve serve`, held to transformers.

usage: test_multimodal_server.py QATSERVE_BINARY

Serves the multimodal fixtures (tests/fixtures/mm_e2b_like: vision and audio towers, E2B-like; mm_moe_like: vision
only, MoE; mm_unified_like: the 12B's encoder-free image and audio embedders), bf16/ and w4a16/, with f32 activations, and POSTs each fixture case (made by
tools/python/make_multimodal_fixtures.py) as an OpenAI chat request whose images are `image_url` data URLs of the PNGs
in media/ and whose audio is an `input_audio` part of the WAV: the greedy tokens (read back through
`logprobs` + `return_tokens_as_token_ids`) equal transformers' (reference.safetensors `<case>.greedy_f32`; ours stops
at an eos id, so it may be a prefix ending where the golden holds one), streaming and not, one at a time and all
at once. Also: /health and
/v1/models (and llama.cpp's /props) list the modalities the checkpoint reads; a corrupt image is a 400 naming its part, streaming or not;
audio sent to mm_moe_like is a 400 naming the part; a second turn that shows the same image again takes its soft
tokens from the media cache (qatserve_media_cache_hits_total rises, qatserve_media_encode_total does not).
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai package).
"""
import base64
import concurrent.futures as futures
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import SKIP, Checks, Server, sse_frames  # noqa: E402 (exits 77 without openai)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tools" / "python"))
from check_multimodal_cli import GREEDY_TOKENS, load_file, openai_messages  # noqa: E402
from make_multimodal_fixtures import cases  # noqa: E402
from PIL import Image  # noqa: E402


def fresh_png_data_url(seed):
    """A PNG no other check sent, so its first use must go through the tower."""
    rng = random.Random(seed)
    image = Image.new("RGB", (61, 40))
    image.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(61 * 40)])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def greedy_body(messages, stream=False):
    return {"messages": messages, "max_tokens": GREEDY_TOKENS, "temperature": 0, "logprobs": True,
            "return_tokens_as_token_ids": True, "stream": stream}


def token_ids(entries):
    return [int(e["token"].removeprefix("token_id:")) for e in entries]


class FixtureSuite(Checks):
    """One fixture, both formats: a server each, every case streamed and not."""

    def __init__(self, binary, workdir, fixture):
        super().__init__()
        self.binary, self.workdir, self.fixture = binary, Path(workdir), fixture
        self.meta = json.loads((fixture / "meta.json").read_text())
        self.ref = load_file(str(fixture / "reference.safetensors"))
        self.audio = self.meta["config"]["audio"] is not None
        self.conversations = cases(None, None, self.audio)
        self.eos = set(json.loads((fixture / "bf16" / "generation_config.json").read_text())["eos_token_id"])
        self.server = None

    def matches_golden(self, ids, case):
        golden = [int(t) for t in self.ref[f"{case}.greedy_f32"]]
        return ids == golden or (ids == golden[:len(ids)] and len(ids) < len(golden) and golden[len(ids)] in self.eos)

    def messages(self, case):
        return openai_messages(self.conversations[case], self.fixture / "media")

    def post(self, body):
        return self.server.request("POST", "/v1/chat/completions", body, timeout=300)

    # ---- checks ----

    def modalities(self):
        want = ["text", "image", "audio"] if self.audio else ["text", "image"]
        status, health = self.server.json("GET", "/health")
        assert status == 200 and health["modalities"] == want, health
        status, models = self.server.json("GET", "/v1/models")
        assert status == 200 and models["data"][0]["modalities"] == want, models
        status, props = self.server.json("GET", "/props")  # llama.cpp server's form
        assert status == 200 and props["modalities"] == {"vision": True, "audio": self.audio}, props

    def greedy(self, case, stream):
        status, _, data = self.post(greedy_body(self.messages(case), stream))
        assert status == 200, (status, data[:500])
        if stream:
            frames = [f for f in sse_frames(data) if f != "[DONE]"]
            ids = token_ids([e for f in frames for c in f["choices"] if c.get("logprobs")
                             for e in c["logprobs"]["content"]])
        else:
            ids = token_ids(json.loads(data)["choices"][0]["logprobs"]["content"])
        golden = [int(t) for t in self.ref[f"{case}.greedy_f32"]]
        assert self.matches_golden(ids, case), f"{case}: {ids} vs transformers {golden}"

    def concurrent(self):
        """Every case at once, twice (streaming and not): prepared on the workers side by side, encoded by the engine
        as each is admitted, batched together; each still gets its own golden tokens."""
        jobs = [(case, stream) for case in self.meta["cases"] for stream in (False, True)]
        with futures.ThreadPoolExecutor(len(jobs)) as pool:
            list(pool.map(lambda job: self.greedy(*job), jobs))

    def corrupt_image(self):
        png = (self.fixture / "media" / "odd_45x71.png").read_bytes()
        broken = png[:len(png) // 2]  # a truncated PNG: the header decodes, the pixels do not
        url = "data:image/png;base64," + base64.b64encode(broken).decode()
        messages = [{"role": "user", "content": [{"type": "text", "text": "Look."},
                                                 {"type": "image_url", "image_url": {"url": url}}]}]
        for stream in (False, True):
            status, headers, data = self.post(greedy_body(messages, stream))
            assert status == 400 and headers["content-type"] == "application/json", (stream, status, data[:300])
            error = json.loads(data)["error"]
            assert error["param"] == "messages" and "messages[0].content[1]" in error["message"], error
        assert self.server.json("GET", "/health")[0] == 200

    def audio_refused(self):
        wav = base64.b64encode((self.fixture / "media" / "chirp_0.6s.wav").read_bytes()).decode()
        messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                                                 {"type": "text", "text": "What is it?"}]}]
        for stream in (False, True):
            status, _, data = self.post(greedy_body(messages, stream))
            assert status == 400, (status, data[:300])
            message = json.loads(data)["error"]["message"]
            assert message == ("messages[0].content[0]: this model does not read audio input (no audio tower is "
                               "loaded)"), message

    def cache_hit_next_turn(self):
        image = {"type": "image_url", "image_url": {"url": fresh_png_data_url(self.fixture.name)}}
        turn1 = [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]
        before = self.server.metrics()
        status, _, data = self.post({"messages": turn1, "max_tokens": 4, "temperature": 0})
        assert status == 200, data[:300]
        reply = json.loads(data)["choices"][0]["message"]["content"]
        after1 = self.server.metrics()
        assert after1["qatserve_media_encode_total"] == before["qatserve_media_encode_total"] + 1, (before, after1)
        turn2 = turn1 + [{"role": "assistant", "content": reply},
                         {"role": "user", "content": [image, {"type": "text", "text": "And again?"}]}]
        status, _, data = self.post({"messages": turn2, "max_tokens": 4, "temperature": 0})
        assert status == 200, data[:300]
        after2 = self.server.metrics()
        assert after2["qatserve_media_encode_total"] == after1["qatserve_media_encode_total"], (after1, after2)
        assert after2["qatserve_media_cache_hits_total"] > after1["qatserve_media_cache_hits_total"], (after1, after2)

    def run(self):
        for fmt in ("bf16", "w4a16"):
            self.server = Server(self.binary, self.fixture / fmt, self.workdir, f"{self.fixture.name}-{fmt}",
                                 "--precision", "f32", "--threads", "2")
            try:
                self.server.wait_ready()
                name = f"{self.fixture.name}/{fmt}"
                self.check(f"{name}: /health, /v1/models and /props list the modalities", self.modalities)
                for case in self.meta["cases"]:
                    for stream in (False, True):
                        self.check(f"{name} {case}{' stream' if stream else ''}: greedy tokens = transformers'",
                                   lambda c=case, s=stream: self.greedy(c, s))
                if fmt == "bf16":
                    self.check(f"{name}: every case at once = transformers'", self.concurrent)
                    self.check(f"{name}: a corrupt image is a 400 naming the part", self.corrupt_image)
                    if not self.audio:
                        self.check(f"{name}: audio is a 400 naming the part", self.audio_refused)
                    self.check(f"{name}: the same image next turn comes from the media cache", self.cache_hit_next_turn)
            finally:
                self.server.kill()
        return self.summary(f"{self.fixture.name} multimodal server checks", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-mm-server-test-") as tmp:
        rc = max(FixtureSuite(binary, tmp, FIXTURES / name).run() for name in ("mm_e2b_like", "mm_moe_like",
                                                                         "mm_unified_like"))
    print(f"multimodal server test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
