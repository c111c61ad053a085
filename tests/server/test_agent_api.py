#!/usr/bin/env python3
"""End-to-end test of the agent surface of `qatserve serve` (tools, tool_choice, tool results, reasoning,
response_format) with the official `openai` client, jinja2 and raw HTTP.

usage: test_agent_api.py QATSERVE_BINARY

Synthesizes the tiny E2B checkpoint with the demo tokenizer (its chat_template.jinja is Google's early Gemma 4
template) and checks: histories with tool calls and tool results render as jinja2 renders them (the prompt token
count of a chat request equals the token count of jinja2's text, through /tokenize), also with the later 31B
template (tool results folded into the model turn) swapped into a copy of the checkpoint; a random-weight model pushed
towards the template's markers (logit_bias) never gets a 500, the calls it opens under tool_choice auto name a
declared tool with arguments valid against its parameters (jsonschema; the server's tool-call grammar), and content
never holds a marker, streaming or not; reasoning_content is there with thinking on and
absent with it off; every 400 of the tool/response_format surface names its parameter and leaves the server healthy.
Through the grammar engine: tool_choice required / named produce calls whose arguments validate (jsonschema) against
the tool's parameters, response_format json_schema output validates, the client's parse() helper gets its pydantic
model (with a bounded model and no bias, every output ends, in the model's declared field order), and an unsupported
schema keyword is a 400 naming response_format and the keyword's JSON pointer.
These random-weight checks test the protocol's robustness, not agent behaviour: a random model may make no call
and write empty thoughts (the calls below that must happen come from tool_choice required/named, through the
grammar engine).
Model-made agent work, required: the demo model with a forced-output LoRA adapter (tests/fixtures/
scripted_agent_lora, made by tools/python/scripted_agent.py, which trained it on exactly these requests) answers
tool_choice auto requests with the scripted calls (finish_reason tool_calls, arguments equal), two parallel calls,
a prose answer when no tool fits and after a tool result, and a non-empty thought before its answer or call;
streamed through the `openai` client, delta.tool_calls and delta.reasoning_content reassemble to the non-streamed
message; the Responses API returns the calls as function_call items. And the demo model by itself (no adapter; trained
on agent work by tools/python/train_tiny_agent.py), on held-out names: a call under tool_choice auto (streamed too),
prose for small talk beside the tools, an answer stating a tool result's values, JSON with the request's values
under json_schema, a thought then an answer.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no demo tokenizer or no openai package).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import DEMO_TOKENIZER, SKIP, Checks, Server, sse_frames  # noqa: E402 (exits 77 without openai)

import jsonschema  # noqa: E402
import openai  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "python"))
from make_chat_golden import hf_environment, template_messages  # noqa: E402
from check_constrained_outputs import longest  # noqa: E402
from scripted_agent import SCRIPT, TIME, WEATHER, chat_body  # noqa: E402  (the tools the adapter knows)
import demo_agent  # noqa: E402  (requests the demo model answers by itself)

DEMO_MODEL = ROOT / "models" / "gemma4-tiny-qat"
SCRIPTED_ADAPTER = ROOT / "tests" / "fixtures" / "scripted_agent_lora"

MARKERS = ["<|channel>", "<channel|>", "<|think|>", "<|tool_call>", "<tool_call|>", "<|tool>", "<tool|>",
           "<|tool_response>", "<tool_response|>", "<|turn>", "<turn|>", '<|"|>']
# Demo-tokenizer ids of <|tool_call> <tool_call|> <|"|> <|channel> <channel|>: the random model writes them often.
MARKER_BIAS = {"48": 6, "49": 6, "52": 4, "100": 5, "101": 5}
# A random model picks a string's closing token among thousands the grammar allows, so constrained outputs would run
# (or write an endless free key of get_time's open object) to max_tokens; these biases (demo tokenizer ids of `<|"|>`,
# `<tool_call|>`, `:`, `}`; `"`, `",`, `"}`) make them finish.
# The masks still decide what is allowed: a bias only reorders allowed tokens.
CLOSE_CALL_BIAS = {"52": 6, "49": 6, "521": 4, "588": 4}
CLOSE_JSON_BIAS = {"497": 6, "955": 4, "1199": 4}

TOOLS = [WEATHER, TIME]
# The schema the demo model fills for demo_agent's PERSON_ASK.
DEMO_JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"], "additionalProperties": False}

HISTORY = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    {"role": "assistant", "content": "Paris is sunny, Rome rainy."},
    {"role": "user", "content": "And the time?"},
]


def assert_stream_reassembles(name, whole, stream):
    """The openai client's chunks (delta.content, delta.reasoning_content, delta.tool_calls by index, id, name and
    arguments, finish_reason) add up to the non-streamed choice `whole`."""
    calls, content, reasoning, finish, chunks = {}, "", "", None, 0
    for chunk in stream:
        if not chunk.choices:
            continue
        chunks += 1
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for c in delta.tool_calls or []:
            entry = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += c.id or ""
            entry["name"] += c.function.name or "" if c.function else ""
            entry["arguments"] += c.function.arguments or "" if c.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert chunks > 1, name
    assert finish == whole.finish_reason, (name, finish, whole.finish_reason)
    want = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []]
    got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    assert got == want and sorted(calls) == list(range(len(calls))), (name, got, want)
    assert all(c["id"].startswith("call_") for c in calls.values()), calls
    assert content == (whole.message.content or ""), (name, content, whole.message.content)
    assert reasoning == (getattr(whole.message, "reasoning_content", None) or ""), (name, reasoning)


class AgentSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary = binary
        self.workdir = Path(workdir)
        self.model = self.workdir / "tiny-e2b"

    def healthy(self):
        status, body = self.server.json("GET", "/health")
        assert status == 200 and body["status"] == "ok", (status, body)

    def jinja2_prompt(self, messages, tools, enable_thinking=False):
        template = hf_environment().from_string((self.model / "chat_template.jinja").read_text())
        return template.render(messages=template_messages(messages), tools=tools, documents=None,
                               add_generation_prompt=True, bos_token="<bos>", enable_thinking=enable_thinking)

    def tokens_of(self, text):
        status, t = self.server.json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
        assert status == 200, t
        return t["count"]

    # ---- checks -------------------------------------------------------------------------------------------------

    def history_renders_as_jinja2(self):
        for thinking in (False, True):
            expected = self.tokens_of(self.jinja2_prompt(HISTORY, TOOLS, thinking))
            r = self.client.chat.completions.create(
                model="m", messages=HISTORY, tools=TOOLS, max_tokens=1, temperature=0,
                extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
            assert r.usage.prompt_tokens == expected, (thinking, r.usage.prompt_tokens, expected)
            status, t = self.server.json("POST", "/tokenize", {"messages": HISTORY, "tools": TOOLS,
                                                               "chat_template_kwargs": {"enable_thinking": thinking}})
            assert status == 200 and t["count"] == expected, (t, expected)
        # tool_choice none still declares the tools (vLLM's default) and reads no call back
        expected = self.tokens_of(self.jinja2_prompt(HISTORY, TOOLS))
        for seed in range(4):
            r = self.client.chat.completions.create(model="m", messages=HISTORY, tools=TOOLS, tool_choice="none",
                                                    parallel_tool_calls=False, max_tokens=20, seed=seed,
                                                    logit_bias=MARKER_BIAS)
            assert r.usage.prompt_tokens == expected, (r.usage.prompt_tokens, expected)
            assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls", r
            self.assert_clean_message(r.choices[0].message, thinking=False)

    def later_template_history(self):
        """The later 31B template (tool results folded into the model turn, an opened thought channel) served from
        a copy of the checkpoint: the prompt is still jinja2's, and with thinking on the output starts as reasoning."""
        golden = json.loads((ROOT / "tests" / "golden" / "chat_gemma4.json").read_text())
        text = golden["templates"]["gemma4_31b_later"]["text"]
        later = self.workdir / "tiny-e2b-later"
        shutil.copytree(self.model, later)
        (later / "chat_template.jinja").write_text(text)
        server = Server(self.binary, later, self.workdir, "server-later")
        try:
            server.wait_ready()
            client = server.client()
            template = hf_environment().from_string(text)
            for thinking in (False, True):
                rendered = template.render(messages=template_messages(HISTORY[:-2]), tools=TOOLS, documents=None,
                                           add_generation_prompt=True, bos_token="<bos>", enable_thinking=thinking)
                status, t = server.json("POST", "/tokenize", {"prompt": rendered, "add_special_tokens": False})
                assert status == 200, t
                r = client.chat.completions.create(model="m", messages=HISTORY[:-2], tools=TOOLS, max_tokens=8,
                                                   seed=2, reasoning_effort="high" if thinking else None)
                assert r.usage.prompt_tokens == t["count"], (thinking, r.usage.prompt_tokens, t["count"])
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                               seed=2, reasoning_effort="high", logit_bias={"101": -100})
            # the prompt opened the channel and the model cannot close it: everything it wrote is reasoning
            assert r.choices[0].message.reasoning_content and not r.choices[0].message.content, r
        finally:
            server.kill()

    def assert_clean_message(self, message, thinking):
        content = message.content or ""
        for marker in MARKERS:
            assert marker not in content, (marker, content)
        for call in message.tool_calls or []:
            assert call.type == "function" and call.id.startswith("call_"), call
            assert isinstance(json.loads(call.function.arguments), dict), call
        reasoning = getattr(message, "reasoning_content", None)
        if thinking:
            assert isinstance(reasoning, str), message
        else:
            assert reasoning is None, message

    def auto_tool_calls_parse_or_are_content(self):
        """A call the model opens under tool_choice auto is held to the tools (serve's default tool-call grammar):
        every call made names a declared tool and its arguments validate against that tool's parameters."""
        made_calls = 0
        for seed in range(12):
            thinking = seed % 2 == 1
            r = self.client.chat.completions.create(
                model="m", messages=HISTORY, tools=TOOLS, tool_choice="auto", max_tokens=60, seed=seed,
                temperature=1.0, logit_bias={**MARKER_BIAS, **CLOSE_CALL_BIAS},
                reasoning_effort="high" if thinking else None)
            choice = r.choices[0]
            self.assert_clean_message(choice.message, thinking)
            if choice.message.tool_calls:
                made_calls += 1
                assert choice.finish_reason == "tool_calls", choice
                for call in choice.message.tool_calls:
                    declared = [t for t in TOOLS if t["function"]["name"] == call.function.name]
                    assert declared, call
                    jsonschema.validate(json.loads(call.function.arguments), declared[0]["function"]["parameters"])
            else:
                assert choice.finish_reason in ("stop", "length"), choice
                assert choice.message.content is not None, choice
        print(f"  {made_calls} of 12 random completions made calls, every one valid", flush=True)
        assert made_calls > 0, "no completion made a call: nothing was checked"
        self.healthy()

    def streaming_shape(self):
        for seed in range(6):
            thinking = seed % 2 == 0
            body = {"model": "m", "messages": HISTORY, "tools": TOOLS, "max_tokens": 40, "seed": seed,
                    "temperature": 1.0, "logit_bias": MARKER_BIAS, "stream": True,
                    "stream_options": {"include_usage": True},
                    "chat_template_kwargs": {"enable_thinking": thinking}}
            status, _, data = self.server.request("POST", "/v1/chat/completions", body)
            assert status == 200, data
            frames = sse_frames(data)
            assert frames[-1] == "[DONE]" and frames[-2]["usage"]["completion_tokens"] > 0, frames[-2:]
            assert frames[0]["choices"][0]["delta"]["role"] == "assistant"
            content, calls, finish = "", {}, None
            for f in frames[1:-2]:
                choice = f["choices"][0]
                delta = choice["delta"]
                content += delta.get("content") or ""
                assert thinking or "reasoning_content" not in delta, delta
                for c in delta.get("tool_calls", []):
                    assert c["index"] not in calls and c["index"] == len(calls), (c, calls)
                    assert c["id"].startswith("call_") and c["type"] == "function" and c["function"]["name"], c
                    assert isinstance(json.loads(c["function"]["arguments"]), dict), c
                    calls[c["index"]] = c
                finish = choice["finish_reason"] or finish
            for marker in MARKERS:
                assert marker not in content, (marker, content)
            if calls:
                assert finish == "tool_calls", (finish, calls)
            else:
                assert finish in ("stop", "length"), finish
        # the client's stream reader accepts the shape
        stream = self.client.chat.completions.create(model="m", messages=HISTORY, tools=TOOLS, max_tokens=20, seed=1,
                                                     logit_bias=MARKER_BIAS, stream=True)
        assert sum(1 for _ in stream) > 1

    def reasoning_fields(self):
        base = dict(model="m", messages=[{"role": "user", "content": "Think, then answer."}], max_tokens=30, seed=3,
                    logit_bias={"100": 4, "101": 4})
        on = self.client.chat.completions.create(**base, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert isinstance(getattr(on.choices[0].message, "reasoning_content", None), str), on
        effort = self.client.chat.completions.create(**base, reasoning_effort="low")
        assert isinstance(getattr(effort.choices[0].message, "reasoning_content", None), str), effort
        off = self.client.chat.completions.create(**base)
        assert getattr(off.choices[0].message, "reasoning_content", None) is None, off
        for r in (on, effort):
            self.assert_clean_message(r.choices[0].message, thinking=True)

    def bad_requests(self):
        no_name = {"type": "function", "function": {"description": "x"}}
        bad_params = {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
        user = [{"role": "user", "content": "hi"}]
        cases = [
            ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": [no_name]}, "tools"),
            ({"tools": [bad_params]}, "tools"),
            ({"messages": user + [{"role": "tool", "content": "r"}]}, "messages"),
            ({"response_format": {"type": "yaml"}}, "response_format"),
        ]
        for patch, param in cases:
            body = {"model": "m", "messages": user, "max_tokens": 2, **patch}
            status, e = self.server.json("POST", "/v1/chat/completions", body)
            assert status == 400 and e["error"]["param"] == param, (patch, status, e)
            assert e["error"]["message"], e
        self.healthy()

    # ---- through the grammar engine ------------------------------------------------------------------------------

    def constrained(self, **kwargs):
        return self.client.chat.completions.create(model="m", max_tokens=300, **kwargs)

    def required_tool_choice(self):
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            for seed in range(4):
                r = self.constrained(messages=HISTORY, tools=TOOLS, tool_choice=choice, seed=seed, temperature=1.0,
                                     logit_bias=CLOSE_CALL_BIAS)
                message = r.choices[0].message
                assert r.choices[0].finish_reason == "tool_calls" and message.tool_calls, r
                for call in message.tool_calls:
                    if isinstance(choice, dict):
                        assert call.function.name == "get_weather", call
                    schema = next(t for t in TOOLS if t["function"]["name"] == call.function.name)["function"]
                    jsonschema.validate(json.loads(call.function.arguments), schema["parameters"])

    def json_schema_response_format(self):
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"], "additionalProperties": False}
        for seed in range(4):
            r = self.constrained(messages=[{"role": "user", "content": "A person"}], seed=seed, temperature=1.0,
                                 logit_bias=CLOSE_JSON_BIAS, response_format={"type": "json_schema",
                                                  "json_schema": {"name": "person", "schema": schema, "strict": True}})
            assert r.choices[0].finish_reason == "stop", r
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)

    def parse_helper(self):
        import pydantic

        class City(pydantic.BaseModel):
            name: str
            population: int

        class Answer(pydantic.BaseModel):
            cities: list[City]

        r = self.client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "Cities"}],
                                               response_format=Answer, max_tokens=300, seed=1,
                                               logit_bias=CLOSE_JSON_BIAS)
        assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, Answer), r

    def parse_helper_declared_order_ends(self):
        """A weak model must neither run away nor reorder properties: with no bias at temperature 1, every output of
        a schema without unbounded strings ends within the length derived from the schema
        (tools/python/check_constrained_outputs.longest), the SDK parses it into the pydantic model, and the
        properties come in the model's declared order (not sorted)."""
        import typing

        import pydantic

        class Place(pydantic.BaseModel):
            lon: float
            lat: float

        class Reading(pydantic.BaseModel):
            station: str = pydantic.Field(max_length=6)
            temperature: float
            count: int
            ok: bool
            unit: typing.Literal["c", "f"]
            where: Place

        bound = longest(Reading.model_json_schema())
        for seed in range(8):
            r = self.client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "A reading"}],
                                                   response_format=Reading, max_tokens=bound + 1, seed=seed,
                                                   temperature=1.0)
            choice = r.choices[0]
            assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Reading), r
            assert r.usage.completion_tokens <= bound + 1, (r.usage, bound)
            written = json.loads(choice.message.content, object_pairs_hook=list)
            assert [k for k, _ in written] == list(Reading.model_fields), choice.message.content
            assert [k for k, _ in dict(written)["where"]] == list(Place.model_fields), choice.message.content

    def unsupported_schema_keyword(self):
        schema = {"type": "object", "properties": {"x": {"type": "object", "patternProperties": {"a": {}}}}}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
        status, e = self.server.json("POST", "/v1/chat/completions", body)
        assert status == 400 and e["error"]["param"] == "response_format", (status, e)
        assert "patternProperties" in e["error"]["message"] and "/properties/x" in e["error"]["message"], e
        self.healthy()

    def messages_cli(self):
        """`logits --messages` writes the prompt jinja2 renders, as the `tokenizers` library encodes it."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
        conversation = [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": " in Paris?"}]},
                        *HISTORY[1:]]
        messages_file, out = self.workdir / "messages.json", self.workdir / "logits.safetensors"
        messages_file.write_text(json.dumps({"messages": conversation}))
        subprocess.run([self.binary, "logits", "--model", str(self.model), "--messages", str(messages_file), "--out",
                        str(out)], check=True, capture_output=True)
        written = load_file(str(out))
        expected = Tokenizer.from_file(str(self.model / "tokenizer.json")).encode(
            self.jinja2_prompt(conversation, None), add_special_tokens=False).ids
        assert written["tokens"].tolist() == expected, (written["tokens"].tolist(), expected)
        assert written["logits"].shape[0] == len(expected), written["logits"].shape
        bad = subprocess.run([self.binary, "logits", "--model", str(self.model), "--messages", str(self.model / "config.json"),
                              "--out", str(out)], capture_output=True, text=True)
        assert bad.returncode != 0 and "config.json: expected a JSON object {\"messages\"" in bad.stderr, bad.stderr

    def media_without_tower(self):
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        status, e = self.server.json("POST", "/v1/chat/completions", {
            "model": "m", "max_tokens": 1,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]})
        assert status == 400 and e["error"]["param"] == "messages", (status, e)
        assert e["error"]["message"].startswith("messages[0].content[1]: this model does not read image input"), e
        self.healthy()

    # ---- model-made: the demo model with the scripted adapter -------------------------------------------------

    def scripted(self, name, **extra):
        body = chat_body(name, model="scripted", max_tokens=80, temperature=0, **extra)
        if "tools" in body:
            body["tool_choice"] = "auto"
        return body

    def scripted_create(self, name, **extra):
        body = self.scripted(name, **extra)
        return self.scripted_client.chat.completions.create(
            **{k: body.pop(k) for k in ("model", "messages", "max_tokens", "temperature", "stream")
               if k in body}, **{k: body.pop(k) for k in ("tools", "tool_choice") if k in body}, extra_body=body)

    @staticmethod
    def expected_calls(answer):
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.get("tool_calls") or []]

    def scripted_calls_and_answers(self):
        """Every scripted conversation, not streamed: the calls (names and arguments), the answer, the thought."""
        made = 0
        for name, request, answer, thought in SCRIPT:
            r = self.scripted_create(name)
            choice, message = r.choices[0], r.choices[0].message
            calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
            assert calls == self.expected_calls(answer), (name, calls, message)
            if calls:
                made += len(calls)
                assert choice.finish_reason == "tool_calls" and message.content is None, (name, choice)
                assert all(c.id.startswith("call_") and c.type == "function" for c in message.tool_calls), message
            else:
                assert choice.finish_reason == "stop" and message.content == answer["content"], (name, choice)
            reasoning = getattr(message, "reasoning_content", None)
            if thought is None:
                assert reasoning is None, (name, message)
            else:
                assert reasoning == thought, (name, reasoning)  # non-empty: the model wrote it
        assert made >= 6, made
        print(f"  {made} model-made calls in {len(SCRIPT)} conversations", flush=True)

    def scripted_streams(self):
        """Streamed through the openai client: delta.tool_calls (index, id, name, arguments) and
        delta.reasoning_content reassemble to the non-streamed message."""
        for name in ("two calls", "thinking, then a call", "tool result"):
            assert_stream_reassembles(name, self.scripted_create(name).choices[0],
                                      self.scripted_create(name, stream=True))
        print("  streamed: two parallel calls, a thought then a call, a tool-result answer", flush=True)

    def scripted_responses_api(self):
        """The same request through /v1/responses: the model's call comes back as a function_call item."""
        request = next(r for n, r, _, _ in SCRIPT if n == "weather")
        tools = [{"type": "function", **t["function"]} for t in request["tools"]]
        r = self.scripted_client.responses.create(model="scripted", input=request["messages"][0]["content"],
                                                  tools=tools, tool_choice="auto", temperature=0, max_output_tokens=80)
        calls = [item for item in r.output if item.type == "function_call"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})], r.output
        assert calls[0].call_id.startswith("call_") and r.status == "completed", r

    def scripted_suite(self):
        server = Server(self.binary, DEMO_MODEL, self.workdir, "server-scripted", "--lora",
                        f"scripted={SCRIPTED_ADAPTER}")
        try:
            server.wait_ready()
            self.scripted_client = server.client()
            for name, fn in [
                ("model-made: scripted calls, answers and thoughts (tool_choice auto)", self.scripted_calls_and_answers),
                ("model-made: streamed tool calls and thoughts through the openai client", self.scripted_streams),
                ("model-made: the Responses API's function_call item", self.scripted_responses_api),
            ]:
                self.check(name, fn)
        finally:
            server.kill()

    # ---- model-made: the demo model alone (no adapter) -------------------------------------------------------

    def demo_create(self, messages, **kw):
        return self.demo_client.chat.completions.create(model="m", messages=messages, temperature=0, **kw)

    def demo_alone_calls(self):
        """tool_choice auto with two tools: the demo model calls the one the request asks for, with the request's
        argument; the stream's delta.tool_calls reassemble to the same call; small talk beside the tools gets prose."""
        ask = [{"role": "user", "content": demo_agent.WEATHER_ASK}]
        kw = dict(tools=[WEATHER, TIME], tool_choice="auto", max_tokens=60)
        choice = self.demo_create(ask, **kw).choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        assert calls == [("get_weather", {"city": demo_agent.CITY})], choice
        assert choice.finish_reason == "tool_calls", choice
        assert_stream_reassembles("demo call", choice, self.demo_create(ask, stream=True, **kw))
        chat = self.demo_create([{"role": "user", "content": "Hello"}], **kw).choices[0]
        assert not chat.message.tool_calls and chat.message.content and chat.finish_reason == "stop", chat

    def demo_alone_result(self):
        """After a get_weather call and its result, the answer states the result's values."""
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": demo_agent.CITY})}}
        messages = [{"role": "user", "content": demo_agent.WEATHER_ASK},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(demo_agent.WEATHER_RESULT)}]
        choice = self.demo_create(messages, tools=[WEATHER, TIME], max_tokens=60).choices[0]
        text = choice.message.content or ""
        assert choice.finish_reason == "stop", choice
        assert all(str(v) in text for v in demo_agent.WEATHER_RESULT.values()), choice

    def demo_alone_json(self):
        """response_format json_schema: the object closes well within 64 tokens with the request's values."""
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": DEMO_JSON_SCHEMA}}
        choice = self.demo_create([{"role": "user", "content": demo_agent.PERSON_ASK}], max_tokens=64,
                                  response_format=fmt).choices[0]
        assert choice.finish_reason == "stop", choice
        value = json.loads(choice.message.content)
        jsonschema.validate(value, DEMO_JSON_SCHEMA)
        assert value == demo_agent.PERSON, value

    def demo_alone_thinking(self):
        """Thinking on: a non-empty thought in reasoning_content, then a non-empty answer."""
        choice = self.demo_create([{"role": "user", "content": "Who wrote Emma?"}], max_tokens=96,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": True}}).choices[0]
        reasoning = getattr(choice.message, "reasoning_content", None) or ""
        assert reasoning.strip() and (choice.message.content or "").strip(), choice
        assert choice.finish_reason == "stop", choice

    def demo_alone_suite(self):
        server = Server(self.binary, DEMO_MODEL, self.workdir, "server-demo")
        try:
            server.wait_ready()
            self.demo_client = server.client()
            for name, fn in [
                ("model-made, the demo model alone: a tool call under auto, streamed too; prose for small talk",
                 self.demo_alone_calls),
                ("model-made, the demo model alone: an answer from a tool result", self.demo_alone_result),
                ("model-made, the demo model alone: JSON under json_schema with the request's values",
                 self.demo_alone_json),
                ("model-made, the demo model alone: a thought, then an answer", self.demo_alone_thinking),
            ]:
                self.check(name, fn)
        finally:
            server.kill()

    def run(self):
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(self.model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        self.server = Server(self.binary, self.model, self.workdir, "server-agent")
        try:
            self.server.wait_ready()
            self.client = self.server.client()
            for name, fn in [
                ("history with tool calls and results renders as jinja2 does; tool_choice none", self.history_renders_as_jinja2),
                ("the later template: folded tool results, the opened thought channel", self.later_template_history),
                ("tool_choice auto: calls parse or come back as content, no markers", self.auto_tool_calls_parse_or_are_content),
                ("streaming: reasoning, content and tool-call deltas", self.streaming_shape),
                ("reasoning_content with thinking on, absent off", self.reasoning_fields),
                ("bad tool / response_format requests are 400s naming the parameter", self.bad_requests),
                ("tool_choice required / named produce valid calls", self.required_tool_choice),
                ("response_format json_schema validates", self.json_schema_response_format),
                ("client parse() with a pydantic model", self.parse_helper),
                ("parse(): bounded schemas end unbiased, properties in declared order", self.parse_helper_declared_order_ends),
                ("an unsupported schema keyword is a 400 naming it", self.unsupported_schema_keyword),
                ("logits --messages: the prompt jinja2 renders, encoded by tokenizers", self.messages_cli),
                ("an image part for a model without a vision tower is a 400 naming the part", self.media_without_tower),
            ]:
                self.check(name, fn)
        finally:
            self.server.kill()
        self.scripted_suite()
        self.demo_alone_suite()
        return self.summary("agent API checks", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not (DEMO_TOKENIZER / "tokenizer.json").exists():
        print(f"agent API test skipped: {DEMO_TOKENIZER}/tokenizer.json is missing")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="qatserve-agent-test-") as tmp:
        return AgentSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
