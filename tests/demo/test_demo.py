#!/usr/bin/env python3
"""The README's main job, as a new user runs it: `scripts/demo.sh` (deps, build, repack, verify, serve), then the
README's demo transcript asked of that server, every answer compared with what the README prints.

usage: test_demo.py   (from anywhere; the checkout is this file's grandparent)

The transcript is read from README.md's first ```console block after "A real exchange with the demo server": the
curl line's request and its "content"/"finish_reason", each `"QUESTION"  ->  "ANSWER"  (REASON)` line as the same
chat request, and a `/v1/completions "PROMPT"` line whose answer, ending in `..."`, is a prefix of the completion.
demo.sh writes its repack into a temporary DEMO_DIR and serves on a free loopback port; Ctrl-C (SIGINT) stops it.
Only the standard library: nothing here needs the venv. Exit 0 when every answer is the README's, 1 otherwise.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANG_STOP = 900  # only stops a hang: deps and the build are normally done by the time ctest runs this


def transcript():
    """[(path, body, expected text, expected finish reason or None, prefix only)] from README.md."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("A real exchange with the demo")
    block = readme[readme.index("```console", start):]
    block = block[:block.index("```", 3)]
    lines = block.splitlines()[1:]
    cases = []
    for i, line in enumerate(lines):
        if line.startswith("$ curl"):
            body = json.loads(re.search(r"-d '(\{.*\})'", lines[i + 1]).group(1))
            answer = lines[i + 2]
            reason = re.search(r'"finish_reason":"(\w+)"', answer).group(1)
            cases.append(("/v1/chat/completions", body, printed_answer(answer), reason, False))
        elif m := re.match(r'^"((?:[^"\\]|\\.)*)"\s+->\s+"((?:[^"\\]|\\.)*)"\s+\((\w+)\)$', line):
            body = {"messages": [{"role": "user", "content": json.loads(f'"{m[1]}"')}], "max_tokens": 48,
                    "temperature": 0}
            cases.append(("/v1/chat/completions", body, json.loads(f'"{m[2]}"'), m[3], False))
        elif m := re.match(r'^/v1/completions "((?:[^"\\]|\\.)*)"$', line):
            answer = re.match(r'^\s+->\s+"(.*) \.\.\."$', lines[i + 1])
            body = {"prompt": json.loads(f'"{m[1]}"'), "max_tokens": 48, "temperature": 0}
            cases.append(("/v1/completions", body, json.loads(f'"{answer[1]}"'), None, True))
    return cases


def printed_answer(line):
    """What a curl answer line shows: the message's content, or its tool calls as `name arguments` lines."""
    calls = re.findall(r'"name":"(\w+)","arguments":"((?:[^"\\]|\\.)*)"', line)
    if calls:
        return "\n".join(f"{name} {json_string(args)}" for name, args in calls)
    return json_string(re.search(r'"content":"((?:[^"\\]|\\.)*)"', line).group(1))


def json_string(escaped):
    return json.loads(f'"{escaped}"')


def answer_of(choice):
    """The same view of a served choice (chat message or completion text)."""
    if "message" not in choice:
        return choice["text"]
    calls = choice["message"].get("tool_calls") or []
    if calls:
        return "\n".join(f"{c['function']['name']} {c['function']['arguments']}" for c in calls)
    return choice["message"]["content"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def wait_until_serving(port, demo):
    deadline = time.monotonic() + HANG_STOP
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def main():
    cases = transcript()
    assert len(cases) >= 4, f"README's demo transcript gave only {len(cases)} exchanges: {cases}"
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        log = open(Path(tmp) / "demo.log", "w+")
        env = dict(os.environ, PORT=str(port), DEMO_DIR=str(Path(tmp) / "demo"))
        demo = subprocess.Popen([ROOT / "scripts" / "demo.sh"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            if not wait_until_serving(port, demo):
                log.seek(0)
                print(f"FAIL demo.sh did not come up on port {port}:\n{log.read()[-4000:]}")
                return 1
            log.seek(0)
            verify = re.search(r"^verify .*$", log.read(), re.M)
            print("demo.sh serving;", verify[0] if verify else "no verify line")
            for path, body, want, reason, prefix in cases:
                r = post(port, path, body)
                choice = r["choices"][0]
                got = answer_of(choice)
                good = got.startswith(want) if prefix else (got == want and choice["finish_reason"] == reason)
                failures += not good
                asked = body.get("prompt") or body["messages"][0]["content"]
                print(f"{'ok  ' if good else 'FAIL'} {path} {asked!r} -> {got!r} ({choice['finish_reason']}); "
                      f"README: {want!r}{' ...' if prefix else f' ({reason})'}")
        finally:
            os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C, as the README says
            try:
                code = demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                code = demo.wait()
            print(f"demo.sh exited {code} on Ctrl-C")
            failures += code != 0
    print("demo check:", "PASS" if failures == 0 else f"FAIL ({failures})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
