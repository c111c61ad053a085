#!/usr/bin/env python3
"""eval_agent_demo.py: the demo model's agent skills on held-out requests, asked through `qatserve serve` with the
OpenAI Chat Completions API (the official `openai` client), on the model's lossless int4 repack.

usage: eval_agent_demo.py QATSERVE [--model DIR] [--json OUT] [--free-calls] [--floor KIND=SHARE ...]

Repacks DIR (default models/gemma4-tiny-qat) to int4 in a temporary directory, serves it, and asks held-out
examples of tools/python/agent_data.py (tools, names, cities and phrasings no training example has; greedy):

  call      tool_choice "auto", 1-4 tools: the right tool(s) with exactly the arguments the request states (as
            served: a call the model opens is held to the declared tools' names and parameters; with
            --free-calls, `serve --no-tool-call-grammar`: the model's calls alone)
  no_call   tool_choice "auto", small talk: an answer without calls
  result    a call and its tool result in the history: the answer mentions every value of the result
  json      response_format json_schema (or json_object), max_tokens 64: finish_reason "stop", JSON valid against
            the schema (jsonschema); exact values counted, not required
  think     thinking on (chat_template_kwargs.enable_thinking): non-empty reasoning_content and a non-empty answer

Before asking, each request's prompt tokens from the server's `/tokenize` (its chat template and tokenizer) must equal
the example's prompt as jinja2 renders it and Hugging Face `tokenizers` encodes it, what the model was trained on.

Goals (the agent demo model's acceptance bar): call selection and arguments >= 90%, json >= 95%, result >= 90%,
think >= 90% (the share of thinking requests with both parts). Exit 0 when every goal holds (or, for a kind given
--floor, its floor), 1 otherwise; 77 without the venv's packages.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "server"))
try:
    import jsonschema
    import openai
    from agent_data import HELD_OUT, AgentExamples
    from server_harness import Server
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

COUNTS = {"call": 60, "no_call": 20, "result": 40, "json": 40, "think": 30}
GOALS = {"call": 0.90, "result": 0.90, "json": 0.95, "think": 0.90}
JSON_MAX_TOKENS = 64


def small_talk():
    """Held-out small talk (phrasings the training chats do not use) with the answers the model is not scored on."""
    return [(q, "") for q in ["Good evening!", "Hi there, how do you do?", "Who is Emma Woodhouse?",
                              "Tell me something about Bath.", "What is your name?", "Write a line about the sea."]]


def ask(client, request, max_tokens=96):
    body = dict(request)
    extra = {}
    if "chat_template_kwargs" in body:
        extra["chat_template_kwargs"] = body.pop("chat_template_kwargs")
    return client.chat.completions.create(model="demo", temperature=0, max_tokens=max_tokens,
                                          extra_body=extra or None, **body)


def judge_call(example, reply):
    calls = reply.choices[0].message.tool_calls or []
    got = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in calls]
    return got == example.expect["calls"], got


def judge_no_call(example, reply):
    m = reply.choices[0].message
    return not m.tool_calls and bool((m.content or "").strip()), m.content


def judge_result(example, reply):
    text = reply.choices[0].message.content or ""
    return all(v in text for v in example.expect["mentions"]), text


def judge_json(example, reply):
    choice = reply.choices[0]
    text = choice.message.content or ""
    try:
        value = json.loads(text)
        jsonschema.validate(value, example.expect["schema"])
        valid = choice.finish_reason == "stop"
    except (ValueError, jsonschema.ValidationError):
        value, valid = None, False
    return valid, {"text": text, "exact": value == example.expect["json"]}


def judge_think(example, reply):
    m = reply.choices[0].message
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content") or ""
    answer = (m.content or "").strip() or m.tool_calls
    return bool(reasoning.strip()) and bool(answer), {"reasoning": reasoning, "answer": m.content}


def prompt_tokens_match(server, tok, example):
    """The server's `/tokenize` of the request's messages (its chat template and tokenizer) against the example's
    prompt as jinja2 renders it and Hugging Face `tokenizers` encodes it: the model is asked exactly what it was
    trained on only if the two agree."""
    import urllib.request
    body = {k: example.request[k] for k in ("messages", "tools", "chat_template_kwargs") if k in example.request}
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/tokenize", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        got = json.load(r)["tokens"]
    return got == tok.encode(example.prompt, add_special_tokens=False).ids


def examples(template):
    gen = AgentExamples(template, HELD_OUT, 38, small_talk())
    makers = {"call": gen.call, "no_call": gen.no_call, "result": gen.result, "json": gen.json_answer,
              "think": gen.think}
    return {kind: [makers[kind]() for _ in range(n)] for kind, n in COUNTS.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("qatserve")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma4-tiny-qat")
    ap.add_argument("--json", type=Path, help="write the per-kind scores and every answer here")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--free-calls", action="store_true", help="serve --no-tool-call-grammar: score the model alone")
    ap.add_argument("--floor", action="append", default=[], metavar="KIND=SHARE",
                    help="pass KIND at SHARE instead of its goal (ctest holds a goal not yet met at the level reached)")
    a = ap.parse_args()
    bars = dict(GOALS, **{k: float(v) for k, v in (f.split("=") for f in a.floor)})
    judges = {"call": judge_call, "no_call": judge_no_call, "result": judge_result, "json": judge_json,
              "think": judge_think}
    with tempfile.TemporaryDirectory() as tmp:
        int4 = Path(tmp) / "w4a16"
        subprocess.run([a.qatserve, "repack", str(a.model), str(int4)], check=True, capture_output=True)
        server = Server(a.qatserve, int4, tmp, "agent-eval", *(["--no-tool-call-grammar"] if a.free_calls else []))
        try:
            server.wait_ready()
            client = server.client()
            scores, records = {}, {}
            tok = Tokenizer.from_file(str(a.model / "tokenizer.json"))
            for kind, items in examples(a.model / "chat_template.jinja").items():
                good, rows = 0, []
                for e in items:
                    if not prompt_tokens_match(server, tok, e):
                        print(f"FAIL: the server's prompt tokens for {e.request['messages']} differ from the "
                              "chat template's rendering encoded by tokenizers")
                        return 1
                    reply = ask(client, e.request, JSON_MAX_TOKENS if kind == "json" else 96)
                    ok, got = judges[kind](e, reply)
                    good += ok
                    rows.append({"request": e.request["messages"][-1].get("content"), "ok": ok, "got": got,
                                 "expect": e.expect if kind != "json" else e.expect["json"],
                                 "finish": reply.choices[0].finish_reason,
                                 "completion_tokens": reply.usage.completion_tokens})
                    if a.verbose or not ok:
                        print(f"{'ok  ' if ok else 'miss'} {kind}: {rows[-1]}")
                scores[kind] = good / len(items)
                records[kind] = rows
        finally:
            server.proc.terminate()
            server.proc.wait(timeout=30)
    exact = sum(r["got"]["exact"] for r in records["json"]) / len(records["json"])
    print(f"{'kind':8} {'n':>4} {'score':>7} goal  passes at")
    for kind, score in scores.items():
        print(f"{kind:8} {COUNTS[kind]:4} {score:7.1%} {GOALS.get(kind, '-'):<5} {bars.get(kind, '-')}")
    print(f"json values exactly the request's: {exact:.1%}")
    if a.json:
        a.json.write_text(json.dumps({"scores": scores, "json_exact": exact, "answers": records}, indent=1,
                                     default=str) + "\n")
    failed = [k for k, bar in bars.items() if scores[k] < bar]
    below_goal = [k for k, g in GOALS.items() if scores[k] < g]
    print("agent eval:", f"FAIL ({', '.join(failed)} below the bar)" if failed else
          "PASS" + (f" ({', '.join(below_goal)} below the goal, above its floor)" if below_goal else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
