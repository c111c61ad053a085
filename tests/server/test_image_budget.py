#!/usr/bin/env python3
"""Per-request image budgets through `qatserve serve`, held to transformers' Gemma 4 processor.

usage: test_image_budget.py QATSERVE_BINARY

Serves tests/fixtures/mm_e2b_like/bf16 (processor budget 70 soft tokens) with `--image-soft-tokens 140
--max-image-soft-tokens 560` and sends one image (media/odd_45x71.png, a data URL) with the openai client:
- each budget a request can name (OpenAI's `detail` low / high / auto on the image part, vLLM's
  `mm_processor_kwargs: {"max_soft_tokens": N}`, the server's default) gives the prompt token count that
  transformers' Gemma4Processor gives for the same conversation with images_kwargs max_soft_tokens = that budget
  (detail low = 70, high = the server's largest = 560, auto and absent = the request's budget); the Responses API's
  input_image `detail` and mm_processor_kwargs do the same;
- bad values (a budget Gemma 4 does not take, one above the server's largest, an unknown mm_processor_kwargs key, an
  unknown detail) are 400s naming the field, and the server stays up.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai / transformers in .venv).
"""
import base64
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import SKIP, Checks, Server  # noqa: E402 (exits 77 without openai)

try:
    from PIL import Image
    from transformers import AutoTokenizer
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
    from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor
except ImportError as e:
    print(f"image budget test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "mm_e2b_like"
MODEL = FIXTURE / "bf16"
PNG = FIXTURE / "media" / "odd_45x71.png"
DEFAULT, LARGEST = 140, 560
URL = "data:image/png;base64," + base64.b64encode(PNG.read_bytes()).decode()
TEXT = "Describe this."


def fixture_processor():
    """Gemma4Processor from the fixture's processor_config.json (it has no video processor file for AutoProcessor)."""
    config = json.loads((MODEL / "processor_config.json").read_text())
    drop = ("image_processor_type", "feature_extractor_type")
    return Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(**{k: v for k, v in config["feature_extractor"].items()
                                                         if k not in drop}),
        image_processor=Gemma4ImageProcessorPil(**{k: v for k, v in config["image_processor"].items() if k not in drop}),
        tokenizer=AutoTokenizer.from_pretrained(MODEL), video_processor=Gemma4VideoProcessor(),
        chat_template=(MODEL / "chat_template.jinja").read_text(), image_seq_length=config["image_seq_length"])


def image_part(detail=None):
    part = {"type": "image_url", "image_url": {"url": URL}}
    if detail is not None:
        part["image_url"]["detail"] = detail
    return part


class BudgetSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        self.processor = fixture_processor()
        self.image = Image.open(PNG).convert("RGB")

    def reference_tokens(self, budget):
        """transformers' prompt length for the conversation with the image at `budget` soft tokens."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TEXT}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = self.processor(text=text, images=[self.image], add_special_tokens=False,
                                images_kwargs={"max_soft_tokens": budget})
        return len(inputs["input_ids"][0])

    def prompt_tokens(self, part, **extra):
        r = self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": [part, {"type": "text", "text": TEXT}]}], max_tokens=1,
            temperature=0, **extra)
        return r.usage.prompt_tokens

    def chat_budgets(self):
        want = {b: self.reference_tokens(b) for b in (70, 140, 280, 560)}
        assert len(set(want.values())) == 4, want  # the image is small: every budget resizes it differently
        cases = [(image_part(), {}, DEFAULT), (image_part("auto"), {}, DEFAULT), (image_part("low"), {}, 70),
                 (image_part("high"), {}, LARGEST),
                 (image_part(), {"extra_body": {"mm_processor_kwargs": {"max_soft_tokens": 280}}}, 280),
                 (image_part("auto"), {"extra_body": {"mm_processor_kwargs": {"max_soft_tokens": 70}}}, 70),
                 (image_part("high"), {"extra_body": {"mm_processor_kwargs": {"max_soft_tokens": 70}}}, LARGEST)]
        for part, extra, budget in cases:
            got = self.prompt_tokens(part, **extra)
            assert got == want[budget], (part["image_url"].get("detail"), extra, got, want)

    def responses_budgets(self):
        want = self.reference_tokens(70)
        r = self.client.responses.create(
            model="m", max_output_tokens=1,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": URL, "detail": "low"},
                                                {"type": "input_text", "text": TEXT}]}])
        assert r.usage.input_tokens == want, (r.usage, want)
        r = self.client.responses.create(
            model="m", max_output_tokens=1, extra_body={"mm_processor_kwargs": {"max_soft_tokens": 560}},
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": URL, "detail": "auto"},
                                                {"type": "input_text", "text": TEXT}]}])
        assert r.usage.input_tokens == self.reference_tokens(560), r.usage

    def bad_values(self):
        messages = [{"role": "user", "content": [image_part(), {"type": "text", "text": TEXT}]}]
        for kwargs, words in [({"max_soft_tokens": 100}, "expected one of 70, 140, 280, 560, 1120"),
                              ({"max_soft_tokens": 1120}, "allows at most 560"),
                              ({"images_kwargs": {}}, "mm_processor_kwargs.images_kwargs is not supported")]:
            status, body = self.server.json("POST", "/v1/chat/completions",
                                            {"messages": messages, "max_tokens": 1, "mm_processor_kwargs": kwargs})
            assert status == 400 and body["error"]["param"] == "mm_processor_kwargs", (kwargs, status, body)
            assert words in body["error"]["message"], body
        bad_detail = [{"role": "user", "content": [image_part("ultra")]}]
        status, body = self.server.json("POST", "/v1/chat/completions", {"messages": bad_detail, "max_tokens": 1})
        assert status == 400 and "messages[0].content[0].image_url.detail" in body["error"]["message"], body
        assert self.server.json("GET", "/health")[0] == 200

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "budget", "--precision", "f32",
                             "--image-soft-tokens", str(DEFAULT), "--max-image-soft-tokens", str(LARGEST))
        try:
            self.server.wait_ready()
            self.client = self.server.client()
            for name, fn in [("chat: detail and mm_processor_kwargs = transformers' token counts", self.chat_budgets),
                             ("responses: input_image detail and mm_processor_kwargs", self.responses_budgets),
                             ("bad budgets: 400s naming the field", self.bad_values)]:
                self.check(name, fn)
        finally:
            self.server.stop()
        return self.summary("image budget test", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-budget-") as tmp:
        return BudgetSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
