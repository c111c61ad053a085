#!/usr/bin/env python3
"""make_chat_golden.py [--templates DIR] [--out FILE] [--tools-out FILE]: render a fixed set of conversations with
Python's jinja2 through two real Gemma 4 chat templates and write tests/golden/chat_gemma4.json (text-only
conversations) and tests/golden/chat_gemma4_tools.json (OpenAI-format histories with tools, tool calls, tool results
and reasoning), the oracles that tests/chat_template_test.cc and tests/chat_tools_test.cc hold the C++ renderer
(src/text/chat_template.cc) and the tool-call parser (src/text/tool_calls.cc) to, byte for byte.

OpenAI-format histories reach the template as vLLM passes them: an assistant message's `function.arguments` JSON
string is parsed into a dict first (vllm/entrypoints/chat_utils.py, `_postprocess_messages`), and `tools` is the
request's list as sent.

The environment is the one Hugging Face transformers builds in `_compile_jinja_template` (an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols, and the raise_exception / tojson /
strftime_now helpers) and the variables `apply_chat_template` passes (messages, tools=None, documents=None,
add_generation_prompt, bos_token='<bos>', enable_thinking). When transformers is importable, every case is also
rendered through transformers' own `render_jinja_template` and must agree.

Each template's text is copied into the golden file, so the C++ test also checks that the dialect it detects from
the text (gemma4_chat_dialect_from_template) is the one that reproduces that template's output.
"""
import argparse
import hashlib
import itertools
import json
import random
import sys
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TEMPLATES = REPO / "tests" / "data" / "gemma4-tokenizer"  # verbatim copies, README.md there
TEMPLATES = {
    # An early copy of Google's template: `<|think|>` without a newline, and an empty thought channel after the
    # generation prompt when thinking is off (what the 12B/26B/31B templates do).
    "gemma4_early": {
        "file": "llamacpp-models-templates-gemma4.jinja",
        "source": "ggml-org/llama.cpp models/templates/gemma4.jinja @ 75f1ba7389067a9f90082515e124c377a1e104b2",
    },
    # A later revision of the 31B template: `<|think|>\n`, no empty thought channel, an open one when thinking is
    # on, and an assistant message right after another one continues the same model turn.
    "gemma4_31b_later": {
        "file": "google-gemma-4-31B-it.from-llamacpp-fork.jinja",
        "source": "CompleteTech-LLC-AI-Research/llama.cpp models/templates/google-gemma-4-31B-it.jinja "
                  "@ ff89113109acfd5d37d9823a0a437ac6c15f8638",
    },
}
BOS = "<bos>"


def msg(role, content):
    return {"role": role, "content": content}


# Every conversation has only role + content: the C++ renderer does not render tools, tool calls or media.
CONVERSATIONS = {
    "single_user": [msg("user", "Hello")],
    "system_user": [msg("system", "You are a helpful assistant."), msg("user", "Hi there")],
    "developer_user": [msg("developer", "Answer in French."), msg("user", "What is the capital of Italy?")],
    "system_only": [msg("system", "You are terse.")],
    "multi_turn": [
        msg("system", "You are a math tutor."),
        msg("user", "What is 2+2?"),
        msg("assistant", "4."),
        msg("user", "And 3+3?"),
        msg("assistant", "6."),
        msg("user", "Thanks! Now 4+4?"),
    ],
    "assistant_history_with_thinking": [
        msg("user", "What is 2+2?"),
        msg("assistant", "<|channel>thought\nThe user wants a sum. 2+2=4.<channel|>The answer is 4."),
        msg("user", "Are you sure?"),
    ],
    "thinking_edge_cases": [
        msg("user", "a"),
        # two thought blocks, text between and around them
        msg("assistant", "  Intro <|channel>thought\nfirst<channel|>middle<|channel>thought\nsecond<channel|> end  "),
        msg("user", "b"),
        # a thought block that never closes: everything from <|channel> on is dropped
        msg("assistant", "kept<|channel>thought\nnever closed"),
        msg("user", "c"),
        # a close marker without an opener is simply removed
        msg("assistant", "before<channel|>after"),
        msg("user", "d"),
        # only thinking: the turn is empty
        msg("assistant", "<|channel>thought\nonly thinking\n<channel|>\n\n"),
        msg("user", "e"),
    ],
    "whitespace_to_trim": [
        msg("system", "\n\n  Be brief.  \n"),
        msg("user", "  \n\tHello   there \t\n "),
        msg("assistant", "\n  Hi!  \n\n"),
        msg("user", "\r\n\x0b\x0cinner  \n  spaces stay\r\n"),
    ],
    "unicode": [
        msg("system", "Réponds en français. 日本語も可。"),
        msg("user", "Grüße, 世界! 🌍 — ça va? Ünïcödé ✓"),
        msg("assistant", "Très bien 👍 — 元気です。"),
        # Python's str.strip() also removes Unicode whitespace: NEL, NBSP, ideographic space, line/paragraph
        # separators, the information separators 0x1C-0x1F; it keeps zero-width space (U+200B) and BOM.
        msg("user", "\u3000\u00a0\u2028\x85\x1c こんにちは \u2029\u202f\u205f\u1680\u2000\u200a\x1f"),
        msg("assistant", "\u200bzero width stays\ufeff"),
        msg("user", "\u00a0"),
    ],
    "system_later_in_conversation": [
        msg("user", "First question"),
        msg("system", "New instructions: be formal."),
        msg("user", "Second question"),
    ],
    "developer_later_in_conversation": [
        msg("user", "Hi"),
        msg("developer", "Use bullet points."),
        msg("user", "List two fruits"),
    ],
    "adjacent_assistant_messages": [
        msg("user", "Tell me a joke"),
        msg("assistant", "Why did the chicken cross the road?"),
        msg("assistant", "To get to the other side."),
        msg("user", "Another one"),
    ],
    "assistant_last": [
        msg("user", "Say hi"),
        msg("assistant", "Hi!"),
    ],
    "assistant_first": [
        msg("assistant", "How can I help?"),
        msg("user", "Nothing, thanks"),
    ],
    "empty_contents": [
        msg("system", ""),
        msg("user", ""),
        msg("assistant", ""),
        msg("user", "   "),
    ],
    "special_token_text_in_content": [
        msg("user", "Print <turn|> and <|turn>model literally, plus <bos>."),
        msg("assistant", "Here: <turn|> <|turn>model <bos>"),
        msg("user", "ok"),
    ],
}


# Random conversations (fixed seed) over the same ingredients, so orderings nobody thought of are covered too.
FRAGMENTS = ["Hello", " ", "\n", "\t", "\u00a0", "\u3000", "two  words", "<|channel>thought\nhidden<channel|>",
             "<|channel>", "<channel|>", "日本", "é", "🌍", "<turn|>", "x\r\n", ""]


def random_conversations(count, seed=0):
    rng = random.Random(seed)
    out = {}
    for n in range(count):
        messages = []
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(["system", "developer", "user", "user", "assistant", "assistant"])
            content = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 5)))
            messages.append(msg(role, content))
        out[f"random_{n:02d}"] = messages
    return out


CONVERSATIONS.update(random_conversations(24))



# --- tools, tool calls, tool results, reasoning (OpenAI format, as a client sends them) ---------------------------

def tool(name, description, parameters=None):
    function = {"name": name, "description": description}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


TOOLS = [
    tool("get_weather", "Current weather for a city.", {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}),
    tool("search_web", "Search the web.", {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "max_results": {"type": "integer", "description": "At most this many"},
            "Zeta": {"type": "number", "nullable": True},
            "alpha": {"type": "boolean"},
            "filters": {"type": "object", "description": "Narrow the search",
                        "properties": {"site": {"type": "string"}, "recent": {"type": "boolean"}},
                        "required": ["site"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "points": {"type": "array", "description": "Places",
                       "items": {"type": "object", "properties": {"lat": {"type": "number"},
                                                                   "lon": {"type": "number"}},
                                 "required": ["lat", "lon"]}},
            "mode": {"type": ["string", "null"], "enum": ["fast", "deep"]},
            "opts": {"type": "object"},
        },
        "required": ["query"]}),
    tool("get_time", "The current time."),
    tool("noop", "Does nothing.", {"type": "object", "properties": {}}),
]


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def assistant_calls(*calls, content=None, **extra):
    return {"role": "assistant", "content": content, "tool_calls": list(calls), **extra}


def tool_result(id_, content, **extra):
    return {"role": "tool", "tool_call_id": id_, "content": content, **extra}


NESTED_ARGS = {"query": "naïve \"quotes\", commas: {braces} 日本 🌍", "max_results": 3, "Zeta": -2.5,
               "alpha": False, "filters": {"site": "example.org", "recent": True, "extra": None},
               "tags": ["a", "b c", ""], "points": [{"lat": 48.85, "lon": 2.35}, {"lat": 1e-05, "lon": 1e+16}],
               "opts": {"Nested": {"deep": [1, [2, [3]]]}, "empty": {}, "list": []}}

TOOL_CONVERSATIONS = {
    "tools_declared": {"tools": TOOLS, "messages": [msg("user", "What's the weather in Paris?")]},
    "tools_with_system": {"tools": TOOLS[:1], "messages": [msg("system", "  You are an agent. "),
                                                          msg("user", "Weather?")]},
    "call_and_result": {"tools": TOOLS, "messages": [
        msg("user", "Weather in Paris?"),
        assistant_calls(call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})),
        tool_result("call_1", '{"temperature": 21, "sky": "sunny"}'),
    ]},
    "call_result_answer_followup": {"tools": TOOLS, "messages": [
        msg("system", "Be helpful."),
        msg("user", "Weather in Paris?"),
        assistant_calls(call("call_1", "get_weather", {"city": "Paris"})),
        tool_result("call_1", "sunny, 21 C"),
        msg("assistant", "It is sunny and 21 C in Paris."),
        msg("user", "And the time?"),
    ]},
    "parallel_calls": {"tools": TOOLS, "messages": [
        msg("user", "Weather in Paris and Rome, and the time"),
        assistant_calls(call("call_a", "get_weather", {"city": "Paris"}),
                        call("call_b", "get_weather", {"city": "Rome", "unit": "fahrenheit"}),
                        call("call_c", "get_time", {})),
        tool_result("call_c", "12:00"),
        tool_result("call_a", "rain"),
        tool_result("call_b", "  sun  "),
    ]},
    "call_without_result": {"tools": TOOLS, "messages": [
        msg("user", "Time?"),
        assistant_calls(call("call_t", "get_time", {})),
    ]},
    "content_and_calls": {"tools": TOOLS, "messages": [
        msg("user", "Search for cats"),
        assistant_calls(call("c1", "search_web", {"query": "cats", "max_results": 2}),
                        content="Let me search. <|channel>thought\nhidden<channel|>"),
        tool_result("c1", "[]"),
        msg("user", "Nothing?"),
    ]},
    "nested_arguments": {"tools": TOOLS, "messages": [
        msg("user", "Search"),
        assistant_calls(call("n1", "search_web", NESTED_ARGS)),
        tool_result("n1", "done"),
    ]},
    "reasoning_before_calls": {"tools": TOOLS, "messages": [
        msg("user", "Old question"),
        assistant_calls(call("old", "get_time", {}), reasoning_content="old thoughts, dropped"),
        tool_result("old", "11:00"),
        msg("assistant", "It was 11."),
        msg("user", "Weather in Oslo?"),
        assistant_calls(call("r1", "get_weather", {"city": "Oslo"}), reasoning_content="I should call get_weather."),
        tool_result("r1", "snow"),
    ]},
    "unknown_tool_call_id": {"tools": TOOLS, "messages": [
        msg("user", "x"),
        assistant_calls(call("known", "get_time", {})),
        tool_result("other", "who am I", name="get_time"),
        tool_result("other2", "nameless"),
    ]},
    "multi_round": {"tools": TOOLS, "messages": [
        msg("user", "Plan a trip"),
        assistant_calls(call("m1", "get_weather", {"city": "Lisbon"})),
        tool_result("m1", "warm"),
        assistant_calls(call("m2", "search_web", {"query": "Lisbon hotels", "alpha": True})),
        tool_result("m2", "Hotel A"),
        msg("assistant", "Lisbon is warm; Hotel A is free."),
        msg("user", "Thanks"),
    ]},
    "tool_history_without_tools": {"tools": None, "messages": [
        msg("user", "Time?"),
        assistant_calls(call("x1", "get_time", {})),
        tool_result("x1", "noon"),
        msg("user", "ok"),
    ]},
}

# Conversations whose last message is the model turn with tool calls: the C++ parser must read back from jinja2's
# rendering exactly the calls the history holds (tests/chat_tools_test.cc).
ROUND_TRIP_KEYS = ["k", "city", "Mixed_Case", "a1", "z", "B", "deep_key"]
ROUND_TRIP_STRINGS = ["", "plain", "with space", "comma, colon: brace} bracket]", "quote \" and \\ backslash",
                      "new\nline\ttab", "日本語 🌍 é", "None", "true", "42", "<|tool_call>"]


def random_value(rng, depth):
    kind = rng.choice(["str", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 3 else []))
    if kind == "str":
        return rng.choice(ROUND_TRIP_STRINGS)
    if kind == "int":
        return rng.choice([0, 1, -7, 2**40, -(2**53)])
    if kind == "float":
        return rng.choice([0.5, -1.25, 1e-05, 1e+16, 1e15, 3.141592653589793, 0.1, -0.0, 123456.789])
    if kind == "bool":
        return rng.choice([True, False])
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(ROUND_TRIP_KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def round_trip_conversations(count, seed=1):
    rng = random.Random(seed)
    out = {}
    for n in range(count):
        calls = [call(f"rt{n}_{i}", rng.choice(["get_weather", "search_web", "f_" + str(i)]),
                      {rng.choice(ROUND_TRIP_KEYS): random_value(rng, 1) for _ in range(rng.randint(0, 4))})
                 for i in range(rng.randint(1, 3))]
        out[f"round_trip_{n:02d}"] = {"tools": None, "messages": [msg("user", "go"), assistant_calls(*calls)]}
    return out


TOOL_CONVERSATIONS.update(round_trip_conversations(20))

# Content as lists of parts, media among them (the bytes are never decoded by the renderer).
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}


def text_part(text):
    return {"type": "text", "text": text}


TOOL_CONVERSATIONS.update({
    "media_parts": {"tools": None, "messages": [
        {"role": "system", "content": [text_part("Be brief."), text_part("Answer in English.")]},
        {"role": "user", "content": [text_part(" What is in "), IMAGE, text_part("and in this one? "), IMAGE]},
        {"role": "assistant", "content": [text_part("A cat <|channel>thought\nhm<channel|>"), text_part(" and a dog.")]},
        {"role": "user", "content": [AUDIO, text_part("Transcribe it, then describe "), IMAGE]},
    ]},
    "media_only": {"tools": None, "messages": [{"role": "user", "content": [IMAGE]}]},
    "text_parts_only": {"tools": None, "messages": [{"role": "user", "content": [text_part("a "), text_part(" b")]}]},
})


def template_messages(messages):
    """The messages as vLLM hands them to the template: tool-call arguments parsed from their JSON strings; in user
    and assistant content lists, image and audio parts as the {"type": "image"} / {"type": "audio"} placeholders
    the template reads; system, developer and tool content lists joined into one text by newlines (the templates
    print those contents whole, a list as its Python repr)."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            arguments = c["function"].get("arguments")
            c["function"]["arguments"] = json.loads(arguments) if arguments else {}
        if isinstance(m.get("content"), list):
            if m["role"] in ("user", "assistant"):
                kinds = {"image_url": "image", "input_audio": "audio"}
                m["content"] = [p if p["type"] == "text" else {"type": kinds[p["type"]]} for p in m["content"]]
            else:
                m["content"] = "\n".join(p["text"] for p in m["content"])
    return out


def hf_environment():
    """transformers' _cached_compile_jinja_template environment, minus the {% generation %} tracker tag
    (which only matters for assistant masks and is unused by these templates)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_plain(template, messages, enable_thinking, add_generation_prompt, tools=None):
    return template.render(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                           bos_token=BOS, enable_thinking=enable_thinking)


def transformers_renderer():
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception as e:  # optional cross-check
        print(f"note: transformers not importable ({e}); jinja2-only golden", file=sys.stderr)
        return None

    def render(text, messages, enable_thinking, add_generation_prompt, tools=None):
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=text, tools=tools,
                                            add_generation_prompt=add_generation_prompt, bos_token=BOS,
                                            enable_thinking=enable_thinking)
        return rendered[0]

    return render


def render_cases(env, via_transformers, templates, conversations, with_tools):
    """Every conversation x thinking on/off x generation prompt on/off through every template; a case the template
    itself rejects (raise/undefined) is recorded with "error" instead of "expected"."""
    cases = []
    for name, text in templates.items():
        template = env.from_string(text)
        for conv, thinking, gen in itertools.product(conversations, (False, True), (True, False)):
            entry = conversations[conv]
            messages = template_messages(entry["messages"]) if with_tools else entry
            tools = entry["tools"] if with_tools else None
            case = {"template": name, "conversation": conv, "enable_thinking": thinking, "add_generation_prompt": gen}
            try:
                case["expected"] = render_plain(template, messages, thinking, gen, tools)
            except (jinja2.exceptions.TemplateError, TypeError) as e:  # TypeError: None + str in the template
                case["error"] = f"{type(e).__name__}: {e}"
            if via_transformers is not None and "expected" in case:
                other = via_transformers(text, messages, thinking, gen, tools)
                if other != case["expected"]:
                    sys.exit(f"{name}/{conv}: transformers renders differently:\n{other!r}\nvs\n{case['expected']!r}")
            cases.append(case)
    return cases


# Model outputs (text after the generation prompt, special tokens kept) that transformers' own Gemma 4 response
# parser (`transformers serve`) reads; tests/chat_tools_test.cc holds text/tool_calls.cc to its reading.
MODEL_OUTPUTS = [
    '<|channel>thought\nThe user wants weather. <b>bold</b><channel|>Let me check.'
    '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>'
    '<|tool_call>call:get_time{}<tool_call|>',
    "  Just an answer, with spaces around.  \n",
    "Answer first<|tool_call>call:search_web{query:<|\"|>a, b: {c}<|\"|>,max_results:3,alpha:false}<tool_call|>",
    '<|tool_call>call:f{n:-1.5e-07,big:1e+16,list:[1,[2,[]],{k:<|"|>v<|"|>}],o:{}}<tool_call|>',
    "<|channel>thought\nonly thinking<channel|>",
    "<|channel>thought\n<channel|>Empty thoughts, then text<turn|>",
    "Text that mentions < and <b> and a<b>c",
]


def transformers_parser():
    """transformers' response parser with the Gemma 4 template `transformers serve` uses, or None."""
    try:
        from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS
        from transformers.utils.chat_parsing import parse_response
    except Exception as e:  # optional reference
        print(f"note: transformers' response parser not importable ({e}); no parse golden", file=sys.stderr)
        return None
    template = next(v for types, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "gemma4" in types)
    return lambda text: parse_response(text, template, prefix="<|turn>model\n")


def parse_cases(cases):
    """Each model output, and each model turn jinja2 rendered from a history's calls, as transformers parses it
    (outputs it cannot parse, e.g. a None argument, which its JSON reading rejects, are left out)."""
    parse = transformers_parser()
    if parse is None:
        return []
    texts = list(MODEL_OUTPUTS)
    for c in cases:
        conv = TOOL_CONVERSATIONS[c["conversation"]]
        if ("expected" in c and not c["add_generation_prompt"] and c["template"] == "gemma4_early"
                and conv["messages"][-1].get("tool_calls") and not c["enable_thinking"]):
            texts.append(c["expected"][c["expected"].rindex("<|turn>model\n") + len("<|turn>model\n"):])
    out = []
    for text in texts:
        try:
            parsed = parse(text)
        except ValueError:
            continue
        out.append({"text": text, "reasoning_content": parsed.get("reasoning_content"),
                    "content": parsed.get("content"),
                    "tool_calls": [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
                                   for t in parsed.get("tool_calls") or []]})
    return out


# Tool declarations a template cannot render: the early template indexes a property's missing 'type'.
TOOL_CONVERSATIONS["property_without_type"] = {
    "tools": [tool("f", "untyped", {"type": "object", "properties": {"x": {"description": "anything"}}})],
    "messages": [msg("user", "hi")]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--templates", type=Path, default=DEFAULT_TEMPLATES)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "chat_gemma4.json")
    ap.add_argument("--tools-out", type=Path, default=REPO / "tests" / "golden" / "chat_gemma4_tools.json")
    args = ap.parse_args()

    env = hf_environment()
    via_transformers = transformers_renderer()
    texts, sources = {}, {}
    for name, info in TEMPLATES.items():
        text = (args.templates / info["file"]).read_text(encoding="utf-8")
        texts[name] = text
        sources[name] = {"source": info["source"], "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}
    header = {
        "generator": "tools/python/make_chat_golden.py",
        "jinja2_version": jinja2.__version__,
        "environment": "ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols) + "
                       "raise_exception/tojson/strftime_now; render(messages, tools, documents=None, "
                       "add_generation_prompt, bos_token='<bos>', enable_thinking)",
        "cross_checked_with_transformers": via_transformers is not None,
    }
    plain = {**header, "templates": sources, "conversations": CONVERSATIONS,
             "cases": render_cases(env, via_transformers, texts, CONVERSATIONS, with_tools=False)}
    plain["environment"] = plain["environment"].replace("messages, tools,", "messages, tools=None,")
    with_tools = {**header, "note": "conversations are OpenAI request bodies' tools and messages; the template got "
                                    "the arguments JSON strings parsed into dicts, as vLLM passes them",
                  "templates": {name: {k: v for k, v in info.items() if k != "text"} for name, info in sources.items()},
                  "conversations": TOOL_CONVERSATIONS,
                  "cases": render_cases(env, via_transformers, texts, TOOL_CONVERSATIONS, with_tools=True)}
    with_tools["parses_by"] = ("transformers.utils.chat_parsing.parse_response with the gemma4 response template of "
                               "transformers.cli.serving.utils (prefix '<|turn>model\\n')")
    with_tools["parses"] = parse_cases(with_tools["cases"])
    for out, golden in ((args.out, plain), (args.tools_out, with_tools)):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {len(golden['cases'])} cases ({len(golden['conversations'])} conversations x thinking on/off x "
              f"generation prompt on/off x {len(TEMPLATES)} templates) to {out}")


if __name__ == "__main__":
    main()
