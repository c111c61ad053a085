#!/usr/bin/env python3
"""The chat page of `qatserve serve` (GET /) in a real browser: headless Chromium driven by selenium.

usage: test_chat_page.py QATSERVE_BINARY SCREENSHOT_DIR

Synthesizes the tiny E2B checkpoint with the demo tokenizer and starts servers on free ports. In Chromium the page
loads from the server (and nothing from elsewhere), sends a message and shows the reply growing as it streams, with
the text the server gives for the same request; the Thinking switch renders the template's thinking turn (the prompt
token count of the API request with enable_thinking); HTML in messages stays text; a server error is shown with the
server's message; a long reply is stopped (it stops growing, the server logs the request as aborted and the page is
usable again); behind --api-key the page asks for the key (again after a refusal or a 401); with --no-ui, / is 404.
On the demo model (models/gemma4-tiny-qat) the page's replies of a two-turn conversation, and of one with the
Thinking switch on, are the API's greedy answers to the same conversations.
Writes SCREENSHOT_DIR/chat_page.png (desktop) and chat_page_phone.png (390 px wide) for people to look at.
Waits are for events (page state, server metrics) with generous timeouts; nothing asserts on time.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no selenium, chromium or chromedriver).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import DEMO_TOKENIZER, Checks, Server  # noqa: E402  (the same server harness as the API test)

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    print("chat page test skipped: selenium is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

WAIT = 90  # seconds: only stops a hung test; every wait ends on an event
MODEL = "tiny-e2b"
DEMO_MODEL = Path(__file__).resolve().parents[2] / "models" / "gemma4-tiny-qat"
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}


def find_browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return chromium, driver


class Page:
    """The chat page in one headless Chromium."""

    def __init__(self, chromium, chromedriver, profile):
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1200,820", f"--user-data-dir={profile}", "--no-first-run"]:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)

    def quit(self):
        self.driver.quit()

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def wait(self, what, condition, timeout=WAIT):
        """Waits until condition() is truthy (it is re-evaluated on each poll) and returns its value."""
        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(
            lambda _: condition(), message=f"timed out waiting for {what}")

    def open(self, server):
        self.driver.get(f"http://127.0.0.1:{server.port}/")

    def ready(self):
        return self.js("return !document.getElementById('send').disabled")

    def set_field(self, element_id, value):
        self.js("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                "e.dispatchEvent(new Event('input'));", element_id, str(value))

    def send(self, text):
        """Sends a message; returns the index its reply will have."""
        index = len(self.replies())
        self.set_field("input", text)
        self.driver.find_element("id", "send").click()
        return index

    def replies(self):
        """Every assistant reply: its state, content text (exact, as the DOM holds it) and numbers line."""
        return self.js("""return [...document.querySelectorAll('.msg.assistant')].map(m => ({
            state: m.dataset.state, text: m.querySelector('.content').textContent,
            meta: m.querySelector('.meta').textContent}))""")

    def reply(self, index):
        replies = self.replies()
        return replies[index] if index < len(replies) else None

    def finished_reply(self, index):
        """Waits until reply `index` has ended (done, stopped or error) and returns it."""
        return self.wait(f"reply {index} to end", lambda: (r := self.reply(index)) and r["state"] != "streaming" and r)

    def errors(self):
        return self.js("return [...document.querySelectorAll('.msg.error')].map(m => m.textContent)")

    def record_lengths(self):
        """From now on the page records the length of the newest reply at every change of the DOM."""
        self.js("""window.replyLengths = [];
            window.replyObserver = new MutationObserver(() => {
              const replies = document.querySelectorAll('.msg.assistant');
              const last = replies[replies.length - 1];
              if (last && last.dataset.state === 'streaming')
                window.replyLengths.push(last.querySelector('.content').textContent.length);
            });
            window.replyObserver.observe(document.getElementById('log'),
                                         {childList: true, subtree: true, characterData: true});""")

    def recorded_lengths(self):
        """The lengths recorded since record_lengths(); recording stops."""
        return self.js("window.replyObserver.disconnect(); return window.replyLengths")

    def key_dialog_open(self):
        return self.js("return document.getElementById('key-dialog').open")

    def enter_key(self, key):
        self.set_field("key-input", key)
        self.js("document.getElementById('key-form').requestSubmit()")

    def screenshot(self, path):
        assert self.driver.save_screenshot(str(path)), path
        print(f"screenshot: {path}")


class Suite(Checks):
    def __init__(self, binary, workdir, shots, chromium, chromedriver):
        super().__init__()
        self.binary, self.workdir, self.shots = binary, Path(workdir), Path(shots)
        self.chromium, self.chromedriver = chromium, chromedriver
        self.model = self.workdir / MODEL

    def chat_body(self, text, **fields):
        """The request the page sends for a one-message conversation, without streaming."""
        return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}

    # ---- the page on a plain server -----------------------------------------------------------------------------

    def page_is_served_self_contained(self):
        status, headers, body = self.a.request("GET", "/")
        assert status == 200 and headers["content-type"].startswith("text/html"), (status, headers)
        assert "connect-src 'self'" in headers["content-security-policy"], headers
        assert b"<script src" not in body and b"<link rel=\"stylesheet\"" not in body
        self.page.open(self.a)
        self.page.wait("the model to load", self.page.ready)
        label = self.page.js("return document.getElementById('model').textContent")
        assert label.startswith(MODEL) and "context 4096" in label, label
        # The demo template has enable_thinking: the switch is offered.
        assert self.page.js("return !document.getElementById('thinking-row').hidden")
        origin = f"http://127.0.0.1:{self.a.port}/"
        loaded = self.page.js("return performance.getEntriesByType('resource').map(r => r.name)")
        assert all(name.startswith(origin) for name in loaded), loaded
        problems = [e for e in self.page.driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert not problems, problems  # no script error, no blocked load (CSP)

    def streamed_reply(self):
        text = "Why is the sky blue?"
        self.page.set_field("temperature", 0)
        self.page.set_field("max-tokens", 1000)  # long enough to span many frames of the page
        self.page.record_lengths()
        reply = self.page.finished_reply(self.page.send(text))
        assert reply["state"] == "done", reply
        lengths = sorted(set(self.page.recorded_lengths()) - {0})
        assert len(lengths) >= 2, f"the reply did not grow while streaming: lengths seen {lengths}"
        print(f"  the reply was seen at {len(lengths)} lengths while streaming, {lengths[-1]} characters last")
        # The page shows exactly the text the server gives for the same request.
        status, expected = self.a.json("POST", "/v1/chat/completions",
                                       self.chat_body(text, temperature=0, max_tokens=1000))
        assert status == 200, expected
        assert reply["text"] == expected["choices"][0]["message"]["content"], (reply["text"], expected)
        n = expected["usage"]["completion_tokens"]
        assert reply["meta"].startswith(f"{n} tokens \u00b7 ") and " tok/s \u00b7 first token " in reply["meta"], reply

    def thinking_switch_reaches_the_prompt(self):
        """The Thinking switch changes what the model is given: with it on, the page's request renders the template's
        thinking turn, so the server counts as many prompt tokens as for the API request with
        chat_template_kwargs.enable_thinking (more than without it); with it off, as many as without."""
        text = "Say hello."
        expected = {}
        for on in (False, True):
            extra = {"chat_template_kwargs": {"enable_thinking": True}} if on else {}
            status, body = self.a.json("POST", "/v1/chat/completions",
                                       self.chat_body(text, temperature=0, max_tokens=1, **extra))
            assert status == 200, body
            expected[on] = body["usage"]["prompt_tokens"]
        assert expected[True] > expected[False], expected
        for on in (True, False):  # off last: the checks after this one run with the switch off
            self.page.open(self.a)  # a fresh conversation
            self.page.wait("the model to load", self.page.ready)
            self.page.set_field("max-tokens", 1)
            self.page.js("document.getElementById('thinking').checked = arguments[0]", on)
            before = self.a.metrics()["qatserve_prompt_tokens_total"]
            reply = self.page.finished_reply(self.page.send(text))
            assert reply["state"] == "done", reply
            counted = self.page.wait("the server to count the prompt", lambda: int(
                self.a.metrics()["qatserve_prompt_tokens_total"] - before))
            assert counted == expected[on], (f"thinking {'on' if on else 'off'}", counted, expected)
        print(f"  prompt tokens: {expected[False]} with the switch off, {expected[True]} with it on, as the API")

    def html_stays_text(self):
        text = "<b>bold</b> & <img src=x onerror=alert(1)> 'quotes' \"too\""
        self.page.set_field("max-tokens", 4)
        self.page.finished_reply(self.page.send(text))
        users = self.page.js("return [...document.querySelectorAll('.msg.user')].map(m => m.textContent)")
        assert users[-1] == text, users
        assert self.page.js("return document.querySelectorAll('#log b, #log img').length") == 0

    def server_error_shown(self):
        # max_tokens past the context: the server's 400 message appears as it is (for the page's conversation,
        # a new one holding just this message).
        self.page.driver.find_element("id", "new-chat").click()
        too_many = 100000
        status, err = self.a.json("POST", "/v1/chat/completions", self.chat_body("hi", max_tokens=too_many))
        assert status == 400, err
        self.page.set_field("max-tokens", too_many)
        before = len(self.page.errors())
        self.page.send("hi")
        errors = self.page.wait("the error", lambda: (e := self.page.errors()) and len(e) > before and e)
        assert errors[-1] == "Error: " + err["error"]["message"], (errors[-1], err)
        assert self.page.js("return document.getElementById('input').value") == "hi"  # back for another try
        self.page.set_field("input", "")

    def stop_long_reply(self):
        before = self.a.metrics()
        self.page.set_field("max-tokens", 3900)
        index = self.page.send("Tell me a long story.")
        self.page.wait("the first words", lambda: (r := self.page.reply(index)) and r["text"])
        self.page.driver.find_element("id", "stop").click()
        reply = self.page.finished_reply(index)
        assert reply["state"] == "stopped" and reply["meta"].startswith("stopped after "), reply
        # The server notices the closed connection: the request ends as aborted, no sequence keeps running.
        key = 'qatserve_requests_total{outcome="abort"}'
        metrics = self.page.wait("the server to abort the request", lambda: (
            m := self.a.metrics())[key] == before[key] + 1 and m["qatserve_requests_running"] == 0 and m)
        generated = metrics["qatserve_generation_tokens_total"] - before["qatserve_generation_tokens_total"]
        assert generated < 3900, generated
        print(f"  stopped at {len(reply['text'])} characters; the server generated {generated:.0f} of 3900 tokens")
        log = [l for l in self.a.log_text().splitlines() if "/v1/chat/completions" in l and "outcome=abort" in l]
        assert log and log[-1].endswith("(client gone)"), log
        # It stopped growing: nothing changed since the stop, though the server has finished with it.
        assert self.page.reply(index) == reply, (self.page.reply(index), reply)
        # And the page is usable again.
        assert self.page.js("return document.getElementById('stop').hidden && "
                            "!document.getElementById('send').hidden")
        # A short reply, in a new conversation: the stopped story alone may fill the tiny model's 4096 positions
        # (1388 tokens in the 0.4 s the stop took to arrive on a fast machine; the follow-up then got the server's
        # context-length error, shown as such).
        self.page.driver.find_element("id", "new-chat").click()
        self.page.set_field("max-tokens", 24)
        reply = self.page.finished_reply(self.page.send("Thanks. And a short one?"))
        assert reply["state"] == "done" and reply["text"], reply

    def screenshots(self):
        self.page.screenshot(self.shots / "chat_page.png")
        self.page.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
        try:
            self.page.js("document.getElementById('log').scrollTop = 1e9")
            overflow = self.page.js("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"the page is {overflow} px wider than a phone screen"
            # One column: settings folded behind their button, the composer on screen.
            assert self.page.js("return getComputedStyle(document.getElementById('settings')).display") == "none"
            bottom = self.page.js("return document.getElementById('composer').getBoundingClientRect().bottom")
            assert bottom <= PHONE["height"], bottom
            self.page.screenshot(self.shots / "chat_page_phone.png")
            self.page.driver.find_element("id", "settings-toggle").click()
            assert self.page.js("return getComputedStyle(document.getElementById('settings')).display") == "flex"
            self.page.screenshot(self.shots / "chat_page_phone_settings.png")
        finally:
            self.page.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    # ---- other servers ------------------------------------------------------------------------------------------

    def api_key(self):
        b = Server(self.binary, self.model, self.workdir, "server-key", "--api-key", "sekrit")
        try:
            b.wait_ready()
            assert b.request("GET", "/")[0] == 200  # the page itself needs no key
            self.page.open(b)
            self.page.wait("the key dialog", self.page.key_dialog_open)
            assert not self.page.ready()
            self.page.enter_key("wrong")
            self.page.wait("the refusal", lambda: self.page.key_dialog_open() and "refused" in self.page.js(
                "return document.getElementById('key-message').textContent"))
            self.page.enter_key("sekrit")
            self.page.wait("the model to load", self.page.ready)
            assert not self.page.key_dialog_open()
            assert self.page.js("return sessionStorage.getItem('qatserve-api-key')") == "sekrit"
            self.page.set_field("max-tokens", 4)
            reply = self.page.finished_reply(self.page.send("hi"))
            assert reply["state"] == "done", reply
            # A key that stops working: the next request's 401 asks again, then the message goes through.
            self.page.js("sessionStorage.setItem('qatserve-api-key', 'revoked')")
            index = self.page.send("again")
            self.page.wait("the key dialog", self.page.key_dialog_open)
            self.page.enter_key("sekrit")
            reply = self.page.finished_reply(index)
            assert reply["state"] == "done" and not self.page.errors(), self.page.replies()
            assert b.stop() == 0, b.log_text()
        finally:
            b.kill()

    def no_ui(self):
        c = Server(self.binary, self.model, self.workdir, "server-no-ui", "--no-ui")
        try:
            c.wait_ready()
            status, err = c.json("GET", "/")
            assert status == 404 and err["error"]["message"] == "no route for GET /", (status, err)
            assert c.json("GET", "/v1/models")[0] == 200
            assert c.stop() == 0, c.log_text()
        finally:
            c.kill()

    def demo_model_conversation(self):
        """On the demo model (models/gemma4-tiny-qat), greedy: each reply of a two-turn conversation is the content
        the API gives for the conversation so far, and with the Thinking switch on, for the request with
        enable_thinking."""
        d = Server(self.binary, DEMO_MODEL, self.workdir, "server-demo")
        try:
            d.wait_ready()
            for thinking, questions in ((False, ["Who wrote Emma?", "Tell me about Elizabeth."]), (True, ["Hello!"])):
                self.page.open(d)  # a fresh conversation
                self.page.wait("the model to load", self.page.ready)
                self.page.set_field("temperature", 0)
                self.page.set_field("max-tokens", 64)
                self.page.js("document.getElementById('thinking').checked = arguments[0]", thinking)
                history = []
                for text in questions:
                    reply = self.page.finished_reply(self.page.send(text))
                    history.append({"role": "user", "content": text})
                    extra = {"chat_template_kwargs": {"enable_thinking": True}} if thinking else {}
                    status, expected = d.json("POST", "/v1/chat/completions", {
                        "model": "m", "messages": history, "temperature": 0, "max_tokens": 64, **extra})
                    assert status == 200, expected
                    answer = expected["choices"][0]["message"]["content"]
                    assert reply["state"] == "done" and reply["text"] == answer, (text, reply, answer)
                    history.append({"role": "assistant", "content": answer})
                print(f"  thinking {'on' if thinking else 'off'}: {[m['content'] for m in history][-1]!r}")
        finally:
            d.kill()

    def run(self):
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(self.model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        self.a = Server(self.binary, self.model, self.workdir, "server-main")
        self.page = Page(self.chromium, self.chromedriver, self.workdir / "chromium-profile")
        try:
            self.a.wait_ready()
            checks = [
                ("the page is served and loads nothing from elsewhere", self.page_is_served_self_contained),
                ("a reply streams in and matches the server's text", self.streamed_reply),
                ("the Thinking switch reaches the prompt", self.thinking_switch_reaches_the_prompt),
                ("HTML in a message stays text", self.html_stays_text),
                ("a server error is shown with its message", self.server_error_shown),
                ("stop: the reply stops, the server aborts it, the page is usable again", self.stop_long_reply),
                ("screenshots, desktop and phone width", self.screenshots),
                ("the demo model: a two-turn conversation and the Thinking switch, as the API answers",
                 self.demo_model_conversation),
                ("behind --api-key the page asks for the key", self.api_key),
                ("--no-ui: / is 404", self.no_ui),
            ]
            for name, fn in checks:
                self.check(name, fn)
        finally:
            self.page.quit()
            self.a.kill()
        return self.summary("chat page checks", self.a)


def run_browser_suite(suite, what):
    """The command line of a browser test: `what` names it in skip messages and its temporary directory."""
    if len(sys.argv) != 3:
        print(sys.modules[suite.__module__].__doc__)
        return 2
    binary, shots = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    chromium, chromedriver = find_browser()
    if not chromium or not chromedriver:
        print(f"{what} test skipped: chromium and chromedriver are needed (Debian packages chromium, "
              "chromium-driver: scripts/install-deps.sh)")
        return SKIP
    if not (DEMO_TOKENIZER / "tokenizer.json").exists():
        print(f"{what} test skipped: {DEMO_TOKENIZER}/tokenizer.json is missing")
        return SKIP
    os.makedirs(shots, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"qatserve-{what.replace(' ', '-')}-test-") as tmp:
        return suite(binary, tmp, shots, chromium, chromedriver).run()


def main():
    return run_browser_suite(Suite, "chat page")


if __name__ == "__main__":
    sys.exit(main())
