"""Seed inputs for http_request_fuzz (fuzz/make_seed_corpus.py writes them): whole HTTP requests to every route of
serve, with Content-Length and chunked bodies, HTTP/1.0, Expect: 100-continue, a query string, and OpenAI request bodies
touching the parameters openai_protocol parses.
"""
import json

BODIES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                      "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
                                      "temperature": 0.5, "top_p": 0.9, "top_k": 4, "stop": ["\n"], "seed": 3,
                                      "logprobs": True, "top_logprobs": 2, "logit_bias": {"5": -1}}),
    "chat_tools": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "weather?"}],
                                            "tools": [{"type": "function", "function": {
                                                "name": "get", "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}],
                                            "tool_choice": "required"}),
    "chat_schema": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "array", "items": {"type": "integer"},
                                                                      "maxItems": 3}}},
        "chat_template_kwargs": {"enable_thinking": True}}),
    "completion": ("/v1/completions", {"prompt": [2, 5, 6], "n": 2, "logprobs": 1, "echo": False,
                                       "presence_penalty": 0.5, "frequency_penalty": 0.1, "ignore_eos": True,
                                       "return_tokens_as_token_ids": True}),
    "completion_text": ("/v1/completions", {"prompt": "Once upon", "max_tokens": 8, "min_p": 0.1}),
    "tokenize": ("/tokenize", {"messages": [{"role": "user", "content": "hello"}], "add_generation_prompt": True}),
    "tokenize_prompt": ("/tokenize", {"prompt": "hello world", "add_special_tokens": False}),
    "detokenize": ("/detokenize", {"tokens": [2, 3, 400]}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 4, "system": "be brief", "stream": True,
                                  "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                  "tools": [{"name": "get", "input_schema": {"type": "object"}}],
                                  "tool_choice": {"type": "any"}, "stop_sequences": ["\n"],
                                  "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    "count_tokens": ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hello"}]}),
}


def request(path, body, version="1.1", extra=""):
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


def chunked(path, body):
    data = json.dumps(body).encode()
    half = len(data) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (data[:half], data[half:]))
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"


BOUNDARY = "b0undary"
WAV = (b"RIFF\x2c\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00"
       b"\x02\x00\x10\x00data\x08\x00\x00\x00\x00\x00\x10\x00\x20\x00\x10\x00")


def multipart_body(fields, file_bytes=WAV, filename="clip.wav"):
    """A multipart/form-data body as OpenAI's clients (httpx) write it: the fields, then the file."""
    out = b""
    for name, value in fields.items():
        out += (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n').encode()
    out += (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: audio/wav\r\n\r\n").encode() + file_bytes + f"\r\n--{BOUNDARY}--\r\n".encode()
    return out


def transcription(fields):
    data = multipart_body(fields)
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


def seeds():
    """{file name: request bytes}."""
    seeds = {name: request(path, body) for name, (path, body) in BODIES.items()}
    seeds["chat_chunked"] = chunked(*BODIES["chat"])
    seeds["tokenize_http10_expect"] = request(*BODIES["tokenize"], version="1.0",
                                              extra="Expect: 100-continue\r\nAuthorization: Bearer k\r\n")
    seeds["health"] = b"GET /health?verbose=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    seeds["models"] = b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer sk\r\n\r\n"
    seeds["transcription"] = transcription({"model": "m", "language": "en", "prompt": "so", "temperature": "0.2",
                                            "response_format": "text", "stream": "true"})
    seeds["transcription_bare"] = transcription({})
    seeds["wrong_method"] = b"DELETE /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    return seeds

