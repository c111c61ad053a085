"""Property test of the grammar engine against the jsonschema package (an external validator).

Generates random JSON Schemas over the keywords the engine covers, has the C++ driver (tests/constrain_walk) walk
random tokens through each schema's masks, and checks that every output parses with json.loads and validates
with jsonschema's Draft 2020-12 validator (formats checked). Tool calls: random tools, outputs in Gemma 4's call
syntax parsed here independently and each call's arguments validated against its tool's parameters. Schemas
with unsupported keywords must be rejected naming the keyword and its JSON pointer.

End to end (--e2e-qatserve BIN --e2e-model DIR): random schemas through `qatserve generate --json-schema` on a
random-weight synthetic model at several temperatures and seeds; every output that ends (finish "stop") must
validate, and at least half must end (those cut by "length" are counted and reported).

Bounded schemas (a weak model must not run away: every output ends within a length the schema bounds): random
schemas without unbounded strings or arrays (objects of integers, numbers, booleans, enums, nested objects, strings
with maxLength, arrays with maxItems), property names declared out of sorted order. Their longest document is
derived here from the schema and the literal limits (integers fit 64 bits: 20 bytes with the sign; numbers 15
integer, 15 fraction and 2 exponent digits: 35 bytes; a string character at most 6 bytes, a \\uXXXX escape; one
space after ',' and ':'); a token is at least one byte. Random walks that pick any allowed token, and `qatserve
generate` at temperature 1 with many seeds
and max_tokens = that length + 1 (the end token), must EVERY time end ("stop") with a document that validates and
writes each object's properties in the schema's declared order (tool calls: sorted, as Gemma's template writes).

usage: check_constrained_outputs.py WALK_BINARY TOKENIZER_JSON [--schemas N] [--seeds K] [--seed S]
                                    [--e2e-qatserve BIN --e2e-model DIR --e2e-schemas N]
                                    [--bounded-schemas N --bounded-seeds K]
exit 0 when everything holds, 1 with the failures listed.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

import jsonschema

PATTERNS = [r"^[a-z]{2,5}$", r"^\d{3}-\d{4}$", r"^(foo|bar)+$", r"ab+c", r"^[A-Z][a-z]*( [A-Z][a-z]*)?$",
            r'^[^"\\]{0,4}$', r"^\w+@\w+\.com$", r"x.y", r"^a?b*$", r"^[0-9a-f]{4}$|^none$", r"^\S+\s\S+$"]
FORMATS = ["date", "date-time", "uuid", "email"]


def gen_string(r):
    kind = r.random()
    s = {"type": "string"}
    if kind < 0.3:
        lo = r.randint(0, 4)
        s["minLength"] = lo
        if r.random() < 0.7:
            s["maxLength"] = lo + r.randint(0, 6)
    elif kind < 0.55:
        s["pattern"] = r.choice(PATTERNS)
    elif kind < 0.75:
        s["format"] = r.choice(FORMATS)
    elif kind < 0.85:
        s["enum"] = r.sample(["red", "green", "blue", "a\"q", "tab\t", "ünï"], r.randint(1, 3))
    return s


def gen_number(r, integer):
    s = {"type": "integer" if integer else "number"}
    lo = r.randint(-50, 50)
    if r.random() < 0.5:
        s["exclusiveMinimum" if r.random() < 0.3 else "minimum"] = lo + (0 if integer else r.choice([0, 0.5]))
    if r.random() < 0.5:
        s["exclusiveMaximum" if r.random() < 0.3 else "maximum"] = lo + r.randint(3, 200)
    return s


def gen_object(r, depth, defs):
    props = {}
    for i in range(r.randint(0, 4)):
        props[r.choice(["id", "name", "value", "items", "x", "y_z", "note"]) + str(i)] = gen(r, depth + 1, defs)
    s = {"type": "object", "properties": props}
    if props and r.random() < 0.7:
        s["required"] = r.sample(sorted(props), r.randint(0, len(props)))
    a = r.random()
    if a < 0.3:
        s["additionalProperties"] = False
    elif a < 0.45:
        s["additionalProperties"] = True
    elif a < 0.6:
        s["additionalProperties"] = gen(r, depth + 2, defs)
    return s


def gen_array(r, depth, defs):
    s = {"type": "array"}
    if r.random() < 0.3:
        s["prefixItems"] = [gen(r, depth + 1, defs) for _ in range(r.randint(1, 3))]
        if r.random() < 0.5:
            s["items"] = False if r.random() < 0.5 else gen(r, depth + 1, defs)
    else:
        s["items"] = gen(r, depth + 1, defs)
    if r.random() < 0.5:
        lo = r.randint(0, 2)
        s["minItems"] = lo
        if r.random() < 0.7:
            s["maxItems"] = lo + r.randint(0, 3)
    if s.get("items") is False and s.get("minItems", 0) > len(s["prefixItems"]):
        s["minItems"] = len(s["prefixItems"])
    return s


def gen(r, depth, defs):
    leaf = depth >= 3
    k = r.random()
    if k < 0.18:
        return gen_string(r)
    if k < 0.3:
        return gen_number(r, True)
    if k < 0.38:
        return gen_number(r, False)
    if k < 0.42:
        return {"type": "boolean"}
    if k < 0.45:
        return {"const": r.choice([1, "x", None, True, [1, "a"], {"k": [2]}])}
    if k < 0.5:
        return {"enum": [1, "two", None, 3.5, {"a": 1}]}
    if k < 0.55:
        return {"type": [r.choice(["string", "integer", "boolean"]), "null"]}
    if k < 0.6 and not leaf:
        types = r.sample([gen_string(r), gen_number(r, True), {"type": "boolean"}, {"type": "null"}], 2)
        return {r.choice(["anyOf", "oneOf"]): types}
    if k < 0.65 and not leaf:
        name = "d%d" % len(defs)
        defs[name] = None  # reserved: nested definitions take other names
        defs[name] = gen(r, depth + 1, defs)
        return {"$ref": "#/$defs/" + name, "description": "a reference"}
    if k < 0.8 and not leaf:
        return gen_array(r, depth, defs)
    if k < 0.97 and not leaf:
        return gen_object(r, depth, defs)
    return {} if r.random() < 0.5 else {"title": "anything"}


RECURSIVE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
RECURSIVE_DEFINITIONS = {"definitions": {"list": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
    "head": {"type": "string", "maxLength": 3}, "tail": {"$ref": "#/definitions/list"}}, "required": ["head", "tail"],
    "additionalProperties": False}]}}, "$ref": "#/definitions/list"}

UNSUPPORTED = [  # schema, keyword, pointer
    ({"type": "object", "properties": {"x": {"type": "object", "patternProperties": {"a": {}}}}}, "patternProperties",
     "/properties/x"),
    ({"type": "object", "minProperties": 1}, "minProperties", ""),
    ({"not": {"type": "string"}}, "not", ""),
    ({"type": "array", "items": {"if": {"type": "string"}, "then": {}}}, "if", "/items"),
    ({"type": "array", "contains": {"type": "integer"}}, "contains", ""),
    ({"type": "array", "uniqueItems": True}, "uniqueItems", ""),
    ({"type": "string", "format": "hostname"}, "format", ""),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems", ""),
    ({"type": "string", "minLength": 5, "maxLength": 1}, "minLength", ""),
    ({"$defs": {"a": {"type": "object", "dependentRequired": {}}}, "$ref": "#/$defs/a"}, "dependentRequired", "/$defs/a"),
    ({"$ref": "#/$defs/missing"}, "$ref", ""),
    ({"type": "string", "pattern": "(?=x)"}, "pattern", ""),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "minimum", ""),
]


def run_walk(binary, tokenizer, args):
    out = subprocess.run([binary, "--tokenizer", tokenizer] + args, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return [json.loads(line) for line in out.stdout.splitlines()]


def validator(schema):
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


# Gemma 4 call syntax, parsed independently of the C++ code: <|tool_call>call:NAME{key:value,...}<tool_call|>
Q = '<|"|>'
NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def parse_value(t, i):
    if t.startswith(Q, i):
        end = t.index(Q, i + len(Q))
        return t[i + len(Q):end], end + len(Q)
    if t[i] == "{":
        obj, i = {}, i + 1
        while t[i] != "}":
            colon = t.index(":", i)
            key = t[i:colon]
            obj[key], i = parse_value(t, colon + 1)
            if t[i] == ",":
                i += 1
        return obj, i + 1
    if t[i] == "[":
        arr, i = [], i + 1
        while t[i] != "]":
            v, i = parse_value(t, i)
            arr.append(v)
            if t[i] == ",":
                i += 1
        return arr, i + 1
    for word, value in (("true", True), ("false", False), ("null", None)):
        if t.startswith(word, i):
            return value, i + len(word)
    m = NUMBER.match(t, i)
    if not m:
        raise ValueError("no value at %d in %r" % (i, t))
    return json.loads(m.group(0)), m.end()


def parse_calls(text):
    calls, i = [], 0
    while i < len(text):
        if not text.startswith("<|tool_call>call:", i):
            raise ValueError("expected a call at %d in %r" % (i, text))
        i += len("<|tool_call>call:")
        brace = text.index("{", i)
        name = text[i:brace]
        args, i = parse_value(text, brace)
        if not text.startswith("<tool_call|>", i):
            raise ValueError("expected <tool_call|> at %d in %r" % (i, text))
        i += len("<tool_call|>")
        calls.append((name, args))
    return calls


def end_to_end(a, r, path, failures):
    checked = cut = 0
    for n in range(a.e2e_schemas):
        defs = {}
        schema = gen_object(r, 0, defs) if n % 2 == 0 else gen(r, 0, defs)
        if defs:
            schema = {"$defs": defs, "allOf": [schema]} if "$ref" in schema else dict(schema, **{"$defs": defs})
        with open(path, "w") as f:
            json.dump(schema, f)
        for temperature in ("0", "0.8", "1.5"):
            seed = str(r.randint(0, 1 << 30))
            out = subprocess.run([a.e2e_qatserve, "generate", "--model", a.e2e_model, "--prompt", "JSON please",
                                  "--chat", "--json-schema", path, "--temperature", temperature, "--seed", seed,
                                  "--max-tokens", "600"], capture_output=True, text=True, timeout=300)
            label = "e2e schema %d temperature %s seed %s" % (n, temperature, seed)
            if out.returncode != 0:
                failures.append("%s: exit %d: %s" % (label, out.returncode, out.stderr.strip()[-300:]))
                continue
            finish = re.search(r"finish: (\S+)\]", out.stderr)
            if not finish or finish.group(1) != "stop":
                cut += 1
                continue
            checked += 1
            try:
                validator(schema).validate(json.loads(out.stdout))
            except Exception as e:  # noqa: BLE001
                failures.append("%s: %s\n  schema %s\n  text %r" % (label, str(e)[:300], json.dumps(schema), out.stdout))
    print("end to end: %d outputs validated, %d cut at max_tokens" % (checked, cut))
    # A random-weight model rarely picks a string's closing quote among the tokens a string allows, so some outputs
    # run to max_tokens (a larger budget ends few more), and which ones follows the model's exact numerics: at least
    # half must end, so that the check is not vacuous.
    if cut * 2 > checked + cut:
        failures.append("end to end: %d of %d outputs hit max_tokens" % (cut, checked + cut))


# --- bounded schemas: every output ends, in the declared property order -----------------------------------------

NAMES = ["name", "age", "zip", "city", "b", "a", "score", "id", "tag", "x"]  # declared shuffled, not sorted


def gen_bounded(r, depth):
    k = r.random()
    if k < 0.2:
        return gen_number(r, True) if r.random() < 0.5 else {"type": "integer"}
    if k < 0.35:
        return gen_number(r, False) if r.random() < 0.3 else {"type": "number"}
    if k < 0.45:
        return {"type": "boolean"}
    if k < 0.55:
        return {"enum": r.sample(["red", "green", "blue", "a\"q", "ünï", 7, None], r.randint(1, 3))}
    if k < 0.7:
        return {"type": "string", "maxLength": r.randint(0, 8)}
    if k < 0.8 and depth < 3:
        return {"type": "array", "items": gen_bounded(r, depth + 1), "maxItems": r.randint(0, 3)}
    if depth < 3:
        return gen_bounded_object(r, depth)
    return {"type": "null"}


def gen_bounded_object(r, depth):
    names = r.sample(NAMES, r.randint(1, 5))
    props = {n: gen_bounded(r, depth + 1) for n in names}
    return {"type": "object", "properties": props, "required": r.sample(names, r.randint(0, len(names))),
            "additionalProperties": False}


def dumped_length(value):
    """Bytes of a JSON value with one space after every ',' and ':' (the most the grammar writes)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")).encode())


def resolve(schema, root):
    """The schema a "#/..." $ref points to (pydantic's nested models), else the schema itself."""
    while "$ref" in schema:
        for part in schema["$ref"].lstrip("#/").split("/"):
            root = root[part]
        schema = root
    return schema


def longest(schema, root=None):
    """The byte length of the longest document the grammar may write for a bounded schema (see the docstring)."""
    root = root or schema
    schema = resolve(schema, root)
    if "enum" in schema:
        return max(dumped_length(v) for v in schema["enum"])
    t = schema["type"]
    if t == "integer":
        return 20
    if t == "number":
        return 36  # 35 unbounded; a bounded number: "-", 19 integer digits, ".", 15 fraction digits
    if t in ("boolean", "null"):
        return 5
    if t == "string":
        return 2 + 6 * schema["maxLength"]
    if t == "array":
        n = schema["maxItems"]
        return 2 + n * longest(schema["items"], root) + 2 * max(0, n - 1)
    members = [dumped_length(k) + 2 + longest(v, root) for k, v in schema["properties"].items()]
    return 2 + sum(members) + 2 * (len(members) - 1)


def order_problem(schema, value, sort_keys, root=None):
    """Where `value` (objects as lists of pairs) writes properties out of the schema's order, else None."""
    root = root or schema
    schema = resolve(schema, root)
    if isinstance(value, list) and schema.get("type") == "object":
        keys = [k for k, _ in value]
        declared = sorted(schema["properties"]) if sort_keys else list(schema["properties"])
        if keys != [k for k in declared if k in keys]:
            return "keys %s, declared %s" % (keys, declared)
        for k, v in value:
            problem = order_problem(schema["properties"][k], v, sort_keys, root)
            if problem:
                return problem
    if isinstance(value, list) and schema.get("type") == "array":
        for v in value:
            problem = order_problem(schema["items"], v, sort_keys, root)
            if problem:
                return problem
    return None


def check_bounded_output(schema, text, tokens, finish, label, failures, sort_keys=False, value=None):
    bound = longest(schema)
    try:
        if finish != "stop":
            raise ValueError("finish %r: did not end" % finish)
        if tokens > bound + 1:
            raise ValueError("%d tokens, more than the %d bytes of the longest document" % (tokens, bound))
        if value is None:
            validator(schema).validate(json.loads(text))
            value = json.loads(text, object_pairs_hook=list)
        problem = order_problem(schema, value, sort_keys)
        if problem:
            raise ValueError("properties out of order: " + problem)
    except Exception as e:  # noqa: BLE001
        failures.append("%s: %s\n  schema %s\n  text %r" % (label, str(e)[:300], json.dumps(schema), text))


def parse_pairs(t, i):
    """parse_value, but objects as lists of (key, value) pairs in the order written."""
    if t.startswith(Q, i) or t[i] not in "{[":
        return parse_value(t, i)
    if t[i] == "[":
        arr, i = [], i + 1
        while t[i] != "]":
            v, i = parse_pairs(t, i)
            arr.append(v)
            if t[i] == ",":
                i += 1
        return arr, i + 1
    pairs, i = [], i + 1
    while t[i] != "}":
        colon = t.index(":", i)
        key = t[i:colon]
        v, i = parse_pairs(t, colon + 1)
        pairs.append((key, v))
        if t[i] == ",":
            i += 1
    return pairs, i + 1


def bounded(a, r, path, failures):
    walks = generated = 0
    tools_path = path + ".tools"
    for n in range(a.bounded_schemas):
        schema = gen_bounded_object(r, 0)
        with open(path, "w") as f:
            json.dump(schema, f)
        for line in run_walk(a.walk, a.tokenizer, ["--schema", path, "--seed", str(r.randint(0, 1 << 30)),
                                                   "--count", str(a.bounded_seeds), "--steps", "100000"]):
            walks += 1
            check_bounded_output(schema, line.get("text", ""), line.get("tokens", 0),
                                 "stop" if line.get("complete") else line.get("error", "no end"),
                                 "bounded walk %d seed %s" % (n, line.get("seed")), failures)
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        with open(tools_path, "w") as f:
            json.dump([tool], f)
        for line in run_walk(a.walk, a.tokenizer, ["--tools", tools_path, "--seed", str(r.randint(0, 1 << 30)),
                                                   "--count", str(a.bounded_seeds), "--steps", "100000"]):
            walks += 1
            label = "bounded tool call %d seed %s" % (n, line.get("seed"))
            try:
                (name, args), = parse_calls(line["text"])
                validator(schema).validate(args)
                text = line["text"]
                pairs, _ = parse_pairs(text, text.index("{"))
            except Exception as e:  # noqa: BLE001
                failures.append("%s: %s\n  schema %s\n  text %r" % (label, str(e)[:300], json.dumps(schema),
                                                                   line.get("text")))
                continue
            # The call syntax is never longer than JSON (bare keys, no spaces, strings unescaped between two <|"|>
            # tokens) but adds 8 tokens: <|tool_call>, "call:f" and <tool_call|>.
            check_bounded_output(schema, text, line["tokens"] - 8, "stop", label, failures, sort_keys=True,
                                 value=pairs)
        if not a.e2e_qatserve:
            continue
        for _ in range(a.bounded_seeds):
            seed = str(r.randint(0, 1 << 30))
            out = subprocess.run([a.e2e_qatserve, "generate", "--model", a.e2e_model, "--prompt", "JSON please",
                                  "--chat", "--json-schema", path, "--temperature", "1", "--seed", seed,
                                  "--max-tokens", str(longest(schema) + 1)], capture_output=True, text=True,
                                 timeout=300)
            label = "bounded e2e schema %d seed %s" % (n, seed)
            if out.returncode != 0:
                failures.append("%s: exit %d: %s" % (label, out.returncode, out.stderr.strip()[-300:]))
                continue
            generated += 1
            finish = re.search(r"; (\d+) generated, .*finish: (\S+?)\]", out.stderr)
            check_bounded_output(schema, out.stdout, int(finish.group(1)) if finish else 0,
                                 finish.group(2) if finish else "unknown", label, failures)
    print("bounded schemas: %d walks and %d generations checked" % (walks, generated))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("walk")
    ap.add_argument("tokenizer")
    ap.add_argument("--schemas", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--e2e-qatserve")
    ap.add_argument("--e2e-model")
    ap.add_argument("--e2e-schemas", type=int, default=20)
    ap.add_argument("--bounded-schemas", type=int, default=0)
    ap.add_argument("--bounded-seeds", type=int, default=8)
    a = ap.parse_args()
    r = random.Random(a.seed)
    failures, outputs, rejected = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "schema.json")

        def check_schema(schema, label):
            nonlocal outputs
            with open(path, "w") as f:
                json.dump(schema, f)
            for line in run_walk(a.walk, a.tokenizer, ["--schema", path, "--seed", str(r.randint(0, 1 << 30)),
                                                       "--count", str(a.seeds), "--steps", str(a.steps)]):
                if "error" in line:
                    failures.append("%s: rejected: %s\n  schema %s" % (label, line["error"], json.dumps(schema)))
                    return
                outputs += 1
                try:
                    if not line["complete"]:
                        raise ValueError("walk did not complete in its step budget")
                    validator(schema).validate(json.loads(line["text"]))
                except Exception as e:  # noqa: BLE001 - every failure is reported with its input
                    failures.append("%s seed %d: %s\n  schema %s\n  text %r" % (label, line["seed"], str(e)[:300],
                                                                                json.dumps(schema), line["text"]))

        for n in range(a.schemas):
            defs = {}
            schema = gen(r, 0, defs)
            if defs:
                schema = {"$defs": defs, "allOf": [schema]} if "$ref" in schema else dict(schema, **{"$defs": defs})
            check_schema(schema, "schema %d" % n)
        check_schema(RECURSIVE, "recursive $defs")
        check_schema(RECURSIVE_DEFINITIONS, "recursive definitions")

        for schema, keyword, pointer in UNSUPPORTED:
            with open(path, "w") as f:
                json.dump(schema, f)
            line = run_walk(a.walk, a.tokenizer, ["--schema", path, "--count", "1"])[0]
            if "error" not in line or line["keyword"] != keyword or line["pointer"] != pointer:
                failures.append("unsupported %s: expected keyword %r at %r, got %s" % (json.dumps(schema), keyword,
                                                                                      pointer, json.dumps(line)))
            elif keyword not in line["error"]:
                failures.append("unsupported %s: message does not name %r: %s" % (json.dumps(schema), keyword,
                                                                                 line["error"]))
            else:
                rejected += 1

        tools_path = os.path.join(tmp, "tools.json")
        for n in range(max(1, a.schemas // 10)):
            tools = []
            for i in range(r.randint(1, 4)):
                defs = {}
                params = gen_object(r, 1, defs)
                if defs:
                    params["$defs"] = defs
                tools.append({"type": "function", "function": {"name": "tool_%d" % i, "parameters": params}})
            by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            with open(tools_path, "w") as f:
                json.dump(tools, f)
            for line in run_walk(a.walk, a.tokenizer, ["--tools", tools_path, "--parallel", "--count", str(a.seeds),
                                                       "--seed", str(r.randint(0, 1 << 30)), "--steps", str(a.steps)]):
                if "error" in line:
                    failures.append("tools %d: rejected: %s" % (n, line["error"]))
                    break
                outputs += 1
                try:
                    calls = parse_calls(line["text"])
                    if not calls:
                        raise ValueError("no call")
                    for name, args in calls:
                        validator(by_name[name]).validate(args)
                except Exception as e:  # noqa: BLE001
                    failures.append("tools %d seed %d: %s\n  tools %s\n  text %r" % (n, line["seed"], str(e)[:300],
                                                                                   json.dumps(tools), line["text"]))
        if a.e2e_qatserve:
            end_to_end(a, r, path, failures)
        if a.bounded_schemas:
            bounded(a, random.Random(a.seed + 1), path, failures)
    for f in failures[:30]:
        print("FAIL", f)
    print("%d outputs checked, %d unsupported schemas rejected by name, %d failures" % (outputs, rejected,
                                                                                      len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
