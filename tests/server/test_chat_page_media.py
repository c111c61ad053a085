#!/usr/bin/env python3
"""Image and audio attachments on the chat page of `qatserve serve` (GET /), in headless Chromium (selenium).

usage: test_chat_page_media.py QATSERVE_BINARY SCREENSHOT_DIR

Serves tests/fixtures/mm_e2b_like/bf16 (vision and audio towers). In Chromium the page shows its attach button;
a PNG and a WAV go in through the file input and an image is pasted into the message box; each shows as a chip
(name, size, a thumbnail for the image) and the pasted one is removed again; a text file is refused with a note
saying what the model reads. Sending puts the image and an audio player into the transcript, and the request the
server logs has the prompt token count that transformers' Gemma4Processor gives for the same image, audio and text,
so the attachments reached the model. A corrupt PNG gets the server's 400 on the page, a body over a small
`--max-body-bytes` its 413 (the attachments go back into the composer). mm_moe_like (vision only) refuses a WAV with
a note; a model without towers (the synthesized tiny E2B) shows no attach button and a pasted image attaches
nothing. Writes SCREENSHOT_DIR/chat_page_media.png and chat_page_media_phone.png (390 px wide, chips and an image
in the transcript; the page must not be wider than the screen).
Exit status: 0 all passed, 1 a check failed, 77 skipped (no selenium, chromium, chromedriver or transformers).
"""
import base64
import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_chat_page import PHONE, Page, run_browser_suite  # noqa: E402 (exits 77 without selenium)
from test_image_budget import fixture_processor  # noqa: E402 (exits 77 without transformers)
from server_harness import DEMO_TOKENIZER, Checks, Server  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
MEDIA = FIXTURES / "mm_e2b_like" / "media"
PNG, WAV, PASTED = MEDIA / "odd_45x71.png", MEDIA / "chirp_0.6s.wav", MEDIA / "square_50x50.png"
TEXT = "What are these?"
BODY_LIMIT = 4096  # bytes: less than the PNG's data URL

# Pastes a file into the message box as a browser does (a ClipboardEvent whose clipboardData holds it).
PASTE = """const [b64, name, type] = arguments;
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], name, {type}));
    document.getElementById('input').dispatchEvent(
        new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));"""


def format_bytes(n):
    """The size as the page writes it."""
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MB"


class MediaPage(Page):
    def attach(self, *paths):
        """Chooses files in the attach button's file input, as a person picking them would."""
        self.driver.find_element("id", "attach-input").send_keys("\n".join(str(p) for p in paths))

    def paste(self, path, type_):
        self.js(PASTE, base64.b64encode(Path(path).read_bytes()).decode(), Path(path).name, type_)

    def chips(self):
        """The composer's attachment chips: name, size, the image's src (None for audio)."""
        return self.js("""return [...document.querySelectorAll('#chips .chip')].map(c => ({
            name: c.querySelector('.name').textContent, size: c.querySelector('.size').textContent,
            img: c.querySelector('img') ? c.querySelector('img').src : null}))""")

    def note(self):
        return self.js("const n = document.getElementById('attach-note'); return n.hidden ? null : n.textContent")

    def attach_shown(self):
        return self.js("return !document.getElementById('attach').hidden")


class Suite(Checks):
    def __init__(self, binary, workdir, shots, chromium, chromedriver):
        super().__init__()
        self.binary, self.workdir, self.shots = binary, Path(workdir), Path(shots)
        self.chromium, self.chromedriver = chromium, chromedriver

    def server(self, model, name, *extra):
        server = Server(self.binary, model, self.workdir, name, "--threads", "1", *extra)
        self.servers.append(server)
        server.wait_ready()
        return server

    def reference_prompt_tokens(self):
        """transformers' prompt length for one user turn holding the image, the audio and the text."""
        processor = fixture_processor()
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": TEXT}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        with wave.open(str(WAV)) as w:
            assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
            samples = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768
        inputs = processor(text=text, images=[Image.open(PNG).convert("RGB")], audio=[samples],
                           add_special_tokens=False)
        return len(inputs["input_ids"][0])

    def logged_prompt_tokens(self, server):
        """prompt=N of the server's last /v1/chat/completions request line."""
        lines = [l for l in server.log_text().splitlines() if " /v1/chat/completions " in l and " prompt=" in l]
        assert lines, server.log_text()[-2000:]
        return int(re.search(r" prompt=(\d+) ", lines[-1]).group(1))

    def open_ready(self, server):
        self.page.open(server)
        self.page.wait("the model to load", self.page.ready)
        self.page.set_field("max-tokens", 4)
        self.page.set_field("temperature", 0)

    def error_after(self, before):
        return self.page.wait("the error", lambda: (e := self.page.errors()) and len(e) > before and e[-1])

    # ---- the model with both towers -----------------------------------------------------------------------------

    def attach_button_shown(self):
        self.open_ready(self.mm)
        assert self.page.attach_shown()
        accept = self.page.js("return document.getElementById('attach-input').accept")
        assert accept == "image/*,audio/*", accept

    def refused_type_noted(self):
        notes = self.workdir / "notes.txt"
        notes.write_text("not media\n")
        self.page.attach(notes)
        note = self.page.wait("the note", self.page.note)
        assert note == ("Not attached: notes.txt (text/plain). This model reads PNG, JPEG, WebP or GIF images and "
                        "WAV, MP3, FLAC or Ogg audio."), note
        assert self.page.chips() == []

    def chips_attach_paste_remove(self):
        self.page.attach(PNG, WAV)
        chips = self.page.wait("two chips", lambda: len(c := self.page.chips()) == 2 and c)
        assert [(c["name"], c["size"]) for c in chips] == [
            (PNG.name, format_bytes(PNG.stat().st_size)), (WAV.name, format_bytes(WAV.stat().st_size))], chips
        assert chips[0]["img"] == "data:image/png;base64," + base64.b64encode(PNG.read_bytes()).decode()
        assert chips[1]["img"] is None
        assert self.page.note() is None  # the refusal's note went with the next good choice
        self.page.paste(PASTED, "image/png")
        chips = self.page.wait("the pasted chip", lambda: len(c := self.page.chips()) == 3 and c)
        assert chips[2]["name"] == PASTED.name and chips[2]["img"].startswith("data:image/png;base64,"), chips
        self.page.driver.find_element("css selector", f"#chips button[aria-label='Remove {PASTED.name}']").click()
        chips = self.page.wait("the chip removed", lambda: len(c := self.page.chips()) == 2 and c)
        assert [c["name"] for c in chips] == [PNG.name, WAV.name], chips

    def phone_width(self):
        self.page.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
        try:
            overflow = self.page.js("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"the page is {overflow} px wider than a phone screen"
            rect = self.page.js("return document.getElementById('attach').getBoundingClientRect().toJSON()")
            assert 0 <= rect["left"] and rect["right"] <= PHONE["width"] and rect["bottom"] <= PHONE["height"], rect
            self.page.screenshot(self.shots / "chat_page_media_phone.png")
        finally:
            self.page.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    def sent_to_the_model(self):
        want = self.reference_prompt_tokens()
        self.page.set_field("input", TEXT)
        index = len(self.page.replies())
        self.page.driver.find_element("id", "send").click()
        reply = self.page.finished_reply(index)
        assert reply["state"] == "done" and not self.page.errors(), (reply, self.page.errors())
        assert self.page.chips() == []  # the composer is empty for the next message
        got = self.logged_prompt_tokens(self.mm)
        assert got == want, f"the server's prompt has {got} tokens, transformers' Gemma4Processor {want}"
        print(f"  prompt tokens {got} = Gemma4Processor's for the image, the audio and the text")
        user = self.page.js("""const m = [...document.querySelectorAll('.msg.user')].pop();
            return {text: m.textContent, img: m.querySelector('img') && m.querySelector('img').src,
                    audio: m.querySelector('audio') && m.querySelector('audio').src}""")
        assert user["text"].endswith(TEXT) and user["img"].startswith("data:image/png;base64,"), user
        assert user["audio"] == "data:audio/wav;base64," + base64.b64encode(WAV.read_bytes()).decode(), user["audio"][:60]
        # The player and the thumbnail load (the page's CSP allows data: images and media); nothing logged an error.
        duration = self.page.wait("the player to read the clip", lambda: self.page.js(
            "const a = [...document.querySelectorAll('.msg.user audio')].pop(); return a.readyState >= 1 && a.duration"))
        assert abs(duration - 0.6) < 0.01, duration
        assert self.page.js("const i = [...document.querySelectorAll('.msg.user img')].pop(); "
                            "return i.complete && i.naturalWidth") == 45
        problems = [e for e in self.page.driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert not problems, problems
        self.page.screenshot(self.shots / "chat_page_media.png")

    def bad_image_400(self):
        broken = self.workdir / "broken.png"
        broken.write_bytes(PNG.read_bytes()[:len(PNG.read_bytes()) // 2])  # the header decodes, the pixels do not
        self.page.driver.find_element("id", "new-chat").click()
        before = len(self.page.errors())
        self.page.attach(broken)
        self.page.wait("the chip", lambda: len(self.page.chips()) == 1)
        self.page.set_field("input", "Look.")
        self.page.driver.find_element("id", "send").click()
        error = self.error_after(before)
        assert error.startswith("Error: messages[0].content[0].image_url.url: "), error
        assert [c["name"] for c in self.page.chips()] == ["broken.png"]  # back in the composer for another try
        assert self.page.js("return document.getElementById('input').value") == "Look."

    # ---- other servers ------------------------------------------------------------------------------------------

    def body_limit_413(self):
        small = self.server(FIXTURES / "mm_e2b_like" / "bf16", "server-small-body", "--max-body-bytes", str(BODY_LIMIT))
        status, _, data = small.request("POST", "/v1/chat/completions", b"{" + b" " * BODY_LIMIT + b"}")
        assert status == 413, (status, data[:200])
        self.open_ready(small)
        self.page.attach(PNG)
        self.page.wait("the chip", lambda: len(self.page.chips()) == 1)
        self.page.set_field("input", "hi")
        self.page.driver.find_element("id", "send").click()
        error = self.error_after(0)
        assert error.startswith(f"Error: the request body is larger than the limit of {BODY_LIMIT} bytes. ") \
            and "--max-body-bytes" in error, error
        assert [c["name"] for c in self.page.chips()] == [PNG.name]

    def vision_only_refuses_audio(self):
        moe = self.server(FIXTURES / "mm_moe_like" / "bf16", "server-vision-only")
        self.open_ready(moe)
        assert self.page.attach_shown()
        assert self.page.js("return document.getElementById('attach-input').accept") == "image/*"
        self.page.attach(WAV, PNG)
        note = self.page.wait("the note", self.page.note)
        assert note == f"Not attached: {WAV.name} (audio/wav). This model reads PNG, JPEG, WebP or GIF images.", note
        assert [c["name"] for c in self.page.chips()] == [PNG.name]

    def no_towers_no_button(self):
        model = self.workdir / "tiny-e2b"
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        text_only = self.server(model, "server-text-only")
        self.open_ready(text_only)
        assert not self.page.attach_shown()
        self.page.paste(PNG, "image/png")
        assert self.page.chips() == [] and self.page.note() is None

    def run(self):
        self.servers = []
        self.page = MediaPage(self.chromium, self.chromedriver, self.workdir / "chromium-profile")
        try:
            self.mm = self.server(FIXTURES / "mm_e2b_like" / "bf16", "server-mm")
            checks = [
                ("a model with towers: the attach button, for images and audio", self.attach_button_shown),
                ("a text file is refused with a note", self.refused_type_noted),
                ("chips: file input, paste, remove", self.chips_attach_paste_remove),
                ("phone width with chips", self.phone_width),
                ("sent: the prompt has Gemma4Processor's token count, the transcript shows the media",
                 self.sent_to_the_model),
                ("a corrupt image: the server's 400 is shown", self.bad_image_400),
                ("a body over --max-body-bytes: the 413 is shown", self.body_limit_413),
                ("a vision-only model refuses audio with a note", self.vision_only_refuses_audio),
                ("a model without towers: no attach button", self.no_towers_no_button),
            ]
            for name, fn in checks:
                self.check(name, fn)
        finally:
            self.page.quit()
            for server in self.servers:
                server.kill()
        return self.summary("chat page media checks", self.mm)


def main():
    return run_browser_suite(Suite, "chat page media")


if __name__ == "__main__":
    sys.exit(main())
