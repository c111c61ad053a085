#!/usr/bin/env python3
"""POST /v1/audio/transcriptions through the official `openai` client, against `qatserve serve`.

usage: test_audio_transcriptions.py QATSERVE_BINARY

Serves tests/fixtures/mm_e2b_like/bf16 (an audio tower; f32 activations, --max-model-len 512 so that the unbounded
transcriptions of the random fixture stay short) and sends its WAV clip the way the SDK's users do,
`client.audio.transcriptions.create(model=..., file=open(wav, "rb"))`: the transcript (json and text formats, with a
`language`, a `prompt`, streamed as `transcript.text.delta` events) equals, text and token counts, what the same clip
asked through /v1/chat/completions gives, with the transcription request of Gemma 4's model card written here from the
card (the audio tower itself is held to transformers by the multimodal_server test). Refusals, each a 400 in OpenAI's
error shape naming the field, the server staying up: no file, a PNG as the file, an unknown response_format, language
or field, verbose_json, a JSON body; an upload over the body limit is a 413; mm_moe_like (no audio tower) a 400.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai package).
"""
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import Checks, Server, sse_frames  # noqa: E402 (exits 77 without openai)

import openai  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
WAV = FIXTURES / "mm_e2b_like" / "media" / "chirp_0.6s.wav"
PNG = FIXTURES / "mm_e2b_like" / "media" / "odd_45x71.png"
BOUNDARY = "qatserve-test-boundary"


def card_instruction(language="", prompt=""):
    """The ASR request of Gemma 4's model card (audio first, then this text); without a language, its own."""
    head = (f"Transcribe the following speech segment in {language} into {language} text." if language
            else "Transcribe the following speech segment in its original language.")
    text = (head + "\n\nFollow these specific instructions for formatting the answer:\n"
            "* Only output the transcription, with no newlines.\n"
            "* When transcribing numbers, write the digits, i.e. write 1.7 and not one point seven, and write 3 "
            "instead of three.")
    return text + (f"\n* The speech continues this text: {prompt}" if prompt else "")


def multipart(fields, files):
    """A multipart/form-data body: fields {name: value}, files {name: (filename, bytes)}."""
    out = b""
    for name, value in fields.items():
        out += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    for name, (filename, data) in files.items():
        out += (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


class TranscriptionSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, workdir
        self.server = None

    def chat_answer(self, instruction, temperature=0):
        wav = base64.b64encode(WAV.read_bytes()).decode()
        messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                                                 {"type": "text", "text": instruction}]}]
        status, data = self.server.json("POST", "/v1/chat/completions",
                                        {"messages": messages, "temperature": temperature})
        assert status == 200, data
        return data["choices"][0]["message"]["content"], data["usage"]

    def upload(self, fields, files, content_type=None):
        body = multipart(fields, files)
        headers = {"Content-Type": content_type or f"multipart/form-data; boundary={BOUNDARY}"}
        return self.server.request("POST", "/v1/audio/transcriptions", body, headers)

    def refused(self, param, needle, fields=None, files=None, content_type=None, body=None):
        if body is not None:
            status, _, data = self.server.request("POST", "/v1/audio/transcriptions", body,
                                                  {"Content-Type": content_type})
        else:
            status, _, data = self.upload(fields or {}, files if files is not None else {"file": ("a.wav", WAV.read_bytes())},
                                          content_type)
        assert status == 400, (status, data[:300])
        error = json.loads(data)["error"]
        assert error["param"] == param and needle in error["message"], error
        assert self.server.json("GET", "/health")[0] == 200

    # ---- checks ----

    def json_format(self):
        client = self.server.client()
        with open(WAV, "rb") as f:
            result = client.audio.transcriptions.create(model="mm_e2b_like", file=f)
        text, usage = self.chat_answer(card_instruction())
        assert result.text == text and result.usage.output_tokens > 0, (result.text, text, result.usage)
        assert result.usage.type == "tokens" and result.usage.input_tokens == usage["prompt_tokens"], result.usage
        assert result.usage.output_tokens == usage["completion_tokens"], (result.usage, usage)

    def text_format_language_prompt(self):
        client = self.server.client()
        with open(WAV, "rb") as f:
            result = client.audio.transcriptions.create(model="mm_e2b_like", file=f, response_format="text",
                                                        language="fr", prompt="Bonjour")
        text, _ = self.chat_answer(card_instruction("French", "Bonjour"))
        assert isinstance(result, str) and result == text, (result, text)

    def temperature(self):
        """A sampled transcription: the field reaches the sampler (a seedless sample differs; only the shape is held)."""
        client = self.server.client()
        with open(WAV, "rb") as f:
            result = client.audio.transcriptions.create(model="mm_e2b_like", file=f, temperature=0.7)
        assert isinstance(result.text, str) and result.usage.output_tokens > 0, result

    def streamed(self):
        client = self.server.client()
        with open(WAV, "rb") as f:
            events = list(client.audio.transcriptions.create(model="mm_e2b_like", file=f, stream=True))
        deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
        done = [e for e in events if e.type == "transcript.text.done"]
        text, usage = self.chat_answer(card_instruction())
        assert len(done) == 1 and events[-1] is done[0], [e.type for e in events]
        assert "".join(deltas) == done[0].text == text, (deltas, done[0].text, text)
        assert done[0].usage.output_tokens == usage["completion_tokens"], done[0].usage
        status, headers, data = self.upload({"stream": "true"}, {"file": ("a.wav", WAV.read_bytes())})
        assert status == 200 and headers["content-type"] == "text/event-stream", (status, headers)
        assert sse_frames(data)[-1] == "[DONE]"

    def refusals(self):
        self.refused("file", "file is required", fields={"model": "m"}, files={})
        self.refused("file", "file", files={"file": ("picture.wav", PNG.read_bytes())})
        self.refused("response_format", "json or text", fields={"response_format": "verbose_json"})
        self.refused("response_format", "not one of json, text", fields={"response_format": "xml"})
        self.refused("language", "ISO 639-1", fields={"language": "klingon"})
        self.refused("temperature", "must be a number", fields={"temperature": "warm"})
        self.refused("timestamp_granularities[]", "not supported", fields={"timestamp_granularities[]": "word"})
        self.refused("file", "multipart/form-data", body=b'{"file": "x"}', content_type="application/json")
        self.refused("file", "does not end", body=f"--{BOUNDARY}\r\nContent-Disposition: form-data; "
                     f'name="file"; filename="a.wav"\r\n\r\nRIFF'.encode(),
                     content_type=f"multipart/form-data; boundary={BOUNDARY}")
        client = self.server.client()
        try:
            client.audio.transcriptions.create(model="mm_e2b_like", file=("notes.txt", b"not audio at all"))
            raise AssertionError("a text file was transcribed")
        except openai.BadRequestError as e:
            assert e.body["param"] == "file", e.body

    def too_large(self):
        status, _, data = self.upload({}, {"file": ("big.wav", b"\0" * (9 << 20))})
        assert status == 413, (status, data[:200])
        assert self.server.json("GET", "/health")[0] == 200

    def no_audio_tower(self):
        server = Server(self.binary, FIXTURES / "mm_moe_like" / "bf16", self.workdir, "mm_moe_like", "--threads", "2",
                        "--max-model-len", "512")
        try:
            server.wait_ready()
            with open(WAV, "rb") as f:
                server.client().audio.transcriptions.create(model="mm_moe_like", file=f)
            raise AssertionError("a model without an audio tower transcribed")
        except openai.BadRequestError as e:
            assert e.body["param"] == "file" and "no audio tower" in e.body["message"], e.body
        finally:
            server.kill()

    def run(self):
        self.server = Server(self.binary, FIXTURES / "mm_e2b_like" / "bf16", self.workdir, "mm_e2b_like",
                             "--precision", "f32", "--threads", "2", "--max-model-len", "512")
        try:
            self.server.wait_ready()
            self.check("json: the transcript = the same clip asked through chat completions", self.json_format)
            self.check("text, language and prompt = chat completions", self.text_format_language_prompt)
            self.check("temperature is taken", self.temperature)
            self.check("stream: transcript.text.delta events add up to transcript.text.done = chat", self.streamed)
            self.check("bad uploads are 400s naming the field; the server stays up", self.refusals)
            self.check("an upload over the body limit is a 413", self.too_large)
            self.check("a model without an audio tower is a 400", self.no_audio_tower)
        finally:
            self.server.kill()
        return self.summary("audio transcription checks", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="qatserve-transcription-test-") as tmp:
        rc = TranscriptionSuite(os.path.abspath(sys.argv[1]), tmp).run()
    print(f"audio transcription test took {time.time() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
