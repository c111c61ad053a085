#!/usr/bin/env python3
"""scripted_agent.py: a LoRA adapter that makes the demo model act out a fixed agent script, so that the agent
API tests can require exact model-made tool calls, tool-result answers and thoughts on fixed requests (the demo
model's own agent work, tested on held-out names without the adapter, gets 66.7% of held-out calls right, not every
one). It is a forced-output model, not an agent: it knows these conversations only.

The script is a list of OpenAI chat requests, each with the answer the model must write (tool calls, prose after a
tool result, a thought and an answer). The adapter (PEFT LoRA, rank 8 on every attention and MLP linear of
models/gemma4-tiny-qat) is trained until greedy decoding of every scripted prompt, rendered by the checkpoint's
chat template exactly as `qatserve serve` renders the request, writes its answer token for token; the script then
checks that with transformers + PEFT before it writes anything.

    .venv/bin/python tools/python/scripted_agent.py --out tests/fixtures/scripted_agent_lora

tests/server/test_agent_api.py serves it (`serve --lora scripted=DIR`) and sends the same requests (REQUESTS below)
through the `openai` client; tests/server/test_responses_api.py runs the openai-agents SDK on it.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
sys.path.insert(0, str(Path(__file__).resolve().parent))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                         "parameters": {"type": "object", "properties": {}}}}
# The tool as the openai-agents SDK declares `def get_weather(city: Literal["Paris", "Rome", "Tokyo"]) -> str`
# (a strict schema: title, additionalProperties false), for tests/server/test_responses_api.py.
AGENTS_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"properties": {"city": {"enum": ["Paris", "Rome", "Tokyo"], "title": "City", "type": "string"}},
                   "required": ["city"], "title": "get_weather_args", "type": "object",
                   "additionalProperties": False},
    "strict": True}}
AGENTS_INSTRUCTIONS = "Answer with the weather tool."


def user(text):
    return {"role": "user", "content": text}


def calls(*pairs):
    """An assistant message with these (name, arguments) tool calls, ids call_1, call_2, ..."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{k + 1}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for k, (name, args) in enumerate(pairs)]}


def said(text):
    return {"role": "assistant", "content": text}


def tool_result(content, call_id="call_1"):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# (name, request, answer, thought). The request is the body of a chat completion (messages, tools, thinking); the
# answer is the assistant message the model writes; the thought, when given, comes first in the thought channel.
SCRIPT = [
    ("weather", {"messages": [user("What is the weather in Paris?")], "tools": [WEATHER, TIME]},
     calls(("get_weather", {"city": "Paris"})), None),
    ("weather, one tool", {"messages": [user("What is the weather in Rome?")], "tools": [WEATHER]},
     calls(("get_weather", {"city": "Rome"})), None),
    ("time", {"messages": [user("What time is it?")], "tools": [WEATHER, TIME]}, calls(("get_time", {})), None),
    ("two calls", {"messages": [user("Weather in Paris and Rome?")], "tools": [WEATHER, TIME]},
     calls(("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "unit": "celsius"})), None),
    ("no tool fits", {"messages": [user("Hello!")], "tools": [WEATHER, TIME]},
     said("Hello! How can I help you today?"), None),
    ("tool result", {"messages": [user("What is the weather in Paris?"), calls(("get_weather", {"city": "Paris"})),
                                  tool_result("sunny, 21 C")], "tools": [WEATHER, TIME]},
     said("It is sunny in Paris, 21 C."), None),
    ("thinking", {"messages": [user("Think, then answer: what is two and two?")], "thinking": True},
     said("Two and two make four."), "The user asks for a sum. Two and two is four."),
    ("thinking, then a call", {"messages": [user("What is the weather in Tokyo?")], "tools": [WEATHER, TIME],
                               "thinking": True},
     calls(("get_weather", {"city": "Tokyo"})), "The user wants the weather in Tokyo. I will call get_weather."),
    ("agents SDK", {"messages": [{"role": "system", "content": AGENTS_INSTRUCTIONS}, user("What is the weather in Paris?")],
                    "tools": [AGENTS_WEATHER]},
     calls(("get_weather", {"city": "Paris"})), None),
    # The SDK's second turn: the tool's output in the history, the agent's output_type (a Verdict) as the answer.
    ("agents SDK, tool output", {"messages": [{"role": "system", "content": AGENTS_INSTRUCTIONS},
                                              user("What is the weather in Paris?"),
                                              calls(("get_weather", {"city": "Paris"})), tool_result("sunny in Paris")],
                                 "tools": [AGENTS_WEATHER]},
     said('{"sunny":true}'), None),
]
REQUESTS = {name: request for name, request, _, _ in SCRIPT}


def chat_body(name, **extra):
    """The OpenAI chat request for a scripted conversation (model, messages, tools, thinking as the server takes it)."""
    request = REQUESTS[name]
    body = {"messages": request["messages"], **extra}
    if "tools" in request:
        body["tools"] = request["tools"]
    if request.get("thinking"):
        body["chat_template_kwargs"] = {"enable_thinking": True}
    return body


def rendered(renderer, request, answer, thought):
    """(prompt text, target text) as the server renders the request and the template writes the answer."""
    messages, tools, thinking = request["messages"], request.get("tools"), request.get("thinking", False)
    prompt = renderer.render(messages, tools, True, thinking)
    target = renderer.assistant_text(messages, tools, answer)
    if thought is not None:
        target = f"<|channel>thought\n{thought}<channel|>" + target
    return prompt, target


def examples(tokenizer, renderer):
    """(prompt ids, target ids, name) of every scripted conversation."""
    out = []
    for name, request, answer, thought in SCRIPT:
        prompt, target = rendered(renderer, request, answer, thought)
        out.append((tokenizer.encode(prompt, add_special_tokens=False).ids,
                    tokenizer.encode(target, add_special_tokens=False).ids, name))
    return out


def train(model, data, steps, lr):
    """Full-batch AdamW on the answers' tokens (the prompts are input): one padded batch of every conversation."""
    import torch
    import torch.nn.functional as F
    width = max(len(p) + len(t) for p, t, _ in data)
    ids = torch.zeros(len(data), width, dtype=torch.long)
    mask = torch.zeros(len(data), width, dtype=torch.long)
    labels = torch.full((len(data), width), -100)
    for row, (prompt, target, _) in enumerate(data):
        n = len(prompt) + len(target)
        ids[row, :n] = torch.tensor(prompt + target)
        mask[row, :n] = 1
        labels[row, len(prompt) - 1:n - 1] = torch.tensor(target)  # position i predicts token i + 1
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    for step in range(steps):
        opt.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)


def greedy_misses(model, data):
    """The scripted conversations whose greedy continuation is not their answer (with the end of turn)."""
    import torch
    misses = []
    with torch.no_grad():
        for prompt, target, name in data:
            seq = list(prompt)
            for _ in range(len(target)):
                seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
            if seq[len(prompt):] != target:
                misses.append(name)
    return misses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer

    from agent_data import Renderer
    from gemma4_fixture_run import load_model

    torch.manual_seed(args.seed)
    data = examples(Tokenizer.from_file(str(MODEL / "tokenizer.json")), Renderer(MODEL / "chat_template.jinja"))
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"])
    model = get_peft_model(load_model(MODEL, torch.float32), config)
    start = time.time()
    train(model, data, args.steps, args.lr)
    misses = greedy_misses(model.eval(), data)
    if misses:
        sys.exit(f"after {args.steps} steps greedy decoding still misses: {', '.join(misses)} (nothing written)")
    model.peft_config["default"].base_model_name_or_path = MODEL.name  # not this machine's path
    model.save_pretrained(args.out)
    (args.out / "README.md").unlink(missing_ok=True)  # PEFT's empty model-card template
    print(f"{len(data)} scripted conversations, greedy exact after {args.steps} steps "
          f"({time.time() - start:.0f} s); adapter in {args.out}")


if __name__ == "__main__":
    main()
