#!/usr/bin/env python3
"""End-to-end test of Anthropic's Messages API on `qatserve serve` (POST /v1/messages, /v1/messages/count_tokens)
with the official `anthropic` client, against references computed now: the prompt jinja2 renders from the model's
own chat template (tokenized by the `tokenizers` library) and transformers' float32 greedy decoding of the model
directory (serve runs with --precision f32, whose greedy ids ctest trained_model holds to transformers').

usage: test_anthropic_messages.py QATSERVE_BINARY

On the demo model (models/gemma4-tiny-qat): messages.create's text, stop_reason and usage are transformers' greedy
answer and jinja2's prompt length; messages.stream's text_stream and get_final_message reassemble to the
non-streamed message, and the raw events open and close one block at a time; stop_sequences and max_tokens stop
where the reference text says; thinking enabled renders jinja2's thinking prompt and splits the answer as the
reference's thought channel does (also with the later template, whose prompt opens the channel), and a random-weight model whose thoughts run on
gives a thinking block with a signature (a signature_delta closing it in the stream); tool_choice any /
tool force a tool_use block whose input validates (jsonschema) against input_schema, and the tool_use / tool_result
round trip renders jinja2's prompt of the same history; a conversation with system, tools, tool_use, tool_result
(is_error) and thinking renders the prompt tokens of the equivalent Chat Completions request (and jinja2's);
count_tokens equals that count; bad input is a 400 in Anthropic's error shape naming the field and the server stays
up; x-api-key and Bearer keys, a wrong key (authentication_error) and another model's name (not_found_error).
With the forced-output adapter tests/fixtures/scripted_agent_lora (tools/python/scripted_agent.py) on the demo
model, tool_choice auto: the model's own tool_use block (stop_reason tool_use, input {"city": "Paris"}), the same
streamed, and its answer after the tool_result (the scripted sentence, end_turn); and the demo model by itself (no
adapter, a held-out city): its own tool_use, then an answer stating the tool_result's values.
On the multimodal fixture (tests/fixtures/mm_e2b_like): an image block with a base64 source and one with a url
source (a loopback http.server) give transformers' prompt length and greedy text.
Exit status: 0 all passed, 1 a check failed, 77 skipped (a package missing from the venv).
"""
import base64
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import DEMO_TOKENIZER, SKIP, Checks, Server  # noqa: E402 (exits 77 without openai)
import demo_agent  # noqa: E402 (requests the demo model answers by itself)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
MM = ROOT / "tests" / "fixtures" / "mm_e2b_like"
sys.path.insert(0, str(ROOT / "tools" / "python"))

try:
    import anthropic
    import jsonschema
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import Gemma4ForConditionalGeneration
    from make_chat_golden import hf_environment, template_messages  # noqa: E402
    from scripted_agent import REQUESTS, SCRIPT  # noqa: E402
except ImportError as e:
    print(f"anthropic messages test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

SCRIPTED_ADAPTER = ROOT / "tests" / "fixtures" / "scripted_agent_lora"
F32 = ("--precision", "f32")  # the precision whose greedy ids are transformers' float32 ones
# Greedy decoding. The current client has no temperature argument (Claude's newer models take none); the server takes
# the field as older clients and llama-server's and vLLM's Messages endpoints do, and the client sends it as extra_body.
GREEDY = {"temperature": 0}
SYSTEM = "You are a helpful assistant."
QUESTION = "Who wrote Emma?"
# Closed, bounded schemas: the grammar lets a forced call end within max_tokens even on a model that never learned
# to call tools (an open object lets it write keys until max_tokens, and the unfinished call comes back as text).
WEATHER = {"name": "get_weather", "description": "Current weather for a city.",
           "input_schema": {"type": "object", "required": ["city"], "additionalProperties": False,
                            "properties": {"city": {"type": "string", "maxLength": 16},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}
TIME = {"name": "get_time", "description": "The time.",
        "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}


def chat_tool(tool):
    return {"type": "function", "function": {"name": tool["name"], "description": tool["description"],
                                             "parameters": tool["input_schema"]}}


class Reference:
    """jinja2's prompt from a model directory's chat template and transformers' float32 greedy decoding of it."""

    def __init__(self, model_dir, template_text=None):
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.template = hf_environment().from_string(template_text or (model_dir / "chat_template.jinja").read_text())
        self.eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
        self.model_dir = model_dir
        self._model = None

    def prompt(self, chat_messages, tools=None, thinking=False):
        """(prompt text, its token ids) as the Chat Completions request with these messages would render."""
        text = self.template.render(messages=template_messages(chat_messages), tools=tools, documents=None,
                                    add_generation_prompt=True, bos_token="<bos>", enable_thinking=thinking)
        return text, self.tokenizer.encode(text, add_special_tokens=False).ids

    def greedy(self, ids, max_new):
        """transformers' greedy continuation: (new ids without the stop token, whether a stop token ended it)."""
        if self._model is None:
            self._model = Gemma4ForConditionalGeneration.from_pretrained(self.model_dir, dtype=torch.float32)
        with torch.no_grad():
            new = self._model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                                       eos_token_id=self.eos, pad_token_id=0)[0, len(ids):].tolist()
        stopped = bool(new) and new[-1] in self.eos
        return (new[:-1] if stopped else new), stopped

    def text(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def raw_body(kwargs, **more):
    """The JSON body the client would send for these keyword arguments."""
    body = {k: v for k, v in kwargs.items() if k != "extra_body"}
    return {**body, **kwargs.get("extra_body", {}), **more}


def expected_blocks(text, in_thought, thinking):
    """The content blocks of an output without tool calls: the thought channel's text (thinking on), then the rest."""
    thoughts = ""
    if thinking and in_thought:
        thoughts, _, text = text.partition("<channel|>")
    elif thinking and text.startswith("<|channel>thought\n"):
        thoughts, _, text = text[len("<|channel>thought\n"):].partition("<channel|>")
    blocks = [{"type": "thinking", "thinking": thoughts}] if thoughts else []
    return blocks + ([{"type": "text", "text": text}] if text else [])


def blocks_of(message):
    """The message's blocks as dicts, tool_use ids and thinking signatures left out (minted per request)."""
    out = []
    for b in message.content:
        d = b.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("signature", None)
        out.append(d)
    return out


def without_ids(message):
    """The message as a dict without its ids (minted per request) and unset fields (the stream's snapshot types
    carry a few more, such as parsed_output, left None)."""
    d = message.model_dump(exclude_none=True)
    d.pop("id")
    for b in d["content"]:
        if b["type"] == "tool_use":
            assert b.pop("id").startswith("toolu_"), b
    return d


def sse_events(data: bytes):
    """The events of an Anthropic stream: each `event: NAME` line with `data: {"type": NAME, ...}`; no [DONE]."""
    events = []
    for frame in data.decode("utf-8").split("\n\n"):
        if not frame:
            continue
        name, payload = frame.split("\n")
        assert name.startswith("event: ") and payload.startswith("data: "), frame
        event = json.loads(payload[len("data: "):])
        assert event["type"] == name[len("event: "):], frame
        events.append(event)
    return events


def check_event_order(events):
    """message_start, ping, blocks opened and closed one at a time (a thinking block closed by its signature_delta),
    message_delta, message_stop."""
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"], events[:2]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"], events[-2:]
    open_block, count, last_delta = None, 0, None
    for e in events[2:-2]:
        if e["type"] == "content_block_start":
            assert open_block is None and e["index"] == count, e
            open_block = e["content_block"]["type"]
        elif e["type"] == "content_block_delta":
            assert open_block is not None and e["index"] == count, e
            last_delta = e["delta"]["type"]
        else:
            assert e["type"] == "content_block_stop" and e["index"] == count and open_block, e
            if open_block == "thinking":
                assert last_delta == "signature_delta", e
            open_block, count = None, count + 1
    assert open_block is None


class MessagesSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        self.ref = Reference(MODEL)

    def healthy(self, server=None):
        status, body = (server or self.server).json("GET", "/health")
        assert status == 200 and body["status"] == "ok", (status, body)

    def client(self, server, **kwargs):
        kwargs.setdefault("api_key", "unused")
        return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", max_retries=0, timeout=120, **kwargs)

    def greedy_case(self, chat_messages, max_tokens, thinking=False, ref=None, tools=None):
        """(prompt ids, expected blocks, stop reason, output tokens) of a request by the reference."""
        ref = ref or self.ref
        text, ids = ref.prompt(chat_messages, tools=tools, thinking=thinking)
        new, stopped = ref.greedy(ids, max_tokens)
        blocks = expected_blocks(ref.text(new), text.endswith("<|channel>thought\n"), thinking)
        return ids, blocks, "end_turn" if stopped else "max_tokens", len(new)

    # ---- generation against transformers ---------------------------------------------------------------------------

    def create_is_transformers_greedy(self):
        ids, blocks, stop, n = self.greedy_case([{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": QUESTION}], 48)
        for system in (SYSTEM, [{"type": "text", "text": SYSTEM}]):
            r = self.anthropic.messages.create(model="m", max_tokens=48, extra_body=GREEDY, system=system,
                                               messages=[{"role": "user", "content": QUESTION}])
            assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant", r
            assert r.model == "gemma4-tiny-qat", r.model
            assert blocks_of(r) == blocks, (blocks_of(r), blocks)
            assert (r.stop_reason, r.stop_sequence) == (stop, None), r
            assert (r.usage.input_tokens, r.usage.output_tokens) == (len(ids), n), (r.usage, len(ids), n)
        print(f"  {len(ids)} prompt tokens, {n} generated: {blocks}")

    def stream_reassembles(self):
        kwargs = dict(model="m", max_tokens=48, extra_body=GREEDY, system=SYSTEM,
                      messages=[{"role": "user", "content": QUESTION}])
        whole = self.anthropic.messages.create(**kwargs)
        with self.anthropic.messages.stream(**kwargs) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert without_ids(final) == without_ids(whole), (final, whole)
        assert text == "".join(b.text for b in whole.content if b.type == "text"), (text, whole)
        status, headers, data = self.server.request("POST", "/v1/messages", raw_body(kwargs, stream=True))
        assert status == 200 and headers["content-type"] == "text/event-stream", (status, headers)
        events = sse_events(data)
        check_event_order(events)
        assert events[0]["message"]["usage"]["input_tokens"] == whole.usage.input_tokens, events[0]
        assert events[-2]["usage"]["output_tokens"] == whole.usage.output_tokens, events[-2]

    def stop_sequences_and_max_tokens(self):
        chat = [{"role": "user", "content": QUESTION}]
        ids, blocks, _, n = self.greedy_case(chat, 48)
        text = blocks[-1]["text"]
        words = text.split()
        assert len(words) >= 3 and n > 3, text
        stop = " " + words[2]
        kwargs = dict(model="m", max_tokens=48, extra_body=GREEDY, messages=[{"role": "user", "content": QUESTION}],
                      stop_sequences=["never written", stop])
        r = self.anthropic.messages.create(**kwargs)
        assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop), r
        assert blocks_of(r) == [{"type": "text", "text": text[:text.index(stop)]}], (r, stop)
        with self.anthropic.messages.stream(**kwargs) as s:
            final = s.get_final_message()
        assert without_ids(final) == without_ids(r), (final, r)
        new, _ = self.ref.greedy(ids, 3)
        r = self.anthropic.messages.create(model="m", max_tokens=3, extra_body=GREEDY, messages=kwargs["messages"])
        assert (r.stop_reason, r.usage.output_tokens) == ("max_tokens", 3), r
        assert blocks_of(r) == [{"type": "text", "text": self.ref.text(new)}], r

    def thinking(self, server, client, ref, label):
        chat = [{"role": "user", "content": QUESTION}]
        ids, blocks, stop, n = self.greedy_case(chat, 48, thinking=True, ref=ref)
        kwargs = dict(model="m", max_tokens=48, extra_body=GREEDY, messages=chat,
                      thinking={"type": "enabled", "budget_tokens": 1024})
        r = client.messages.create(**kwargs)
        assert r.usage.input_tokens == len(ids), (r.usage, len(ids))
        assert blocks_of(r) == blocks and r.stop_reason == stop, (blocks_of(r), blocks)
        for b in r.content:
            if b.type == "thinking":
                assert b.signature, b
        with client.messages.stream(**kwargs) as s:
            final = s.get_final_message()
        assert without_ids(final) == without_ids(r), (final, r)
        status, _, data = server.request("POST", "/v1/messages", raw_body(kwargs, stream=True))
        check_event_order(sse_events(data))
        off = client.messages.create(**{**kwargs, "thinking": {"type": "disabled"}})
        assert off.usage.input_tokens == len(ref.prompt(chat)[1]), off.usage
        print(f"  {label}: {[b['type'] for b in blocks]} ({len(ids)} prompt tokens)")

    def thinking_enabled(self):
        self.thinking(self.server, self.anthropic, self.ref, "demo template")

    def thinking_opened_channel(self):
        """The later Gemma 4 template (thinking opens the thought channel in the prompt), served from a copy."""
        golden = json.loads((ROOT / "tests" / "golden" / "chat_gemma4.json").read_text())
        text = golden["templates"]["gemma4_31b_later"]["text"]
        later = self.workdir / "gemma4-tiny-qat-later"
        shutil.copytree(MODEL, later)
        (later / "chat_template.jinja").write_text(text)
        server = Server(self.binary, later, self.workdir, "server-later", *F32)
        try:
            server.wait_ready()
            self.thinking(server, self.client(server), Reference(later), "later template")
        finally:
            server.kill()

    def thinking_block(self):
        """A thinking block for sure: a random-weight model (synthesized) with the later template, whose prompt opens
        the thought channel, so the greedy output is thoughts until it writes <channel|>. The block holds the text
        the `tokenizers` library decodes from the generated ids (Chat Completions' logprobs, token ids) up to that
        marker, with a signature; the stream closes it with a signature_delta and reassembles to the same message."""
        golden = json.loads((ROOT / "tests" / "golden" / "chat_gemma4.json").read_text())
        model = self.workdir / "random-later"
        subprocess.run([self.binary, "synth", "--preset", "e2b-tiny", "--out", str(model), "--tokenizer",
                        str(DEMO_TOKENIZER), "--quiet"], check=True, capture_output=True)
        (model / "chat_template.jinja").write_text(golden["templates"]["gemma4_31b_later"]["text"])
        server = Server(self.binary, model, self.workdir, "server-random")
        try:
            server.wait_ready()
            client, chat = self.client(server), [{"role": "user", "content": QUESTION}]
            kwargs = dict(model="m", max_tokens=12, extra_body=GREEDY, messages=chat,
                          thinking={"type": "enabled", "budget_tokens": 1024})
            r = client.messages.create(**kwargs)
            status, c = server.json("POST", "/v1/chat/completions", {
                "messages": chat, "max_tokens": 12, "temperature": 0, "logprobs": True,
                "return_tokens_as_token_ids": True, "chat_template_kwargs": {"enable_thinking": True}})
            assert status == 200, c
            ids = [int(t["token"].removeprefix("token_id:")) for t in c["choices"][0]["logprobs"]["content"]]
            ref = Reference(model)
            thoughts = ref.text(ids).partition("<channel|>")[0]
            assert r.usage.input_tokens == len(ref.prompt(chat, thinking=True)[1]), r.usage
            assert thoughts and r.content[0].type == "thinking" and r.content[0].signature, r
            if "<|" not in thoughts and "|>" not in thoughts:  # no other marker the splitter reads inside it
                assert r.content[0].thinking == thoughts, (r.content[0].thinking, thoughts)
            with client.messages.stream(**kwargs) as stream:
                final = stream.get_final_message()
            assert without_ids(final) == without_ids(r) and final.content[0].signature == r.content[0].signature
            status, _, data = server.request("POST", "/v1/messages", raw_body(kwargs, stream=True))
            events = sse_events(data)
            check_event_order(events)
            assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0][-1] \
                == "signature_delta", events
            print(f"  thinking block of {len(r.content[0].thinking)} characters, then {[b.type for b in r.content[1:]]}")
        finally:
            server.kill()

    # ---- tools ------------------------------------------------------------------------------------------------------

    def tool_use_round_trip(self):
        question = [{"role": "user", "content": "What is the weather in Paris?"}]
        for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"},
                       {"type": "any", "disable_parallel_tool_use": True}):
            kwargs = dict(model="m", max_tokens=200, extra_body=GREEDY, tools=[WEATHER, TIME], tool_choice=choice,
                          messages=question)
            r = self.anthropic.messages.create(**kwargs)
            calls = [b for b in r.content if b.type == "tool_use"]
            assert r.stop_reason == "tool_use" and calls, r  # required: the grammar forces the call
            for call in calls:
                assert call.id.startswith("toolu_") and call.name in ("get_weather", "get_time"), call
                if choice["type"] == "tool":
                    assert call.name == "get_weather", call
                schema = WEATHER if call.name == "get_weather" else TIME
                jsonschema.validate(call.input, schema["input_schema"])
            if choice.get("disable_parallel_tool_use"):
                assert len(calls) == 1, r
            with self.anthropic.messages.stream(**kwargs) as s:
                final = s.get_final_message()
            assert without_ids(final) == without_ids(r), (final, r)
        # The results go back: the prompt is jinja2's of the same history in Chat Completions form.
        history = question + [{"role": "assistant", "content": r.content},
                              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id,
                                                            "content": "sunny, 21 C"} for c in calls]}]
        answer = self.anthropic.messages.create(model="m", max_tokens=32, extra_body=GREEDY, tools=[WEATHER, TIME],
                                                messages=history)
        chat = question + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": c.id, "type": "function",
                             "function": {"name": c.name, "arguments": json.dumps(c.input)}} for c in calls]},
            *[{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": "sunny, 21 C"} for c in calls]]
        tools = [chat_tool(WEATHER), chat_tool(TIME)]
        ids, blocks, stop, _ = self.greedy_case(chat, 32, tools=tools)
        assert answer.usage.input_tokens == len(ids), (answer.usage, len(ids))
        if "<|" not in json.dumps(blocks):  # no call written by the model: its text is transformers'
            assert blocks_of(answer) == blocks and answer.stop_reason == stop, (blocks_of(answer), blocks)
        print(f"  calls {[(c.name, c.input) for c in calls]}; answer {blocks_of(answer)}")

    def model_made_tool_use(self):
        """The scripted adapter's own call through the Messages API (tool_choice auto), then its answer to the
        tool_result: the scripted conversations' tools and words, in Anthropic's form."""
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in REQUESTS["weather"]["tools"]]
        answer = next(a for n, _, a, _ in SCRIPT if n == "tool result")["content"]
        server = Server(self.binary, MODEL, self.workdir, "server-scripted", "--lora", f"scripted={SCRIPTED_ADAPTER}")
        try:
            server.wait_ready()
            client = self.client(server)
            kwargs = dict(model="scripted", max_tokens=64, extra_body=GREEDY, tools=tools,
                          tool_choice={"type": "auto"}, messages=REQUESTS["weather"]["messages"])
            r = client.messages.create(**kwargs)
            calls = [b for b in r.content if b.type == "tool_use"]
            assert r.stop_reason == "tool_use" and [(c.name, c.input) for c in calls] == \
                [("get_weather", {"city": "Paris"})], r
            with client.messages.stream(**kwargs) as s:
                assert without_ids(s.get_final_message()) == without_ids(r)
            history = kwargs["messages"] + [
                {"role": "assistant", "content": r.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                              "content": "sunny, 21 C"}]}]
            after = client.messages.create(**{**kwargs, "messages": history})
            assert after.stop_reason == "end_turn" and blocks_of(after) == [{"type": "text", "text": answer}], after
        finally:
            server.kill()

    def demo_alone_tool_use(self):
        """No adapter: the demo model (trained on agent work) answers a held-out city's weather question with its own
        tool_use block (tool_choice auto), then states the tool_result's values (end_turn)."""
        tools = [{"name": "get_weather", "description": demo_agent.WEATHER_DESCRIPTION,
                  "input_schema": demo_agent.WEATHER_PARAMETERS}]
        messages = [{"role": "user", "content": demo_agent.WEATHER_ASK}]
        kwargs = dict(model="m", max_tokens=64, extra_body=GREEDY, tools=tools, tool_choice={"type": "auto"})
        r = self.anthropic.messages.create(messages=messages, **kwargs)
        calls = [b for b in r.content if b.type == "tool_use"]
        assert r.stop_reason == "tool_use" and [(c.name, c.input) for c in calls] == \
            [("get_weather", {"city": demo_agent.CITY})], r
        result = {"forecast": "cloudy", "temperature": 9}
        history = messages + [{"role": "assistant", "content": r.content},
                              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                            "content": json.dumps(result)}]}]
        after = self.anthropic.messages.create(messages=history, **kwargs)
        text = "".join(b.text for b in after.content if b.type == "text")
        assert after.stop_reason == "end_turn" and all(str(v) in text for v in result.values()), after
        print(f"  the demo model: tool_use {calls[0].input}, then {text!r}")

    def conversation(self):
        """A Messages conversation with every kind of block, and the Chat Completions request it stands for."""
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two cities: two calls.", "signature": "x"},
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                 "input": {"city": "Rome", "unit": "celsius"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                 "content": [{"type": "text", "text": "station offline"}]},
                {"type": "text", "text": "And the time?"}]},
        ]
        body = {"model": "m", "system": [{"type": "text", "text": SYSTEM}], "messages": messages,
                "tools": [WEATHER, TIME], "thinking": {"type": "enabled", "budget_tokens": 2048}}
        chat = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking both."}],
             "reasoning_content": "Two cities: two calls.",
             "tool_calls": [{"id": "toolu_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                            {"id": "toolu_2", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "sunny, 21 C"},
            {"role": "tool", "tool_call_id": "toolu_2", "name": "get_weather", "content": "Error: station offline"},
            {"role": "user", "content": [{"type": "text", "text": "And the time?"}]},
        ]
        return body, chat

    def golden_conversation(self):
        body, chat = self.conversation()
        _, ids = self.ref.prompt(chat, tools=[chat_tool(WEATHER), chat_tool(TIME)], thinking=True)
        status, c = self.server.json("POST", "/v1/chat/completions", {
            "model": "m", "messages": chat, "tools": [chat_tool(WEATHER), chat_tool(TIME)], "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": True}})
        assert status == 200 and c["usage"]["prompt_tokens"] == len(ids), (status, c, len(ids))
        r = self.anthropic.messages.create(max_tokens=1, **body)
        assert r.usage.input_tokens == len(ids), (r.usage, len(ids))
        print(f"  {len(ids)} prompt tokens: Messages = Chat Completions = jinja2")

    def count_tokens(self):
        body, chat = self.conversation()
        _, ids = self.ref.prompt(chat, tools=[chat_tool(WEATHER), chat_tool(TIME)], thinking=True)
        n = self.anthropic.messages.count_tokens(**body)
        assert n.input_tokens == len(ids), (n, len(ids))
        status, t = self.server.json("POST", "/tokenize", {"messages": chat, "tools": [chat_tool(WEATHER), chat_tool(TIME)],
                                                           "chat_template_kwargs": {"enable_thinking": True}})
        assert status == 200 and t["count"] == len(ids), t
        plain = self.anthropic.messages.count_tokens(model="m", messages=[{"role": "user", "content": QUESTION}])
        assert plain.input_tokens == len(self.ref.prompt([{"role": "user", "content": QUESTION}])[1]), plain

    # ---- refusals, keys, names --------------------------------------------------------------------------------------

    def bad_input(self):
        user = [{"role": "user", "content": "hi"}]
        cases = [
            ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
             "messages.0.content.0.type: "),
            ("/v1/messages", {"messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_9", "content": "r"}]}]},
             "messages.0.content.0.tool_use_id: "),
            ("/v1/messages", {"max_tokens": None}, "max_tokens: Field required"),
            ("/v1/messages", {"messages": [{"role": "user"}]}, "messages.0.content: Field required"),
            ("/v1/messages", {"tools": [{"name": "f"}]}, "tools.0.input_schema: Field required"),
            ("/v1/messages", {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice: "),
            ("/v1/messages", {"temperature": "hot"}, "temperature: "),
            ("/v1/messages", {"max_tokens": 100000}, "max_tokens: "),
            ("/v1/messages", {"stream": True, "thinking": {"type": "sometimes"}}, "thinking.type: "),
            ("/v1/messages/count_tokens", {"messages": "hi"}, "messages: "),
        ]
        for path, patch, prefix in cases:
            body = {"model": "m", "max_tokens": 8, "messages": user, **patch}
            body = {k: v for k, v in body.items() if v is not None}
            status, headers, data = self.server.request("POST", path, body)
            e = json.loads(data)
            assert status == 400 and headers["content-type"] == "application/json", (patch, status, data)
            assert e["type"] == "error" and e["error"]["type"] == "invalid_request_error", e
            assert e["error"]["message"].startswith(prefix), (e, prefix)
        try:
            self.anthropic.messages.create(model="m", max_tokens=8, messages=[
                {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}])
            raise AssertionError("a document block was accepted")
        except anthropic.BadRequestError as e:
            assert e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", e.body
            assert e.body["error"]["message"].startswith("messages.0.content.0.type: "), e.body
        status, _, data = self.server.request("POST", "/v1/messages", b"{not json")
        assert status == 400 and json.loads(data)["type"] == "error", data
        status, _, data = self.server.request("GET", "/v1/messages")
        assert status == 405 and json.loads(data)["type"] == "error", data
        self.healthy()

    def keys_and_names(self):
        key = "sk-messages-test"
        server = Server(self.binary, MODEL, self.workdir, "server-key", "--api-key", key,
                        "--served-model-name", "qat")
        try:
            server.wait_ready()
            request = dict(model="qat", max_tokens=4, extra_body=GREEDY, messages=[{"role": "user", "content": QUESTION}])
            assert self.client(server, api_key=key).messages.create(**request).stop_reason  # x-api-key
            assert self.client(server, api_key=None, auth_token=key).messages.create(**request).stop_reason  # Bearer
            assert self.client(server, api_key=key).messages.count_tokens(model="qat", messages=request["messages"])
            try:
                self.client(server, api_key="wrong").messages.create(**request)
                raise AssertionError("a wrong key was accepted")
            except anthropic.AuthenticationError as e:
                assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body
            try:
                self.client(server, api_key=key).messages.create(**{**request, "model": "claude-opus"})
                raise AssertionError("another model's name was accepted")
            except anthropic.NotFoundError as e:
                assert e.status_code == 404 and e.body["error"]["type"] == "not_found_error", e.body
            self.healthy(server)
        finally:
            server.kill()

    # ---- images -----------------------------------------------------------------------------------------------------

    def images(self):
        """The multimodal fixture's image_odd case (an image, then "Describe this.") as a Messages request."""
        ref = load_file(str(MM / "reference.safetensors"))
        want_ids, greedy = ref["image_odd.input_ids"].flatten().tolist(), ref["image_odd.greedy_f32"].tolist()
        tokenizer = Tokenizer.from_file(str(MM / "bf16" / "tokenizer.json"))
        eos = json.loads((MM / "bf16" / "generation_config.json").read_text())["eos_token_id"]
        eos = eos if isinstance(eos, list) else [eos]
        handler = partial(SimpleHTTPRequestHandler, directory=str(MM / "media"))
        handler.log_message = lambda *args: None
        media = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=media.serve_forever, daemon=True).start()
        server = Server(self.binary, MM / "bf16", self.workdir, "server-mm", *F32, "--media-fetch-timeout", "60",
                        "--allowed-media-domains", "127.0.0.1")
        try:
            server.wait_ready()
            client = self.client(server)
            data = base64.b64encode((MM / "media" / "odd_45x71.png").read_bytes()).decode()
            for source in ({"type": "base64", "media_type": "image/png", "data": data},
                           {"type": "url", "url": f"http://127.0.0.1:{media.server_port}/odd_45x71.png"}):
                r = client.messages.create(model="m", max_tokens=len(greedy), extra_body=GREEDY, messages=[
                    {"role": "user", "content": [{"type": "image", "source": source},
                                                 {"type": "text", "text": "Describe this."}]}])
                n = r.usage.output_tokens
                assert r.usage.input_tokens == len(want_ids), (source["type"], r.usage, len(want_ids))
                assert blocks_of(r) == expected_blocks(tokenizer.decode(greedy[:n], skip_special_tokens=False),
                                                       False, False), (source["type"], r)
                assert n == len(greedy) or (r.stop_reason == "end_turn" and greedy[n] in eos), (r, greedy)
        finally:
            server.kill()
            media.shutdown()

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "server-messages", *F32)
        try:
            self.server.wait_ready()
            self.anthropic = self.client(self.server)
            for name, fn in [
                ("messages.create: transformers' greedy text, jinja2's prompt length", self.create_is_transformers_greedy),
                ("messages.stream reassembles to the non-streamed message; event order", self.stream_reassembles),
                ("stop_sequences and max_tokens stop where the reference says", self.stop_sequences_and_max_tokens),
                ("thinking enabled: jinja2's thinking prompt, the reference's split", self.thinking_enabled),
                ("thinking with the later template (opened thought channel)", self.thinking_opened_channel),
                ("a thinking block with its signature, streamed and not (random model)", self.thinking_block),
                ("tool_choice any / tool force a valid tool_use; the tool_result round trip", self.tool_use_round_trip),
                ("model-made tool_use (tool_choice auto, scripted adapter) and the answer to its result",
                 self.model_made_tool_use),
                ("model-made tool_use by the demo model alone, then its answer from the tool_result",
                 self.demo_alone_tool_use),
                ("a conversation with every block renders the Chat Completions prompt", self.golden_conversation),
                ("count_tokens = the chat prompt's tokens", self.count_tokens),
                ("bad input: 400 in Anthropic's shape naming the field, server up", self.bad_input),
                ("x-api-key, Bearer, wrong key, another model's name", self.keys_and_names),
                ("image blocks (base64 and url sources) on the multimodal fixture", self.images),
            ]:
                self.check(name, fn)
        finally:
            self.server.kill()
        return self.summary("anthropic messages checks", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-messages-test-") as tmp:
        return MessagesSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
