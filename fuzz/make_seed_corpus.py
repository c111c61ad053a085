#!/usr/bin/env python3
"""Write seed inputs for the libFuzzer targets (plain python3, no packages).

usage: make_seed_corpus.py SEEDS_DIR

Writes SEEDS_DIR/<target>/ for every target in fuzz/:
  safetensors_fuzz     valid safetensors images (several dtypes, a scalar, an empty tensor, an I64 at an odd offset,
                       metadata) and near-valid ones that each break one rule, so the fuzzer starts next to every check
  model_config_fuzz    the preset config.json files from configs/ and an assistant drafter's (tests/fixtures/)
  json_schema_fuzz     JSON Schemas touching every keyword the grammar engine supports (first byte 0 = JSON, 1 = call
                       syntax)
  tool_calls_fuzz      model output with reasoning, calls and content (first byte: chunk size, thought flag)
  openai_request_fuzz  request bodies for each endpoint, Anthropic's Messages too (first byte: endpoint, strict name,
                       template)
  tokenizer_fuzz       texts, id lists and a small tokenizer.json (first byte: mode)
  chat_template_fuzz   conversations with tools, calls and results (first byte: options), and both templates' text
  http_request_fuzz    whole HTTP requests to every route (fuzz/make_http_seeds.py)
  multipart_form_fuzz  multipart/form-data uploads: a Content-Type line, then the body (fuzz/make_http_seeds.py)
  image_decode_fuzz    the committed test images, good and bad (tests/data/images/)
  audio_decode_fuzz    the committed test clips of every container (tests/data/audio/)
"""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
         "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def image(header, data=b"", pad=True):
    """File image from a header (dict, or raw str/bytes used as is) and the data buffer."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    if pad:
        header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def tensors(specs, metadata=None):
    """specs: (name, dtype, shape) in file order -> (header dict, data bytes) with contiguous offsets."""
    header = {"__metadata__": metadata} if metadata is not None else {}
    offset = 0
    for name, dtype, shape in specs:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return header, bytes((i * 37 + 11) & 0xFF for i in range(offset))


def seeds():
    h, d = tensors([("w", "BF16", [4, 8]), ("s", "BF16", [4, 1])], {"format": "pt"})
    yield "valid_bf16", image(h, d)
    h2, d2 = tensors([("a.weight_packed", "I32", [2, 4]), ("a.weight_scale", "BF16", [2, 1]),
                      ("a.weight_shape", "I64", [2])], {"format": "pt"})
    yield "valid_w4a16_unaligned_i64", image(h2, d2)  # the I64 starts at byte 36
    h3, d3 = tensors([(f"t{i}", dt, [3]) for i, dt in enumerate(SIZES)])
    yield "valid_every_dtype", image(h3, d3)
    h4, d4 = tensors([("scalar", "F32", []), ("empty", "F16", [0, 5]), ("b", "BOOL", [1, 1, 1])])
    yield "valid_scalar_empty", image(h4, d4)
    yield "valid_empty_header", image({})
    yield "valid_only_metadata", image({"__metadata__": {"format": "pt", "k": "v"}})
    # Near-valid: each breaks one rule.
    yield "bad_truncated", image(h, d)[:-3]
    yield "bad_trailing", image(h, d) + b"\0\0"
    yield "bad_short", b"\x10\0\0\0"
    yield "bad_header_len", struct.pack("<Q", 1 << 40) + b"{}"
    yield "bad_not_object", image("[1,2,3]")
    yield "bad_not_json", image('{"w":{"dtype":"BF16",')
    yield "bad_utf8", image(b'{"\xc3\x28":1}')
    yield "bad_duplicate", image('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                 '"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"ab")
    yield "bad_dtype", image({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, b"ab")
    yield "bad_negative_shape", image('{"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}}', b"ab")
    yield "bad_float_shape", image('{"w":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}', b"ab")
    yield "bad_length", image({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8))
    yield "bad_overlap", image({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, bytes(6))
    yield "bad_gap", image({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                            "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}}, bytes(5))
    yield "bad_not_at_zero", image({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, bytes(3))
    yield "bad_overflow", image({"a": {"dtype": "I64", "shape": [1 << 62, 1 << 62, 0], "data_offsets": [0, 0]}})
    yield "edge_zero_dim_big", image({"a": {"dtype": "U8", "shape": [1 << 62, 2, 0], "data_offsets": [0, 0]}})
    yield "bad_metadata", image({"__metadata__": {"format": 1}})
    yield "bad_offsets", image('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}', b"a")


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150}},
     "required": ["name"], "additionalProperties": False},
    {"type": "array", "items": {"type": ["number", "null"]}, "minItems": 1, "maxItems": 4},
    {"prefixItems": [{"const": "a"}, {"enum": [1, "b", None, True]}], "items": False},
    {"anyOf": [{"type": "string", "pattern": "^[a-z]{2,5}(x|y)*\\d?$"}, {"type": "boolean"}]},
    {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"},
               {"type": "string", "format": "email"}, {"type": "string", "format": "date"}]},
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"},
    {"type": "number", "exclusiveMinimum": -1.5, "exclusiveMaximum": 2.25},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"definitions": {"x": {"type": "string"}}, "allOf": [{"$ref": "#/definitions/x"}]},
]


def schema_seeds():
    for i, schema in enumerate(SCHEMAS):
        for syntax in (0, 1):
            yield f"schema{i}-{syntax}", bytes([syntax]) + json.dumps(schema).encode()


def config_seeds():
    names = sorted(n for n in os.listdir(os.path.join(ROOT, "configs")) if n.endswith(".json"))
    for n in names:
        with open(os.path.join(ROOT, "configs", n), "rb") as f:
            yield n[:-len(".json")], f.read()
    # An assistant drafter's config (model_type gemma4_assistant, the ordered-embeddings head).
    with open(os.path.join(ROOT, "tests", "fixtures", "assistant_e2b_ordered", "bf16", "config.json"), "rb") as f:
        yield "assistant_e2b_ordered", f.read()


MODEL_OUTPUTS = [
    '<|channel>thought\nThe user wants the weather.<channel|>Let me check.<|tool_call>call:get_weather'
    '{city:<|"|>Paris<|"|>,days:3,metric:true,extra:None}<tool_call|>',
    '<|tool_call>call:f{a:[1,2.5,-3e+16],b:{<|"|>k<|"|>:<|"|>v<|"|>}}<tool_call|><|tool_call>call:g{}<tool_call|>',
    'Plain answer with a broken call <|tool_call>call:f{a:<tool_call|> and <turn|> after.',
]

GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"},
        "days": {"type": ["integer", "null"], "minimum": 1},
        "unit": {"type": "string", "enum": ["C", "F"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}}},
        "required": ["city"]}}}
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "text", "text": "Now."}]},
    {"role": "assistant", "content": None, "reasoning_content": "Call the tool.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2, "tags": ["a"]}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "  It is 21 degrees.  "},
    {"role": "user", "content": "Thanks <|turn> \u00a0"},
]
REQUESTS = [  # (endpoint, body)
    # Media parts: a data URL and base64 audio (read by the non-strict models, refused by the strict ones).
    (0, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]}),
    (0, {"model": "demo", "messages": CONVERSATION, "tools": [GET_WEATHER], "tool_choice": "auto",
         "parallel_tool_calls": False, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "n": 2,
         "seed": 7, "stop": ["\n\n", "END"], "logprobs": True, "top_logprobs": 3, "stream": True,
         "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": True}}),
    (0, {"messages": [{"role": "user", "content": "Name a colour."}], "tools": [GET_WEATHER],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "reasoning_effort": "low"}),
    (0, {"messages": [{"role": "developer", "content": "JSON only."}, {"role": "user", "content": "Hi"}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema":
                             {"type": "object", "properties": {"a": {"type": "integer"}}}}},
         "max_completion_tokens": 8, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
         "min_p": 0.1, "stop_token_ids": [106], "ignore_eos": False, "add_generation_prompt": True,
         "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}}),
    (0, {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"},
         "return_tokens_as_token_ids": True, "logprobs": False}),
    (1, {"model": "demo", "prompt": "Once upon a time", "max_tokens": 5, "logprobs": 2, "echo": False,
         "suffix": "", "best_of": 1, "stop": "\n", "temperature": 0}),
    (1, {"prompt": [[2, 100, 200, 300]], "max_tokens": 3, "stream": True}),
    (2, {"prompt": "Hello <|turn> world", "add_special_tokens": False}),
    (2, {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True}),
    (3, {"tokens": [2, 100, 4095, 105]}),
    # Anthropic's Messages (bit 16; with bit 1, count_tokens): every block kind, tools, thinking.
    (16, {"model": "demo", "max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call it.", "signature": "s"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "offline"}]}]}],
         "tools": [{"name": "get_weather", "description": "Weather",
                    "input_schema": GET_WEATHER["function"]["parameters"]}],
         "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
         "thinking": {"type": "enabled", "budget_tokens": 1024}, "stop_sequences": ["END"], "temperature": 0.5,
         "top_k": 5, "top_p": 0.9, "metadata": {"user_id": "u"}, "stream": True}),
    (17, {"messages": [{"role": "user", "content": "Hi"}], "tools": [{"name": "t", "input_schema": {"type": "object"}}],
          "tool_choice": {"type": "tool", "name": "t"}, "thinking": {"type": "disabled"}}),
    # POST /v1/responses (endpoint bit 32): items of every kind, and the seeded store's function call continued.
    (32, {"model": "demo", "instructions": "Be brief.", "reasoning": {"effort": "high"}, "max_output_tokens": 8,
          "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
              "city": {"type": "string"}}}, "strict": True}], "tool_choice": {"type": "function", "name": "get_weather"},
          "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                                   "text": "call it"}]},
                    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}]}),
    (32, {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "boolean"}}}, "strict": True}}, "temperature": 0, "store": False}),
    (32, {"previous_response_id": "resp_seed", "input": [{"type": "function_call_output", "call_id": "call_seed",
                                                          "output": [{"type": "input_text", "text": "rain"}]}]}),
]


def request_seeds():
    for i, (endpoint, body) in enumerate(REQUESTS):
        for options in (0, 8 | 4):  # early template; later template with a strict model name
            yield f"request{i}-{options}", bytes([endpoint | options]) + json.dumps(body).encode()


# A tokenizer.json using every feature the loader supports, small enough to mutate.
SMALL_TOKENIZER = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [
        {"id": 0, "content": "<pad>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True},
        {"id": 8, "content": "<|turn>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False,
         "special": True},
        {"id": 9, "content": "ab", "single_word": True, "lstrip": False, "rstrip": False, "normalized": True,
         "special": False}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "\u2581"}, "behavior": "MergedWithNext", "invert": False}]},
    "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
              "vocab": {"<pad>": 0, "<unk>": 1, "a": 2, "b": 3, "\u2581": 4, "\u2581a": 5, "<0x41>": 6, "<0xC3>": 7},
              "merges": [["\u2581", "a"]]},
}


def tokenizer_seeds():
    texts = ["Hello world", "  two  spaces\n\ttab", "<|turn>user\nHi<turn|>\n<|tool_call>call:f{}<tool_call|>",
             "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600", "\u2581already", "<bos><eos><unk><mask>"]
    for i, text in enumerate(texts):
        yield f"text{i}", b"\0" + text.encode()
    yield "text-invalid-utf8", b"\0ab\xc3(\xff\xe2\x82"
    ids = [2, 105, 100, 4095, 106, 3, 0x120, 0x1C3, 0x1A9, 99999, -1]  # specials, byte tokens, out of range
    yield "ids", b"\1" + struct.pack(f"<{len(ids)}i", *ids)
    yield "tokenizer-json", b"\2" + json.dumps(SMALL_TOKENIZER).encode()


def chat_seeds():
    tools = [{"name": "get_weather", "description": "Weather", "parameters": GET_WEATHER["function"]["parameters"]},
             {"name": "odd", "parameters": {"type": "object", "properties": {"x": {"type": "string", "enum": [1]}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "thinking <|channel>x<channel|>",
         "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2.5, None, True]}},
                        {"id": "c2", "name": "odd", "arguments": "raw string"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "zz", "name": "odd", "content": "{}"},
        {"role": "assistant", "content": "<|channel>thought\nhidden<channel|> Sunny. "},
        {"role": "assistant", "content": "More."},
        {"role": "user", "content": "\u3000 ok \u2029"},
    ]
    for options in (0b0011, 0b0111, 0b0010, 0b1101, 0b11111010):
        conversation = json.dumps({"messages": messages, "tools": tools}).encode()
        yield f"conversation-{options}", bytes([options, 0xFF]) + conversation
    for name in ("configs/demo-tokenizer/chat_template.jinja",
                 "tests/data/gemma4-tokenizer/google-gemma-4-31B-it.from-llamacpp-fork.jinja"):
        with open(os.path.join(ROOT, name), "rb") as f:
            yield "template-" + os.path.basename(name), b"\xff" + f.read()


TARGETS = {
    "safetensors_fuzz": lambda: ((n + ".safetensors", d) for n, d in seeds()),
    "model_config_fuzz": config_seeds,
    "json_schema_fuzz": schema_seeds,
    "tool_calls_fuzz": lambda: ((f"output{i}-{b}", bytes([b]) + t.encode())
                                for i, t in enumerate(MODEL_OUTPUTS) for b in (0x03, 0x80 | 0x0F)),
    "openai_request_fuzz": request_seeds,
    "tokenizer_fuzz": tokenizer_seeds,
    "chat_template_fuzz": chat_seeds,
}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def files_in(*folders):
    """The files of these repository folders as seeds."""
    def seeds():
        for folder in folders:
            path = os.path.join(REPO, folder)
            for name in sorted(os.listdir(path)):
                if os.path.isfile(os.path.join(path, name)):
                    with open(os.path.join(path, name), "rb") as f:
                        yield name, f.read()
    return seeds


def http_seeds():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_http_seeds
    return make_http_seeds.seeds().items()


def multipart_seeds():
    """multipart_form_fuzz: a Content-Type line, then the body."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_http_seeds
    content_type = f"multipart/form-data; boundary={make_http_seeds.BOUNDARY}\n".encode()
    yield "form", content_type + make_http_seeds.multipart_body({"model": "m", "language": "en"})
    yield "quoted_boundary", (b'multipart/form-data; boundary="a b"\n--a b\r\nContent-Disposition: form-data; '
                              b'name="x"; filename="q\\"uote.wav"\r\n\r\n1\r\n--a b--')


TARGETS.update({
    "http_request_fuzz": http_seeds,
    "multipart_form_fuzz": multipart_seeds,
    "image_decode_fuzz": files_in("tests/data/images", "tests/data/images/bad"),
    "audio_decode_fuzz": files_in("tests/data/audio"),
})


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for target, make in TARGETS.items():
        out = os.path.join(sys.argv[1], target)
        os.makedirs(out, exist_ok=True)
        count = 0
        for name, data in make():
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
            count += 1
        print(f"{count} seeds in {out}")


if __name__ == "__main__":
    main()
