#!/usr/bin/env python3
"""Write seed inputs for the libFuzzer targets (plain python3, no packages).

usage: make_seed_corpus.py SAFETENSORS_DIR [CONFIG_DIR [SCHEMA_DIR]]

SAFETENSORS_DIR gets a few valid safetensors images (several dtypes, a scalar, an empty tensor, an I64 at
an odd offset, metadata) and near-valid ones that each break one rule, so the fuzzer starts next to every
check in the parser. CONFIG_DIR, when given, gets the preset config.json files from configs/. SCHEMA_DIR gets JSON
Schemas touching every keyword the grammar engine supports (json_schema_fuzz: first byte 0 = JSON, 1 = call syntax).
"""
import json
import os
import shutil
import struct
import sys

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


def write_schemas(out):
    os.makedirs(out, exist_ok=True)
    for i, schema in enumerate(SCHEMAS):
        for syntax in (0, 1):
            with open(os.path.join(out, f"schema{i}-{syntax}.json"), "wb") as f:
                f.write(bytes([syntax]) + json.dumps(schema).encode())
    print(f"{2 * len(SCHEMAS)} schema seeds in {out}")


def main():
    if len(sys.argv) not in (2, 3, 4):
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    count = 0
    for name, data in seeds():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
        count += 1
    print(f"{count} safetensors seeds in {out}")
    if len(sys.argv) >= 3:
        configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")
        os.makedirs(sys.argv[2], exist_ok=True)
        names = sorted(n for n in os.listdir(configs) if n.endswith(".json"))
        for n in names:
            shutil.copy(os.path.join(configs, n), os.path.join(sys.argv[2], n))
        print(f"{len(names)} config seeds in {sys.argv[2]}")
    if len(sys.argv) == 4:
        write_schemas(sys.argv[3])


if __name__ == "__main__":
    main()
