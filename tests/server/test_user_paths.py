#!/usr/bin/env python3
"""The user paths no other test drives, end to end through the real binary, as a user runs them.

usage: test_user_paths.py QATSERVE_BINARY

`qatserve chat` on scripted stdin:
1. `/image PATH` / `/audio PATH` lines before a message (tests/fixtures/mm_e2b_like, f32, greedy, --ignore-eos): the
   turn's prompt token count (chat's "[N prompt tokens" line) equals the length of transformers' processor input
   ids for the same conversation (the image's or clip's soft tokens and markers included) and the text printed is
   transformers' greedy tokens decoded by the `tokenizers` package, for one image, two images, a clip, an image
   and a clip (reference.safetensors of the fixture).
2. A file that does not decode is reported naming its line, and its message is left out of the conversation (the
   next turn's prompt has the fixture's one-image prompt length); an unreadable file and /audio
   to a model without an audio tower are reported too.
3. `--json-schema`: every turn of a two-turn chat on the demo model is JSON that `jsonschema` validates, finished
   by the grammar (finish: stop).
4. `--tools`: every turn is a call `call:NAME{...}` of a declared tool (chat prints no special tokens; the `add`
   calls' arguments validate by `jsonschema`), finished by the grammar, and the first turn's prompt is the
   server's /tokenize count of the same message with those tools (declared in the system turn), more than without.
`qatserve generate --tools --chat`: the ids (--print-ids), decoded by `tokenizers` with special tokens, are one
Gemma 4 call `<|tool_call>call:NAME{...}<tool_call|>`; parsed here (strings between <|"|>), its arguments validate
against the tool's parameters and equal the call the server returns (`tool_calls`, the official `openai` client)
for the same message, tools, tool_choice "required" and greedy sampling, with the same prompt token count.
`qatserve serve --assistant models/gemma4-tiny-qat-assistant`: greedy completions and chats (streaming and not)
give exactly the ids and text of `serve` without it; /metrics counts drafts (accepted <= drafted, > 0) under
qatserve's and vLLM's names; a request with "speculative": false drafts nothing.
`qatserve serve --kv-dtype int8`: /health's precision.kv_cache and qatserve_kv_cache_info{dtype} say int8; for the
same --kv-memory the pool holds between 1.6x and 2x bf16's positions (int8 codes and a scale per position and KV
head); greedy ids equal `generate --kv-dtype int8 --print-ids`; where its greedy tokens are the bf16 server's, their
logprobs differ (the cache is really int8) but by little (< 0.25 nats; about 0.05 at most measured).
Image URLs through `serve` (mm_e2b_like, f32, a loopback http.server): an allowed host's image gives the same
greedy ids and prompt tokens as the same image as a data URL (transformers' greedy ids and prompt length), also
through 3 redirects;
4 redirects, a host not on the list, a declared or a streamed body over 20 MiB, and (with '*' on the list) a
loopback address by name or literal, IPv4 or IPv6, are 400s naming the part, the URL and the reason, streaming
too; the refused hosts are never connected to (the loopback server sees no request for them).
Exit status: 0 all passed, 1 a check failed, 77 skipped (no openai / jsonschema / tokenizers package, or a model
or fixture missing).
"""
import json
import re
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_harness import SKIP, Checks, Server, ids_from_logprobs  # noqa: E402 (exits 77 without openai)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
ASSISTANT = ROOT / "models" / "gemma4-tiny-qat-assistant"
MM = ROOT / "tests" / "fixtures" / "mm_e2b_like"
MEDIA = MM / "media"
sys.path.insert(0, str(ROOT / "tools" / "python"))

try:
    import jsonschema
    from tokenizers import Tokenizer
    from check_multimodal_cli import GREEDY_TOKENS, load_file, openai_messages  # noqa: E402
    from make_multimodal_fixtures import cases  # noqa: E402
except ImportError as e:
    print(f"user paths test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

MEDIA_LIMIT = 20 << 20  # bytes of one media item, data URL or fetched (docs/multimodal.md: "Image URLs")
THREADS = ("--threads", "2")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 16},
                                  "unit": {"type": "string", "enum": ["c", "f"]}}}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                  "b": {"type": "integer", "minimum": 0, "maximum": 99}}}}}
TOOL_PROMPT = "What is the weather in Paris?"
PASSAGE = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
           "want of a wife.")
PROMPTS = [PASSAGE + "\n" + PASSAGE[:50], "Hello", "Once upon a time"]
MAX_TOKENS = 32
SPEED_LINE = re.compile(r"^\[(\d+) prompt tokens, [^;]*; (\d+) generated, [^;]*; finish: (\w+)", re.M)


def run(args, stdin=None):
    r = subprocess.run(["nice", *map(str, args)], input=stdin, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (args, r.returncode, r.stderr[-3000:])
    return r


def turns(stderr):
    """(prompt tokens, generated tokens, finish) of every turn chat or generate ran."""
    return [(int(p), int(g), f) for p, g, f in SPEED_LINE.findall(stderr)]


def chat_outputs(stdout, prompts):
    """The text of each turn: chat prints "> " before reading every line (media commands and the final EOF too)."""
    assert stdout.startswith("> " * prompts), stdout
    return stdout[2 * prompts:]


# ---- Gemma 4 tool calls as the chat template writes them: call:NAME{key:value,...}, strings between <|"|> ----------
QUOTE = '<|"|>'


def parse_gemma_call(text):
    """`<|tool_call>call:NAME{...}<tool_call|>` -> (NAME, arguments as Python values); asserts it is exactly one."""
    m = re.fullmatch(r"<\|tool_call>call:([A-Za-z_][\w.-]*)(\{.*\})<tool_call\|>", text, re.S)
    assert m, text
    value, end = parse_value(m.group(2), 0)
    assert end == len(m.group(2)), text
    return m.group(1), value


def parse_value(s, i):
    if s.startswith(QUOTE, i):
        end = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE):end], end + len(QUOTE)
    if s[i] in "{[":
        close, out = ("}", {}) if s[i] == "{" else ("]", [])
        i += 1
        while s[i] != close:
            if close == "}":
                colon = s.index(":", i)
                key = s[i:colon]
                assert re.fullmatch(r"[A-Za-z_]\w*", key), (s, i)
                out[key], i = parse_value(s, colon + 1)
            else:
                v, i = parse_value(s, i)
                out.append(v)
            if s[i] == ",":
                i += 1
        return out, i + 1
    m = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null").match(s, i)
    assert m, (s, i)
    return json.loads(m.group(0)), m.end()


def tool_of(tools, name):
    found = [t["function"] for t in tools if t["function"]["name"] == name]
    assert found, (name, tools)
    return found[0]


# ---- a loopback image host ------------------------------------------------------------------------------------------
class MediaHandler(BaseHTTPRequestHandler):
    """/img/NAME: a fixture image; /hop/N/NAME: N redirects, then it; /declared-big: a Content-Length over the
    limit; /streamed-big: a chunked body over the limit; anything else 404. Every path asked for is recorded."""
    seen = []

    def do_GET(self):
        MediaHandler.seen.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[0] == "img" and len(parts) == 2 and (MEDIA / parts[1]).is_file():
            body = (MEDIA / parts[1]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif parts[0] == "hop" and len(parts) == 3:
            left = int(parts[1])
            self.send_response(302)
            self.send_header("Location", f"/hop/{left - 1}/{parts[2]}" if left > 1 else f"/img/{parts[2]}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif parts[0] == "declared-big":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(MEDIA_LIMIT + 1))
            self.end_headers()  # no body: the fetch must refuse on the header alone
        elif parts[0] == "streamed-big":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = (MEDIA / "odd_45x71.png").read_bytes().ljust(1 << 20, b"\0")
            try:
                for _ in range(MEDIA_LIMIT // len(chunk) + 2):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):  # the fetch stopped reading at the limit
                pass
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args):  # quiet
        pass


class UserPaths(Checks):
    def __init__(self, binary, workdir, base_port):
        super().__init__()
        self.binary, self.workdir, self.port = binary, Path(workdir), base_port
        self.ref = load_file(str(MM / "reference.safetensors"))
        self.conversations = cases(None, None, True)
        self.mm_tokenizer = Tokenizer.from_file(str(MM / "bf16" / "tokenizer.json"))
        self.tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
        self.last_server = None

    def file(self, name, value):
        path = self.workdir / name
        path.write_text(json.dumps(value))
        return path

    def chat(self, model, lines, *flags):
        return run([self.binary, "chat", "--model", model, *flags], stdin="".join(line + "\n" for line in lines))

    # ---- chat: images and audio -----------------------------------------------------------------------------------
    def chat_media_is_transformers(self):
        for case in ["image_odd", "two_images", "audio", "audio_image"]:
            (message,) = self.conversations[case]
            lines = [f"/{p['type']} {MEDIA / (p['name'] + ('.png' if p['type'] == 'image' else '.wav'))}"
                     for p in message["content"] if p["type"] != "text"]
            lines += [p["text"] for p in message["content"] if p["type"] == "text"]
            r = self.chat(MM / "bf16", lines, "--precision", "f32", "--temperature", "0", "--max-tokens",
                          GREEDY_TOKENS, "--ignore-eos")
            assert r.stderr.count("attached to the next message]") == len(lines) - 1, r.stderr
            want_tokens = len(self.ref[f"{case}.input_ids"])
            assert turns(r.stderr) == [(want_tokens, GREEDY_TOKENS, "length")], (case, turns(r.stderr), want_tokens)
            want_text = self.mm_tokenizer.decode(self.ref[f"{case}.greedy_f32"].tolist(), skip_special_tokens=False)
            assert chat_outputs(r.stdout, len(lines)) == want_text + "> ", (case, r.stdout, want_text)
            print(f"  {case}: {want_tokens} prompt tokens (transformers' processor: {want_tokens}), "
                  f"greedy text = transformers'")

    def chat_bad_media_is_left_out(self):
        odd = MEDIA / "odd_45x71.png"
        r = self.chat(MM / "bf16", [f"/image {ROOT / 'README.md'}", "Describe this.", "/audio /nonexistent.wav",
                                    f"/image {odd}", "Describe this."],
                      "--precision", "f32", "--temperature", "0", "--max-tokens", GREEDY_TOKENS, "--ignore-eos")
        assert f"/image {ROOT / 'README.md'}: not a PNG, JPEG, WebP or GIF image" in r.stderr, r.stderr
        assert "/audio /nonexistent.wav: /nonexistent.wav: cannot read" in r.stderr, r.stderr
        # one turn ran, and its prompt is the one-image conversation's: the failed message is not in the history
        assert turns(r.stderr) == [(len(self.ref["image_odd.input_ids"]), GREEDY_TOKENS, "length")], r.stderr
        no_tower = self.chat(MODEL, [f"/audio {MEDIA / 'chirp_0.6s.wav'}", "Hi"], "--max-tokens", 4)
        assert "chirp_0.6s.wav: this model has no audio tower" in no_tower.stderr, no_tower.stderr
        assert [t[0] for t in turns(no_tower.stderr)] == [self.text_prompt_tokens(["Hi"])], no_tower.stderr

    def text_prompt_tokens(self, contents, tools=None):
        """The server's /tokenize count of one user message (as chat's first turn), on the plain server."""
        body = {"messages": [{"role": "user", "content": c} for c in contents]}
        if tools:
            body["tools"] = tools
        status, t = self.plain.json("POST", "/tokenize", body)
        assert status == 200, t
        return t["count"]

    # ---- chat: constrained outputs --------------------------------------------------------------------------------
    def chat_json_schema(self):
        schema = self.file("schema.json", SCHEMA)
        r = self.chat(MODEL, ["Tell me about a person.", "Another one please."], "--temperature", "0",
                      "--max-tokens", 200, "--json-schema", schema)
        out, documents = chat_outputs(r.stdout, 1), []
        for _ in range(2):  # each turn's JSON document, then "> " for the next line
            doc, end = json.JSONDecoder().raw_decode(out)
            assert out[end:end + 2] == "> ", out
            documents.append(doc)
            out = out[end + 2:]
        assert out == "", r.stdout
        for doc in documents:
            jsonschema.validate(doc, SCHEMA)
        assert [f for _, _, f in turns(r.stderr)] == ["stop", "stop"], r.stderr
        print(f"  {documents}")

    def chat_tools(self):
        tools = [WEATHER, ADD]
        r = self.chat(MODEL, [TOOL_PROMPT, "And 2 plus 3?"], "--temperature", "0", "--max-tokens", 200,
                      "--tools", self.file("tools.json", tools))
        spans = turns(r.stderr)
        assert [f for _, _, f in spans] == ["stop", "stop"], r.stderr
        # chat prints the text without special tokens: call:NAME{...} per turn, strings unquoted
        calls = re.findall(r"call:([A-Za-z_]\w*)\{", chat_outputs(r.stdout, 1))
        assert len(calls) == 2 and all(name in ("get_weather", "add") for name in calls), r.stdout
        assert re.fullmatch(r"(call:\w+\{[^{}]*\}> ){2}", chat_outputs(r.stdout, 1)), r.stdout
        with_tools = self.text_prompt_tokens([TOOL_PROMPT], tools)
        assert spans[0][0] == with_tools > self.text_prompt_tokens([TOOL_PROMPT]), (spans, with_tools)
        # the plain calls' arguments, as this model writes them, still validate (numbers only here)
        for text in re.findall(r"call:add(\{[^{}]*\})", chat_outputs(r.stdout, 1)):
            args, _ = parse_value(text, 0)
            jsonschema.validate(args, ADD["function"]["parameters"])
        print(f"  calls: {calls}; first prompt {spans[0][0]} tokens = /tokenize with the tools")

    # ---- generate --tools = the server's call -------------------------------------------------------------------
    def generate_tools_is_the_servers_call(self):
        tools = [WEATHER]
        r = run([self.binary, "generate", "--model", MODEL, "--chat", "--prompt", TOOL_PROMPT, "--temperature", "0",
                 "--max-tokens", 200, "--tools", self.file("weather.json", tools), "--print-ids"])
        ids = [int(x) for x in r.stdout.strip().split(",")]
        name, args = parse_gemma_call(self.tokenizer.decode(ids, skip_special_tokens=False))
        jsonschema.validate(args, tool_of(tools, name)["parameters"])
        (prompt_tokens, generated, finish), = turns(r.stderr)
        assert (generated, finish) == (len(ids), "stop"), r.stderr

        reply = self.plain.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": TOOL_PROMPT}], tools=tools, tool_choice="required",
            temperature=0, max_tokens=200)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_"), call
        assert (call.function.name, json.loads(call.function.arguments)) == (name, args), (call, name, args)
        assert reply.usage.prompt_tokens == prompt_tokens and reply.usage.completion_tokens == len(ids), reply.usage
        print(f"  {name}({args}): the same call from generate and the server")

    # ---- serve --assistant ----------------------------------------------------------------------------------------
    def greedy(self, server, prompt, extra=None, stream=False):
        """(ids, text) of a greedy completion, ids read back from logprobs."""
        kw = dict(model="m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=1,
                  extra_body={"return_tokens_as_token_ids": True, **(extra or {})})
        client = server.client()
        if not stream:
            c = client.completions.create(**kw).choices[0]
            return ids_from_logprobs(c.logprobs.tokens), c.logprobs.token_logprobs
        tokens, logprobs = [], []
        for chunk in client.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].logprobs:
                tokens += chunk.choices[0].logprobs.tokens
                logprobs += chunk.choices[0].logprobs.token_logprobs
        return ids_from_logprobs(tokens), logprobs

    def chat_text(self, server, prompt, extra=None, stream=False):
        kw = dict(model="m", messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0,
                  extra_body=extra or {})
        if not stream:
            return server.client().chat.completions.create(**kw).choices[0].message.content
        return "".join(ch.choices[0].delta.content or "" for ch in
                       server.client().chat.completions.create(stream=True, **kw) if ch.choices)

    def baseline(self):
        self.plain_ids = {p: self.greedy(self.plain, p) for p in PROMPTS}
        self.plain_chats = {p: self.chat_text(self.plain, p) for p in PROMPTS}

    def assistant_is_plain_greedy(self):
        server = self.assistant
        m0 = server.metrics()
        assert m0["qatserve_spec_decode_draft_tokens_total"] == 0, m0
        for p in PROMPTS:
            assert self.greedy(server, p)[0] == self.plain_ids[p][0], p
            assert self.greedy(server, p, stream=True)[0] == self.plain_ids[p][0], p
            assert self.chat_text(server, p) == self.plain_chats[p], p
            assert self.chat_text(server, p, stream=True) == self.plain_chats[p], p
        m = server.metrics()
        label = '{model_name="gemma4-tiny-qat",engine="0"}'
        drafted = m["qatserve_spec_decode_draft_tokens_total"]
        accepted = m["qatserve_spec_decode_accepted_tokens_total"]
        assert 0 < accepted <= drafted and m["qatserve_spec_decode_drafts_total"] > 0, m
        assert m["vllm:spec_decode_num_draft_tokens_total" + label] == drafted, m
        assert m["vllm:spec_decode_num_accepted_tokens_total" + label] == accepted, m
        assert m["vllm:spec_decode_num_drafts_total" + label] == m["qatserve_spec_decode_drafts_total"], m
        assert abs(m["qatserve_spec_decode_acceptance_rate"] - accepted / drafted) < 1e-9, m
        # opting out drafts nothing and still gives the same ids
        assert self.greedy(server, PROMPTS[0], {"speculative": False})[0] == self.plain_ids[PROMPTS[0]][0]
        assert server.metrics()["qatserve_spec_decode_draft_tokens_total"] == drafted
        print(f"  {accepted} of {drafted} drafted tokens accepted; ids and texts = serve without --assistant")

    # ---- serve --kv-dtype int8 ------------------------------------------------------------------------------------
    def kv_int8_reported_and_used(self):
        int8, plain = self.int8, self.plain
        status, health = int8.json("GET", "/health")
        assert status == 200 and health["precision"]["kv_cache"] == "int8", health
        assert plain.json("GET", "/health")[1]["precision"]["kv_cache"] == "bf16"
        families = int8.metric_families()
        assert [s.labels for s in families["qatserve_kv_cache_info"].samples] == [{"dtype": "int8"}], families
        m8, m16 = int8.metrics(), plain.metrics()
        # The 64 MiB pool holds whole blocks: all of it in bf16 here, all but less than one block in int8.
        block8 = m8["qatserve_kv_cache_total_bytes"] / m8["qatserve_kv_cache_blocks_total"]
        assert m16["qatserve_kv_cache_total_bytes"] == 64 << 20, m16
        assert 0 <= (64 << 20) - m8["qatserve_kv_cache_total_bytes"] < block8, m8
        # int8 codes and an f32 scale per position and KV head against bf16: between 1.6x and 2x the positions
        ratio = m8["qatserve_kv_cache_total_tokens"] / m16["qatserve_kv_cache_total_tokens"]
        assert 1.6 < ratio < 2 and m8["qatserve_kv_cache_blocks_total"] / m16["qatserve_kv_cache_blocks_total"] > 1.6, \
            (m8, m16)

        most_different = 0.0
        for p in PROMPTS:
            ids, logprobs = self.greedy(int8, p)
            status, tok = int8.json("POST", "/tokenize", {"prompt": p})
            cli = run([self.binary, "generate", "--model", MODEL, "--kv-dtype", "int8", "--tokens",
                       ",".join(map(str, tok["tokens"])), "--max-tokens", MAX_TOKENS, "--temperature", "0",
                       "--print-ids"])
            assert ids == [int(x) for x in cli.stdout.strip().splitlines()[-1].split(",")], p
            assert "bf16 activations, int8 KV" in cli.stderr, cli.stderr
            plain_ids, plain_logprobs = self.plain_ids[p]
            same = next((i for i, (a, b) in enumerate(zip(ids, plain_ids)) if a != b), min(len(ids), len(plain_ids)))
            for a, b in zip(logprobs[:same], plain_logprobs[:same]):
                most_different = max(most_different, abs(a - b))
        assert 0 < most_different < 0.25, most_different
        print(f"  int8: {m8['qatserve_kv_cache_total_tokens']:.0f} positions in 64 MiB (bf16: "
              f"{m16['qatserve_kv_cache_total_tokens']:.0f}); largest |logprob difference| from bf16 "
              f"{most_different:.2e}")

    # ---- image URLs through serve ---------------------------------------------------------------------------------
    def url(self, path, host="127.0.0.1"):
        return f"http://{host}:{self.port}{path}"

    def image_request(self, url, stream=False):
        return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                         {"type": "text", "text": "Describe this."}]}],
                "max_tokens": GREEDY_TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": True,
                "return_tokens_as_token_ids": True, "stream": stream}

    def image_ids(self, server, url):
        status, r = server.json("POST", "/v1/chat/completions", self.image_request(url))
        assert status == 200, (url, status, r)
        ids = [int(e["token"].removeprefix("token_id:")) for e in r["choices"][0]["logprobs"]["content"]]
        return ids, r["usage"]["prompt_tokens"]

    def urls_fetched(self):
        server = self.media
        data_url = openai_messages(self.conversations["image_odd"], MEDIA)[0]["content"][0]["image_url"]["url"]
        want = self.image_ids(server, data_url)
        assert want[1] == len(self.ref["image_odd.input_ids"]), want
        assert want[0] == self.ref["image_odd.greedy_f32"].tolist(), want
        before = len(MediaHandler.seen)
        assert self.image_ids(server, self.url("/img/odd_45x71.png")) == want
        assert self.image_ids(server, self.url("/hop/3/odd_45x71.png")) == want
        assert MediaHandler.seen[before:] == ["/img/odd_45x71.png", "/hop/3/odd_45x71.png", "/hop/2/odd_45x71.png",
                                             "/hop/1/odd_45x71.png", "/img/odd_45x71.png"], MediaHandler.seen

    def refused(self, server, url, reason, stream=False):
        status, _, data = server.request("POST", "/v1/chat/completions", self.image_request(url, stream))
        body = json.loads(data)
        message = body["error"]["message"]
        assert status == 400 and body["error"]["type"] == "invalid_request_error", (status, body)
        prefix = f"messages[0].content[0].image_url.url: {url}: "
        assert message.startswith(prefix) and re.match(reason, message[len(prefix):]), (message, reason)
        return message

    def url_refusals(self):
        server = self.media
        self.refused(server, self.url("/hop/4/odd_45x71.png"),
                     re.escape("more than 3 redirects (the last to /img/odd_45x71.png)"))
        before = len(MediaHandler.seen)
        for stream in (False, True):
            self.refused(server, self.url("/img/odd_45x71.png?not-listed", "localhost"),
                         re.escape("the host 'localhost' is not one this server fetches media from"), stream)
        assert len(MediaHandler.seen) == before, MediaHandler.seen[before:]  # never connected
        self.refused(server, self.url("/declared-big"), re.escape(
            f"its Content-Length ({MEDIA_LIMIT + 1}) passes the limit of {MEDIA_LIMIT} bytes"))
        self.refused(server, self.url("/streamed-big"), re.escape(f"its body passes the limit of {MEDIA_LIMIT} bytes"))

    def private_addresses_refused(self):
        server = self.anyhost
        before = len(MediaHandler.seen)
        exact = "is a non-public address \\(loopback\\): only a host the server lists exactly"
        self.refused(server, self.url("/img/odd_45x71.png?literal"), "127\\.0\\.0\\.1 " + exact)
        self.refused(server, self.url("/img/odd_45x71.png?name", "localhost"),
                     r"localhost \((127\.0\.0\.1|::1)\) " + exact, stream=True)
        self.refused(server, self.url("/img/odd_45x71.png?v6", "[::1]"), "::1 " + exact)
        self.refused(server, self.url("/img/odd_45x71.png?mapped", "[::ffff:127.0.0.1]"),
                     "::ffff:127\\.0\\.0\\.1 " + exact)
        assert len(MediaHandler.seen) == before, MediaHandler.seen[before:]  # refused before connecting

    # ---- the run --------------------------------------------------------------------------------------------------
    def start(self, model, name, *flags):
        server = Server(self.binary, model, self.workdir, name, *THREADS, *flags)
        self.last_server = server
        server.wait_ready()
        return server

    def run(self):
        self.check("chat: /image and /audio give transformers' prompt and greedy text", self.chat_media_is_transformers)
        self.check("chat: --json-schema turns validate", self.chat_json_schema)
        servers = []
        try:
            self.plain = self.start(MODEL, "plain", "--kv-memory", "64M")
            servers.append(self.plain)
            self.check("chat: media that fails is reported and left out", self.chat_bad_media_is_left_out)
            self.check("chat: --tools turns are declared tool calls", self.chat_tools)
            self.check("generate --tools: the server's call", self.generate_tools_is_the_servers_call)
            self.check("serve: greedy baseline", self.baseline)
            self.assistant = self.start(MODEL, "assistant", "--assistant", ASSISTANT)
            servers.append(self.assistant)
            self.check("serve --assistant: plain greedy, drafts counted", self.assistant_is_plain_greedy)
            self.int8 = self.start(MODEL, "int8", "--kv-dtype", "int8", "--kv-memory", "64M")
            servers.append(self.int8)
            self.check("serve --kv-dtype int8: reported and used", self.kv_int8_reported_and_used)
            for s in servers:
                assert s.stop() == 0, s.log_text()[-2000:]
            servers = []
            fetch = ("--precision", "f32", "--media-fetch-timeout", "60")
            self.media = self.start(MM / "bf16", "media", *fetch, "--allowed-media-domains", "127.0.0.1")
            servers.append(self.media)
            self.check("serve: image URLs fetched, redirects followed", self.urls_fetched)
            self.check("serve: URL refusals name the part, URL and reason", self.url_refusals)
            self.anyhost = self.start(MM / "bf16", "anyhost", *fetch, "--allowed-media-domains", "*")
            servers.append(self.anyhost)
            self.check("serve: '*' does not reach loopback addresses", self.private_addresses_refused)
        except Exception as e:  # noqa: BLE001 - a server that did not start fails the run
            self.failed.append(f"server start: {e}")
            print(f"FAIL server start\n{e}", flush=True)
        finally:
            for s in servers:
                s.stop()
        print(f"\nuser paths: {len(self.passed)} passed, {len(self.failed)} failed")
        if self.failed and self.last_server is not None:
            print(f"last server log ({self.last_server.log_path}):\n{self.last_server.log_text()[-4000:]}")
        return 1 if self.failed else 0


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    needed = [MODEL / "model.safetensors", MODEL / "tokenizer.json", ASSISTANT / "model.safetensors",
              MM / "bf16" / "model.safetensors", MM / "reference.safetensors", MEDIA / "odd_45x71.png"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        print(f"user paths test skipped: missing {', '.join(missing)}")
        return SKIP
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), MediaHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="qatserve-user-paths-") as tmp:
            return UserPaths(str(Path(sys.argv[1]).resolve()), tmp, httpd.server_address[1]).run()
    finally:
        httpd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
