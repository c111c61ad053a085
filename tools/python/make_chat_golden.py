#!/usr/bin/env python3
"""make_chat_golden.py [--templates DIR] [--out FILE]: render a fixed set of conversations with Python's jinja2
through two real Gemma 4 chat templates and write tests/golden/chat_gemma4.json, the oracle that
tests/chat_template_test.cc holds the C++ renderer (src/text/chat_template.cc) to, byte for byte.

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


def render_plain(template, messages, enable_thinking, add_generation_prompt):
    return template.render(messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
                           bos_token=BOS, enable_thinking=enable_thinking)


def transformers_renderer():
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception as e:  # optional cross-check
        print(f"note: transformers not importable ({e}); jinja2-only golden", file=sys.stderr)
        return None

    def render(text, messages, enable_thinking, add_generation_prompt):
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=text,
                                            add_generation_prompt=add_generation_prompt, bos_token=BOS,
                                            enable_thinking=enable_thinking)
        return rendered[0]

    return render


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--templates", type=Path, default=DEFAULT_TEMPLATES)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "chat_gemma4.json")
    args = ap.parse_args()

    env = hf_environment()
    via_transformers = transformers_renderer()
    golden = {
        "generator": "tools/python/make_chat_golden.py",
        "jinja2_version": jinja2.__version__,
        "environment": "ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols) + "
                       "raise_exception/tojson/strftime_now; render(messages, tools=None, documents=None, "
                       "add_generation_prompt, bos_token='<bos>', enable_thinking)",
        "cross_checked_with_transformers": via_transformers is not None,
        "templates": {},
        "conversations": CONVERSATIONS,
        "cases": [],
    }
    for name, info in TEMPLATES.items():
        text = (args.templates / info["file"]).read_text(encoding="utf-8")
        golden["templates"][name] = {"source": info["source"], "sha256": hashlib.sha256(text.encode()).hexdigest(),
                                     "text": text}
        template = env.from_string(text)
        for conv, thinking, gen in itertools.product(CONVERSATIONS, (False, True), (True, False)):
            messages = CONVERSATIONS[conv]
            expected = render_plain(template, messages, thinking, gen)
            if via_transformers is not None:
                other = via_transformers(text, messages, thinking, gen)
                if other != expected:
                    sys.exit(f"{name}/{conv}: transformers renders differently:\n{other!r}\nvs\n{expected!r}")
            golden["cases"].append({"template": name, "conversation": conv, "enable_thinking": thinking,
                                    "add_generation_prompt": gen, "expected": expected})

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(golden['cases'])} cases ({len(CONVERSATIONS)} conversations x thinking on/off x "
          f"generation prompt on/off x {len(TEMPLATES)} templates) to {args.out}")


if __name__ == "__main__":
    main()
