#!/usr/bin/env python3
"""End-to-end test of OpenAI's Responses API on `qatserve serve` (POST /v1/responses, GET/DELETE
/v1/responses/{id}, POST /v1/responses/{id}/cancel) with the official `openai` client and the OpenAI Agents SDK, on
the demo model (models/gemma4-tiny-qat) served in f32.

usage: test_responses_api.py QATSERVE_BINARY

References are computed now, never stored: transformers' tokenizer renders the equivalent Chat Completions
conversation with the model's own chat template (prompt token ids), transformers' model gives the greedy tokens from
them, jsonschema and pydantic check constrained outputs. Checks: responses.create's greedy text and status
(incomplete at max_output_tokens) are transformers'; responses.stream's events are well-formed (sequence numbers,
output_index, item_id, content_index) and reassemble to the same response as the non-streamed one; responses.parse
gets its pydantic model; a function-tool round trip (tool_choice required, arguments valid for the tool's
parameters, then function_call_output) and a Responses input with instructions, tools, reasoning, function_call and
function_call_output render transformers' prompt for the equivalent chat messages; previous_response_id continues the
stored conversation (function calls included); retrieve/delete/cancel and their 404s; bad input is a 400 naming the
field; the store's entry bound (serve --responses-max-entries) drops the least recently used; an Agent run with
OpenAIResponsesModel and with OpenAIChatCompletionsModel, run and run_streamed, with a function tool and an
output_type, on the demo model with the forced-output adapter tests/fixtures/scripted_agent_lora
(tools/python/scripted_agent.py): the model calls the tool itself (tool_choice auto), the SDK runs it, the model
answers the output_type; and the same loop on the demo model by itself (no adapter, a held-out city): its own call,
then a final answer stating the tool's output.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no demo model, or the venv lacks a package).
"""
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import SKIP, Checks, Server  # noqa: E402 (exits 77 without openai)
import demo_agent  # noqa: E402 (requests the demo model answers by itself)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
sys.path.insert(0, str(ROOT / "tools" / "python"))

try:
    import agents
    import jsonschema
    import openai
    import pydantic
    import torch
    from check_constrained_outputs import longest
    from make_chat_golden import template_messages
    from scripted_agent import AGENTS_INSTRUCTIONS
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:  # the venv predates the pins
    print(f"responses test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

GREEDY = 8  # max_output_tokens of the greedy comparisons
SCRIPTED_ADAPTER = ROOT / "tests" / "fixtures" / "scripted_agent_lora"
FLAGS = ("--precision", "f32", "--threads", "2")
# The city is an enum: a forced call is then finite whatever the demo model has learned (a free string need not close).
CITIES = ["Paris", "Rome", "Tokyo"]
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                      "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
           "parameters": WEATHER_PARAMETERS, "strict": True}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                                                 "parameters": WEATHER_PARAMETERS}}


def run_agent(server, model_class, model_name, streamed, ask, **agent_args):
    """One Agents SDK run against `server`: Runner.run, or Runner.run_streamed with every event consumed (the
    model's calls then come from the streamed events)."""
    async def run():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                    max_retries=0, timeout=120)
        agent = agents.Agent(name="weather", model=model_class(model=model_name, openai_client=client),
                             model_settings=agents.ModelSettings(temperature=0, max_tokens=64), **agent_args)
        try:
            if not streamed:
                return await agents.Runner.run(agent, ask, max_turns=3)
            streaming = agents.Runner.run_streamed(agent, ask, max_turns=3)
            events = [event.type async for event in streaming.stream_events()]
            assert "raw_response_event" in events and "run_item_stream_event" in events, set(events)
            return streaming
        finally:
            await client.close()

    return asyncio.run(run())


class Forecast(pydantic.BaseModel):
    sunny: bool
    unit: Literal["celsius", "fahrenheit"]


class Place(pydantic.BaseModel):
    lon: float
    lat: float


class Reading(pydantic.BaseModel):
    """Fields in an order that is not sorted, none of them an unbounded string: every output ends."""
    temperature: float
    count: int
    ok: bool
    unit: Literal["c", "f"]
    where: Place


class Verdict(pydantic.BaseModel):
    """An agent's final output: a finite schema, so the last turn ends whatever the demo model has learned."""
    sunny: bool


def dump(value, drop=("parsed",)):
    """A response (or part) as plain data without the keys `drop` (by default the client's own `parsed` fields)."""
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump()
    if isinstance(value, dict):
        return {k: dump(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [dump(v, drop) for v in value]
    return value


def without_ids(value):
    """What two requests for the same output share: all but ids and times."""
    return dump(value, ("parsed", "id", "call_id", "created_at", "item_id"))


class ResponsesSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.tool_response = None  # tool_round_trip's first response, continued by previous_response_id
        self.binary = binary
        self.workdir = Path(workdir)
        self.tokenizer = AutoTokenizer.from_pretrained(MODEL)
        self.hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
        self.eos = set(json.loads((MODEL / "generation_config.json").read_text())["eos_token_id"])

    # ---- references ---------------------------------------------------------------------------------------------

    def template_ids(self, messages, tools=None, thinking=False):
        """transformers' prompt ids of a Chat Completions conversation (the model's chat template)."""
        return self.tokenizer.apply_chat_template(template_messages(messages), tools=tools, add_generation_prompt=True,
                                                  tokenize=True, enable_thinking=thinking, return_dict=False)

    def greedy(self, ids, n=GREEDY):
        """transformers' greedy continuation: (text without special tokens, status the Responses API reports)."""
        with torch.no_grad():
            out = self.hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0][len(ids):].tolist()
        stopped = bool(out) and out[-1] in self.eos
        text = self.tokenizer.decode(out[:-1] if stopped else out, skip_special_tokens=True)
        return text, "completed" if stopped or len(out) < n else "incomplete"

    def assert_greedy(self, r, messages, tools=None):
        ids = self.template_ids(messages, tools)
        assert r.usage.input_tokens == len(ids), (r.usage.input_tokens, len(ids))
        text, status = self.greedy(ids)
        assert (r.output_text, r.status) == (text, status), (r.output_text, r.status, text, status)
        if status == "incomplete":
            assert r.incomplete_details.reason == "max_output_tokens", r.incomplete_details

    # ---- checks -------------------------------------------------------------------------------------------------

    def create_is_transformers_greedy(self):
        r = self.client.responses.create(model="m", input="Hello there", max_output_tokens=GREEDY, temperature=0)
        assert r.id.startswith("resp_") and r.object == "response" and r.model, r
        assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
        assert r.usage.input_tokens_details.cached_tokens == 0 and r.usage.output_tokens_details.reasoning_tokens == 0
        assert r.output[0].type == "message" and r.output[0].role == "assistant", r.output
        assert r.output[0].content[0].annotations == [], r.output
        self.assert_greedy(r, [{"role": "user", "content": "Hello there"}])
        r = self.client.responses.create(model="m", instructions="Answer briefly.", max_output_tokens=GREEDY,
                                         input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                                         temperature=0, metadata={"k": "v"}, user="u1")
        assert r.instructions == "Answer briefly." and r.metadata == {"k": "v"} and r.user == "u1", r
        self.assert_greedy(r, [{"role": "system", "content": "Answer briefly."},
                               {"role": "user", "content": [{"type": "text", "text": "Hi"}]}])

    def stream_reassembles(self):
        # A prompt the demo model answers within the budget: the SDK's get_final_response() needs response.completed.
        kwargs = dict(model="m", input="Who wrote Emma?", max_output_tokens=48, temperature=0)
        whole = self.client.responses.create(**kwargs)
        with self.client.responses.stream(**kwargs) as stream:
            events = list(stream)
            final = stream.get_final_response()
        assert [e.sequence_number for e in events] == list(range(len(events))), [e.type for e in events]
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"], events[:2]
        assert events[-1].type == ("response.completed" if final.status == "completed" else "response.incomplete")
        assert events[-1].response.model_dump() == final.model_dump()
        items = {}
        for e in events:
            if e.type == "response.output_item.done":
                items[e.output_index] = dump(e.item)
            if e.type == "response.output_text.delta":
                assert e.item_id == final.output[e.output_index].id and e.content_index == 0, e
        assert [items[i] for i in sorted(items)] == dump(final.output), (items, final.output)
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == final.output_text == whole.output_text, (deltas, final.output_text, whole.output_text)
        assert without_ids(final) == without_ids(whole), (without_ids(final), without_ids(whole))

    def parse_pydantic(self):
        r = self.client.responses.parse(model="m", input="Weather in Paris as JSON.", text_format=Forecast,
                                        temperature=0, max_output_tokens=200)
        assert r.status == "completed", r
        assert isinstance(r.output_parsed, Forecast), r.output_parsed
        jsonschema.validate(json.loads(r.output_text), Forecast.model_json_schema())
        assert r.text.format.type == "json_schema", r.text

    def parse_declared_order(self):
        """text.format json_schema writes properties in the order the schema declares them (the pydantic model's
        fields), not sorted, streaming and not; the SDK parses every output."""
        bound = longest(Reading.model_json_schema())
        for seed in range(3):
            r = self.client.responses.parse(model="m", input="A reading", text_format=Reading, temperature=1.0,
                                            max_output_tokens=bound + 1, extra_body={"seed": seed})
            assert r.status == "completed" and isinstance(r.output_parsed, Reading), r
            written = json.loads(r.output_text, object_pairs_hook=list)
            assert [k for k, _ in written] == list(Reading.model_fields), r.output_text
            assert [k for k, _ in dict(written)["where"]] == list(Place.model_fields), r.output_text
        with self.client.responses.stream(model="m", input="A reading", text_format=Reading, temperature=0,
                                          max_output_tokens=bound + 1) as stream:
            final = stream.get_final_response()
        written = json.loads(final.output_text, object_pairs_hook=list)
        assert [k for k, _ in written] == list(Reading.model_fields), final.output_text

    def tool_round_trip(self):
        question = {"role": "user", "content": "What is the weather in Paris?"}
        first = self.client.responses.create(model="m", input=[question], tools=[WEATHER], tool_choice="required",
                                             temperature=0, max_output_tokens=64)
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls and first.status == "completed", first
        call = calls[0]
        assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed", call
        jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
        second = self.client.responses.create(
            model="m", input=[question, *first.output,
                              {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}],
            tools=[WEATHER], temperature=0, max_output_tokens=GREEDY)
        chat = [question,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls]},
                *[{"role": "tool", "tool_call_id": c.call_id, "content": "sunny, 21 C"} for c in calls[:1]]]
        if len(calls) == 1:  # with several calls the chat conversation would need every result
            self.assert_greedy(second, chat, [CHAT_WEATHER])
        self.tool_response = first

    def items_render_as_chat(self):
        """instructions, tools, reasoning, function_call and function_call_output: the prompt is transformers' for the
        equivalent chat messages, thinking on (reasoning.effort) and off."""
        items = [{"role": "user", "content": "Weather in Rome?"},
                 {"type": "reasoning", "id": "rs_1", "summary": [],
                  "content": [{"type": "reasoning_text", "text": "The tool knows."}]},
                 {"type": "function_call", "call_id": "call_9", "name": "get_weather",
                  "arguments": '{"city": "Rome"}'},
                 {"type": "function_call_output", "call_id": "call_9", "output": "rain"},
                 {"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": "It rains.", "annotations": []}]},
                 {"role": "user", "content": "Thanks. And tomorrow?"}]
        chat = [{"role": "system", "content": "You are a weather agent."},
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": None, "reasoning_content": "The tool knows.", "tool_calls": [
                    {"id": "call_9", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                {"role": "tool", "tool_call_id": "call_9", "content": "rain"},
                {"role": "assistant", "content": "It rains."},
                {"role": "user", "content": "Thanks. And tomorrow?"}]
        for effort in (None, "high"):
            r = self.client.responses.create(model="m", instructions="You are a weather agent.", input=items,
                                             tools=[WEATHER], temperature=0, max_output_tokens=GREEDY,
                                             reasoning={"effort": effort} if effort else None)
            ids = self.template_ids(chat, [CHAT_WEATHER], thinking=effort is not None)
            assert r.usage.input_tokens == len(ids), (effort, r.usage.input_tokens, len(ids))
            c = self.client.chat.completions.create(model="m", messages=chat, tools=[CHAT_WEATHER], temperature=0,
                                                    max_completion_tokens=GREEDY, reasoning_effort=effort)
            assert c.usage.prompt_tokens == len(ids), (c.usage.prompt_tokens, len(ids))
            if effort is None:
                self.assert_greedy(r, chat, [CHAT_WEATHER])

    def previous_response_id(self):
        first = self.client.responses.create(model="m", input="Hello", max_output_tokens=GREEDY, temperature=0)
        second = self.client.responses.create(model="m", previous_response_id=first.id, input="And then?",
                                              max_output_tokens=GREEDY, temperature=0)
        assert second.previous_response_id == first.id, second
        self.assert_greedy(second, [{"role": "user", "content": "Hello"},
                                    {"role": "assistant", "content": first.output_text},
                                    {"role": "user", "content": "And then?"}])
        # A stored function call continues with its output alone.
        tool = self.tool_response
        assert tool is not None, "needs the function tool round trip's response"
        call = next(o for o in tool.output if o.type == "function_call")
        third = self.client.responses.create(
            model="m", previous_response_id=tool.id, tools=[WEATHER], temperature=0, max_output_tokens=GREEDY,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
        assert third.status in ("completed", "incomplete"), third
        with_history = self.client.responses.create(
            model="m", tools=[WEATHER], temperature=0, max_output_tokens=GREEDY,
            input=[{"role": "user", "content": "What is the weather in Paris?"}, *tool.output,
                   {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
        assert third.usage.input_tokens == with_history.usage.input_tokens, (third.usage, with_history.usage)
        assert third.output_text == with_history.output_text

    def retrieve_delete_cancel(self):
        r = self.client.responses.create(model="m", input="Hi", max_output_tokens=4, temperature=0)
        got = self.client.responses.retrieve(r.id)
        assert got.model_dump() == r.model_dump(), (got, r)
        try:
            self.client.responses.cancel(r.id)
            raise AssertionError("a finished response was cancelled")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == "response_id", e.body
        self.client.responses.delete(r.id)
        for call in (lambda: self.client.responses.retrieve(r.id), lambda: self.client.responses.delete(r.id),
                     lambda: self.client.responses.cancel(r.id)):
            try:
                call()
                raise AssertionError("a deleted response was found")
            except openai.NotFoundError as e:
                assert e.body["type"] == "invalid_request_error" and r.id in e.body["message"], e.body
        unstored = self.client.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
        assert unstored.store is False, unstored
        try:
            self.client.responses.retrieve(unstored.id)
            raise AssertionError("store: false was stored")
        except openai.NotFoundError:
            pass
        try:
            self.client.responses.create(model="m", input="Hi", previous_response_id="resp_missing")
            raise AssertionError("an unknown previous_response_id was accepted")
        except openai.NotFoundError as e:
            assert e.body["param"] == "previous_response_id", e.body

    def bad_requests(self):
        cases = [
            ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
            ({"input": [{"role": "user", "content": "x"},
                        {"type": "function_call_output", "call_id": "call_nope", "output": "1"}]}, "input"),
            ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input"),
            ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
            ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
            ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
            ({"input": "x", "tool_choice": "required"}, "tool_choice"),
            ({"input": 7}, "input"),
            ({}, "input"),
        ]
        for body, param in cases:
            for stream in (False, True):
                status, _, data = self.server.request("POST", "/v1/responses", dict(body, stream=stream))
                error = json.loads(data)["error"]
                assert status == 400 and error["param"] == param and error["type"] == "invalid_request_error", \
                    (body, status, error)
        status, _, data = self.server.request("GET", "/v1/responses/resp_none")
        assert status == 404 and json.loads(data)["error"]["message"], data
        status, _, _ = self.server.request("PUT", "/v1/responses/resp_none")
        assert status == 405, status
        status, _, data = self.server.request("GET", "/health")
        assert status == 200, data

    def store_bound(self):
        small = Server(self.binary, MODEL, self.workdir, "server-small-store", *FLAGS, "--responses-max-entries", "2")
        try:
            small.wait_ready()
            client = small.client()
            ids = [client.responses.create(model="m", input=f"Hi {i}", max_output_tokens=2).id for i in range(2)]
            client.responses.retrieve(ids[0])  # now the most recently used
            ids.append(client.responses.create(model="m", input="Hi 2", max_output_tokens=2).id)
            for kept in (ids[0], ids[2]):
                client.responses.retrieve(kept)
            try:
                client.responses.retrieve(ids[1])
                raise AssertionError("the least recently used response was kept past --responses-max-entries")
            except openai.NotFoundError:
                pass
        finally:
            small.kill()

    def agents_call_their_tool(self):
        """The Agents SDK's loop on the model's own call: tool_choice auto beside the output_type's schema (the
        server lets the model call a tool or answer in the schema), the scripted adapter calls get_weather, the SDK
        runs the tool and sends its output back, the model answers the Verdict."""
        self.agent_runs(self.scripted_weather_agent, "--lora", f"scripted={SCRIPTED_ADAPTER}")

    def agents_on_the_demo_model_alone(self):
        """The same loop with no adapter: the demo model (trained on agent work) calls the tool for a city it never
        saw in training, the SDK runs it, and the model's final answer states the tool's result."""
        self.agent_runs(self.demo_weather_agent)

    def agent_runs(self, one_run, *flags):
        """one_run(server, model_class, streamed) with both of the SDK's OpenAI models, run and run_streamed."""
        agents.set_tracing_disabled(True)
        server = Server(self.binary, MODEL, self.workdir, "server-agents", *flags)
        try:
            server.wait_ready()
            for model_class in (agents.OpenAIResponsesModel, agents.OpenAIChatCompletionsModel):
                for streamed in (False, True):
                    one_run(server, model_class, streamed)
        finally:
            server.kill()

    @staticmethod
    def scripted_weather_agent(server, model_class, streamed):
        """The scripted adapter's call, the SDK running the tool, the model's Verdict."""
        cities = []

        @agents.function_tool
        def get_weather(city: Literal["Paris", "Rome", "Tokyo"]) -> str:
            """Current weather for a city."""
            cities.append(city)
            return f"sunny in {city}"

        result = run_agent(server, model_class, "scripted", streamed, "What is the weather in Paris?",
                           instructions=AGENTS_INSTRUCTIONS, tools=[get_weather], output_type=Verdict)
        assert cities == ["Paris"], f"{model_class.__name__}: the tool was called with {cities}"
        kinds = [type(item).__name__ for item in result.new_items]
        assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds
        assert result.final_output == Verdict(sunny=True), result.final_output
        print(f"  {model_class.__name__}{', streamed' if streamed else ''}: the model called the tool with {cities}, "
              f"final output {result.final_output!r}")

    @staticmethod
    def demo_weather_agent(server, model_class, streamed):
        """The demo model's own call for a held-out city, the SDK running the tool, an answer stating its output."""
        cities = []

        @agents.function_tool
        def get_weather(city: str) -> str:
            """Get the current weather in a city."""
            cities.append(city)
            return json.dumps(demo_agent.WEATHER_RESULT)

        result = run_agent(server, model_class, "m", streamed, demo_agent.WEATHER_ASK, tools=[get_weather])
        assert cities == [demo_agent.CITY], f"{model_class.__name__}: the tool was called with {cities}"
        kinds = [type(item).__name__ for item in result.new_items]
        assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds
        assert all(str(v) in result.final_output for v in demo_agent.WEATHER_RESULT.values()), result.final_output
        print(f"  {model_class.__name__}{', streamed' if streamed else ''}: the demo model called the tool with "
              f"{cities}, final output {result.final_output!r}")

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "server-responses", *FLAGS)
        try:
            self.server.wait_ready()
            self.client = self.server.client()
            for name, fn in [
                ("responses.create is transformers' greedy, incomplete at max_output_tokens",
                 self.create_is_transformers_greedy),
                ("responses.stream reassembles to the non-streamed response", self.stream_reassembles),
                ("responses.parse with a pydantic model", self.parse_pydantic),
                ("text.format json_schema keeps the declared property order", self.parse_declared_order),
                ("function tool round trip (tool_choice required, function_call_output)", self.tool_round_trip),
                ("instructions, tools, reasoning, calls and outputs render transformers' chat prompt",
                 self.items_render_as_chat),
                ("previous_response_id continues the stored conversation", self.previous_response_id),
                ("retrieve, delete, cancel and 404s", self.retrieve_delete_cancel),
                ("bad input: 400 naming the field", self.bad_requests),
                ("--responses-max-entries drops the least recently used", self.store_bound),
                ("Agents SDK: the model calls the function tool (auto), then answers the output_type",
                 self.agents_call_their_tool),
                ("Agents SDK on the demo model alone: its own call, then an answer from the tool's output",
                 self.agents_on_the_demo_model_alone),
            ]:
                self.check(name, fn)
        finally:
            self.server.kill()
        return self.summary("responses checks", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not (MODEL / "model.safetensors").is_file():
        print(f"responses test skipped: {MODEL}/model.safetensors is missing")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="qatserve-responses-test-") as tmp:
        return ResponsesSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
