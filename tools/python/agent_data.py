#!/usr/bin/env python3
"""agent_data.py: synthetic agent conversations for the demo model (tool calls, tool results, JSON answers,
thoughts), rendered by the real Gemma 4 chat template exactly as `qatserve serve` renders a request.

Every example is (prompt text, target text): the prompt is what the server gives the model for an OpenAI request
(jinja2 with transformers' environment, tools declared in the system turn, the generation prompt), the target is
what the model must write after it, ending with `<turn|>`. Kinds:

  call       1-4 tools declared; the request asks for one of them (or two things: two parallel calls); the target
             is the template's own rendering of the assistant's tool calls (arguments copied or derived from the
             request; keys in the template's dictsort order)
  no_call    tools declared, but the request is small talk or about Austen: a prose answer
  result     a call and its `tool` message in the history: a sentence that states the result
  json       an extraction request answered with one JSON object (keys in the schema's declared order, as the
             server's grammar emits them), closed at once
  think      thinking on (`<|think|>` in the system turn): `<|channel>thought\\n...<channel|>`, then the answer or the
             call

Held-out examples (`split="held_out"`) use tools, names, cities and phrasings that no training example uses; the
evaluation (tools/python/eval_agent_demo.py) asks them through the server with the OpenAI request each example
stands for (`request` below), so the model is measured on the API, not on our rendering.
"""
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_chat_golden import hf_environment, template_messages  # noqa: E402

import agent_tools  # noqa: E402
from agent_tools import COLOURS, HELD_OUT, TRAIN, city, distractors, i, b, person, pick_tool, s  # noqa: E402


# --------------------------------------------------------------------------------------------------- rendering
class Renderer:
    """Prompts and targets through the checkpoint's chat template, as the server renders OpenAI requests."""

    def __init__(self, template_path):
        self.template = hf_environment().from_string(Path(template_path).read_text())

    def render(self, messages, tools, generation_prompt, thinking=False):
        return self.template.render(messages=template_messages(messages), tools=tools or None, documents=None,
                                    add_generation_prompt=generation_prompt, bos_token="<bos>",
                                    enable_thinking=thinking)

    def assistant_text(self, messages, tools, assistant):
        """What the template writes for `assistant` after `messages`, without `<|turn>model\\n` and the final
        newline: the model's own output for that turn, ending in `<turn|>`."""
        before = self.render(messages, tools, False)
        after = self.render(messages + [assistant], tools, False)
        assert after.startswith(before), "the template re-rendered earlier turns"
        turn = after[len(before):]
        assert turn.startswith("<|turn>model\n") and turn.endswith("<turn|>\n"), turn
        return turn[len("<|turn>model\n"):-1]


def fill(text, values):
    return text.format(**values)


def call_message(calls):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{k + 1}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for k, (name, args) in enumerate(calls)]}


def sorted_args(args):
    return dict(sorted(args.items()))


def lower_first(text):
    return text[:1].lower() + text[1:]


def thought_for(request):
    """A short thought that restates the request (what the model writes in its thought channel)."""
    return f"The user asks: {lower_first(request)} I will answer briefly."


@dataclass
class Example:
    kind: str
    prompt: str
    target: str
    request: dict      # the OpenAI chat request this example stands for (messages, tools, response_format, ...)
    expect: dict       # what a correct answer holds (calls, result values, JSON object)


class AgentExamples:
    def __init__(self, template_path, split, seed, small_talk=()):
        self.r = Renderer(template_path)
        self.split = split
        self.rng = random.Random(seed)
        self.small_talk = list(small_talk)

    def declared(self, chosen):
        """1-4 tools: the chosen ones plus training tools as distractors (in training sometimes the chosen one's
        sibling first: a tool that differs in one word, so the request's word is the only cue), in a random order."""
        rng = self.rng
        tools = list(chosen)
        if self.split == TRAIN and agent_tools.SIBLING_SHARE and tools[0].sibling and \
                rng.random() < agent_tools.SIBLING_SHARE:
            twin = tools[0].sibling(rng)
            tools += [twin] if twin.name != tools[0].name else []
        tools += distractors(rng, tools, rng.choice([0, 1, 1, 2, 2, 3]))
        rng.shuffle(tools)
        return tools

    def system(self, messages):
        if self.rng.random() < 0.3:
            return [{"role": "system", "content": self.rng.choice(
                ["You are a helpful assistant.", "You can call tools.", "Be brief.", "You are an agent."])}] + messages
        return messages

    def call(self, thinking=False):
        rng = self.rng
        tool = pick_tool(rng, self.split)
        pair = tool.pair_asks and rng.random() < 0.2
        if pair:
            a1, a2 = tool.args(rng), tool.args(rng)
            while a2 == a1:
                a2 = tool.args(rng)
            request = rng.choice(tool.pair_asks).format(a1=a1, a2=a2)
            calls = [(tool.name, sorted_args(a1)), (tool.name, sorted_args(a2))]
        else:
            args = tool.args(rng)
            request = fill(rng.choice(tool.asks), args)
            calls = [(tool.name, sorted_args(args))]
        tools = [t.openai() for t in self.declared([tool])]
        messages = self.system([{"role": "user", "content": request}])
        target = self.r.assistant_text(messages, tools, call_message(calls))
        if thinking:
            target = f"<|channel>thought\n{thought_for(request)}<channel|>" + target
        body = {"messages": messages, "tools": tools, "tool_choice": "auto"}
        if thinking:
            body["chat_template_kwargs"] = {"enable_thinking": True}
        return Example("think_call" if thinking else "call", self.r.render(messages, tools, True, thinking), target,
                       body, {"calls": [{"name": nm, "arguments": a} for nm, a in calls]})

    def no_call(self):
        rng = self.rng
        question, answer = rng.choice(self.small_talk)
        tools = [t.openai() for t in self.declared([pick_tool(rng, TRAIN)])]
        messages = self.system([{"role": "user", "content": question}])
        target = self.r.assistant_text(messages, tools, {"role": "assistant", "content": answer})
        return Example("no_call", self.r.render(messages, tools, True), target,
                       {"messages": messages, "tools": tools, "tool_choice": "auto"}, {"calls": []})

    def result(self):
        rng = self.rng
        tool = pick_tool(rng, self.split)
        args = tool.args(rng)
        result = tool.result(rng, args)
        request = fill(rng.choice(tool.asks), args)
        answer = fill(rng.choice(tool.answers), {**args, **result})
        tools = [t.openai() for t in self.declared([tool])]
        messages = self.system([{"role": "user", "content": request}]) + [
            call_message([(tool.name, sorted_args(args))]),
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(result)}]
        target = self.r.assistant_text(messages, tools, {"role": "assistant", "content": answer})
        return Example("result", self.r.render(messages, tools, True), target,
                       {"messages": messages, "tools": tools}, {"mentions": [str(v) for v in result.values()]})

    def json_answer(self):
        rng = self.rng
        sp = self.split
        name, age, place = person(rng, sp), rng.randint(18, 90), city(rng, sp)
        kinds = [
            (["name", "age"], {"name": s("Full name"), "age": i("Age in years")},
             [f"{name} is {age} years old. Give me the name and age as JSON.",
              f"Extract the person: {name}, aged {age}.", f"Return JSON with the name and age of {name}, who is {age}."],
             {"name": name, "age": age}),
            (["name", "city"], {"name": s("Full name"), "city": s("Home city")},
             [f"{name} lives in {place}. Extract the name and city.", f"As JSON: {name} from {place}."],
             {"name": name, "city": place}),
            (["city", "temperature", "sunny"], {"city": s("City"), "temperature": i("Degrees"), "sunny": b("Sunny")},
             [f"It is {age - 50 if age > 50 else age} degrees and sunny in {place}. Give the city, temperature "
              f"and whether it is sunny as JSON."],
             {"city": place, "temperature": age - 50 if age > 50 else age, "sunny": True}),
            (["title", "year"], {"title": s("Book title"), "year": i("Year published")},
             [f"{t} was published in {y}. Give the title and year as JSON." for t, y in
              [rng.choice([("Emma", 1815), ("Persuasion", 1817), ("Mansfield Park", 1814), ("Pride and Prejudice",
                                                                                            1813),
                           ("Sense and Sensibility", 1811), ("Northanger Abbey", 1817)])]],
             None),
            (["name", "age", "member"], {"name": s("Name"), "age": i("Age"), "member": b("Is a member")},
             [f"{name}, {age}, is a member of the club. Extract name, age and member as JSON.",
              f"Record {name} (age {age}), not a member, as JSON." if rng.random() < 0.5 else
              f"{name} is {age} and a member. JSON please."],
             None),
            (["colour", "count"], {"colour": s("Colour", COLOURS), "count": i("How many")},
             [f"I have {age % 9 + 2} {c} bonnets. Give the colour and count as JSON." for c in [rng.choice(COLOURS)]],
             None),
        ]
        order, props, asks, value = rng.choice(kinds)
        request = rng.choice(asks)
        if value is None:  # values read back from the request text
            value = self.values_from(order, request)
        schema = {"type": "object", "properties": props, "required": order, "additionalProperties": False}
        messages = self.system([{"role": "user", "content": request}]) if rng.random() < 0.5 else \
            [{"role": "user", "content": request}]
        text = json.dumps({k: value[k] for k in order})
        target = self.r.assistant_text(messages, None, {"role": "assistant", "content": text})
        fmt = {"type": "json_schema", "json_schema": {"name": "extract", "schema": schema, "strict": True}}
        if rng.random() < 0.15:
            fmt = {"type": "json_object"}
        return Example("json", self.r.render(messages, None, True), target,
                       {"messages": messages, "response_format": fmt}, {"json": {k: value[k] for k in order},
                                                                        "schema": schema})

    @staticmethod
    def values_from(order, request):
        out = {}
        for k in order:
            if k == "title":
                out[k] = re.match(r"(.*) was published", request)[1]
            elif k == "year":
                out[k] = int(re.search(r"in (\d+)", request)[1])
            elif k == "name":
                out[k] = re.match(r"(?:Record )?([A-Z][a-z]+ [A-Z][a-z]+)", request)[1]
            elif k == "age":
                out[k] = int(re.search(r"(\d+)", request)[1])
            elif k == "member":
                out[k] = "not a member" not in request
            elif k == "colour":
                out[k] = next(c for c in COLOURS if f" {c} " in request)
            elif k == "count":
                out[k] = int(re.search(r"have (\d+)", request)[1])
        return out

    def think(self):
        rng = self.rng
        if rng.random() < 0.4:
            return self.call(thinking=True)
        question, answer = rng.choice(self.small_talk)
        messages = [{"role": "user", "content": question}]
        target = (f"<|channel>thought\n{thought_for(question)}<channel|>" +
                  self.r.assistant_text(messages, None, {"role": "assistant", "content": answer}))
        return Example("think", self.r.render(messages, None, True, thinking=True), target,
                       {"messages": messages, "chat_template_kwargs": {"enable_thinking": True}}, {"answer": answer})

    MIX = (("call", 0.36), ("no_call", 0.10), ("result", 0.22), ("json", 0.20), ("think", 0.12))

    def sample(self):
        x, acc = self.rng.random(), 0.0
        for kind, share in self.MIX:
            acc += share
            if x < acc:
                return getattr(self, {"json": "json_answer"}.get(kind, kind))()
        return self.call()


def main():
    import argparse
    ap = argparse.ArgumentParser(description="print a few rendered examples")
    ap.add_argument("--template", default=str(Path(__file__).resolve().parents[2] / "models" / "gemma4-tiny-qat" /
                                              "chat_template.jinja"))
    ap.add_argument("--split", default=TRAIN)
    ap.add_argument("-n", type=int, default=6)
    a = ap.parse_args()
    gen = AgentExamples(a.template, a.split, 1, small_talk=[("Hello", "Hello! How can I help you today?")])
    for _ in range(a.n):
        e = gen.sample()
        print(e.kind, repr(e.prompt[-160:]), "=>", repr(e.target))


if __name__ == "__main__":
    main()
