#!/usr/bin/env python3
"""langchain-openai's ChatOpenAI against `qatserve serve`, driven as LangChain agents drive it, on the demo model
with the forced-output adapter tests/fixtures/scripted_agent_lora (tools/python/scripted_agent.py: the requests
below are the script's, so the model's calls are its own):

  - bind_tools + invoke: the AIMessage's tool_calls are the model's call (name, args, an id);
  - stream: the AIMessageChunks' tool_call_chunks add up to the same call;
  - the ToolMessage round trip (the AIMessage and a ToolMessage back in the history): the scripted answer;
  - two parallel calls in one AIMessage;
  - with_structured_output(a pydantic model): the parsed object (constrained decoding, json_schema).
Then the demo model by itself (no adapter; it was trained on agent work, tools/python/train_tiny_agent.py), on
requests with held-out names: its own call and an answer from the ToolMessage stating the result's values, and
with_structured_output filling a pydantic model with the request's values.

usage: test_langchain.py QATSERVE_BINARY
Exit status: 0 all passed, 1 a check failed, 77 skipped (langchain-openai missing from the venv).
"""
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import SKIP, Checks, Server  # noqa: E402 (exits 77 without openai)
import demo_agent  # noqa: E402 (requests the demo model answers by itself)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "python"))
try:
    import pydantic
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    from scripted_agent import REQUESTS, SCRIPT
except ImportError as e:
    print(f"langchain test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

MODEL = ROOT / "models" / "gemma4-tiny-qat"
SCRIPTED_ADAPTER = ROOT / "tests" / "fixtures" / "scripted_agent_lora"


class Verdict(pydantic.BaseModel):
    sunny: bool


class Person(pydantic.BaseModel):
    name: str
    age: int


DEMO = "gemma4-tiny-qat"  # the demo model by itself (its served name; no adapter), asked demo_agent's requests


def answer_of(name):
    return next(answer for n, _, answer, _ in SCRIPT if n == name)


class LangchainSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)

    def chat(self, model="scripted", **kwargs):
        return ChatOpenAI(model=model, base_url=f"http://127.0.0.1:{self.server.port}/v1", api_key="unused",
                          temperature=0, max_tokens=80, max_retries=0, timeout=60, **kwargs)

    def question(self, name):
        """The script's conversation `name` as LangChain messages (its single user turn) and its tools."""
        messages = REQUESTS[name]["messages"]
        assert len(messages) == 1 and messages[0]["role"] == "user", messages
        return [HumanMessage(messages[0]["content"])], REQUESTS[name]["tools"]

    def bind_tools_invoke(self):
        messages, tools = self.question("weather")
        ai = self.chat().bind_tools(tools).invoke(messages)
        assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": "Paris"})], ai
        assert ai.tool_calls[0]["id"].startswith("call_") and ai.response_metadata["finish_reason"] == "tool_calls", ai
        self.first_call = (messages, tools, ai)

    def stream_tool_call_chunks(self):
        messages, tools = self.question("weather")
        chunks = list(self.chat().bind_tools(tools).stream(messages))
        assert len(chunks) > 1, chunks
        whole = chunks[0]
        for chunk in chunks[1:]:
            whole += chunk
        assert [(c["name"], c["args"]) for c in whole.tool_calls] == [("get_weather", {"city": "Paris"})], whole

    def tool_message_round_trip(self):
        messages, tools, ai = self.first_call
        history = messages + [ai, ToolMessage("sunny, 21 C", tool_call_id=ai.tool_calls[0]["id"])]
        reply = self.chat().bind_tools(tools).invoke(history)
        assert reply.content == answer_of("tool result")["content"] and not reply.tool_calls, reply

    def parallel_calls(self):
        messages, tools = self.question("two calls")
        ai = self.chat().bind_tools(tools).invoke(messages)
        assert [(c["name"], c["args"]) for c in ai.tool_calls] == [
            ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "celsius"})], ai

    def structured_output(self):
        verdict = self.chat().with_structured_output(Verdict).invoke("Is it sunny in Paris?")
        assert isinstance(verdict, Verdict), verdict

    def demo_alone_tool_loop(self):
        """No adapter: the demo model (trained on agent work) calls the tool for a held-out city, then answers from
        the ToolMessage with the result's values."""
        chat = self.chat(model=DEMO).bind_tools([demo_agent.WEATHER_TOOL])
        messages = [HumanMessage(demo_agent.WEATHER_ASK)]
        ai = chat.invoke(messages)
        assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": demo_agent.CITY})], ai
        result = {"forecast": "rainy", "temperature": 12}
        reply = chat.invoke(messages + [ai, ToolMessage(json.dumps(result), tool_call_id=ai.tool_calls[0]["id"])])
        assert not reply.tool_calls and all(str(v) in reply.content for v in result.values()), reply
        print(f"  the demo model: {ai.tool_calls[0]['name']}({ai.tool_calls[0]['args']}), then {reply.content!r}")

    def demo_alone_structured_output(self):
        person = self.chat(model=DEMO).with_structured_output(Person).invoke(demo_agent.PERSON_ASK)
        assert person == Person(**demo_agent.PERSON), person

    def run(self):
        self.server = Server(self.binary, MODEL, self.workdir, "server-langchain", "--lora",
                             f"scripted={SCRIPTED_ADAPTER}")
        try:
            self.server.wait_ready()
            for name, fn in [
                ("bind_tools + invoke: the model's tool call", self.bind_tools_invoke),
                ("stream: tool_call_chunks add up to the call", self.stream_tool_call_chunks),
                ("the ToolMessage round trip: the scripted answer", self.tool_message_round_trip),
                ("two parallel calls in one AIMessage", self.parallel_calls),
                ("with_structured_output(pydantic) parses", self.structured_output),
                ("the demo model alone: its own call, then an answer from the ToolMessage", self.demo_alone_tool_loop),
                ("the demo model alone: with_structured_output fills the request's values",
                 self.demo_alone_structured_output),
            ]:
                self.check(name, fn)
        finally:
            self.server.kill()
        return self.summary("langchain checks", self.server)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="qatserve-langchain-test-") as tmp:
        return LangchainSuite(os.path.abspath(sys.argv[1]), tmp).run()


if __name__ == "__main__":
    sys.exit(main())
