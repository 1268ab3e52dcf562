"""Schema-driven, property-based fuzzing of every endpoint of the real server.

Each generation endpoint starts from a valid body with tools, a tool call and its
result, and hypothesis applies one mutation: a wrong type, a missing field, a huge
string, deep nesting, invalid UTF-8, an invalid tool schema (also with the tool
forced, so the grammar compiler sees it), invalid JSON in tool-call arguments or tool
results, messages in impossible orders, out-of-range sampling values, unknown models.
Raw bytes, other methods and odd path parameters go to every published path too.

Oracle, for every case: an answer within the timeout, never a 5xx; a 4xx carries the
protocol's error shape with a message; a body the published schema (/openapi.json)
rejects must get a 4xx; a 200 is a well-formed answer (streams end with their terminal
event and carry no error event); and the next valid request succeeds. The default run
is modest (FUZZ_EXAMPLES per test); the slow group runs SLOW_EXAMPLES. The number of
cases run is printed at the end of the module.
"""

from __future__ import annotations

import copy
from urllib.parse import quote
from collections import Counter
from typing import Any

import httpx
import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from jumpahead.proxy.body_limit import MAX_JSON_DEPTH  # deeper bodies are refused when read

from .serving import serve

FUZZ_EXAMPLES = 12  # per generation endpoint; a generating case costs one model forward or two
SLOW_EXAMPLES = 100
PROBE_EVERY = 8  # a valid request after every 8th case and after each test (the server still serves)
TIMEOUT_S = 180.0  # one request; the machine is shared, the model small (a hang would be minutes)
BODY_LIMIT = 2 << 20
CASES: Counter[str] = Counter()  # "path kind" -> cases sent
PROBES: Counter[str] = Counter()  # valid requests sent between cases (all answered 200)

TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
CHAT_BASE: dict[str, Any] = {
    "model": "m", "max_tokens": 1,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "ls", "description": "list files", "parameters": TOOL_SCHEMA}}],
    "temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"],
}
MESSAGES_BASE: dict[str, Any] = {
    "model": "m", "max_tokens": 1, "system": "Be brief.",
    "messages": [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [{"type": "text", "text": "Listing."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"},
                                     {"type": "text", "text": "hi"}]},
    ],
    "tools": [{"name": "ls", "description": "list files", "input_schema": TOOL_SCHEMA}],
    "temperature": 0.5, "top_k": 5, "stop_sequences": ["\n\n"],
}
COUNT_BASE = {k: v for k, v in MESSAGES_BASE.items() if k != "max_tokens"}
RESPONSES_BASE: dict[str, Any] = {
    "model": "m", "max_output_tokens": 1, "instructions": "Be brief.", "store": False,
    "input": [
        {"role": "user", "content": "List the files."},
        {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{\"path\": \".\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py\nb.py"},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ],
    "tools": [{"type": "function", "name": "ls", "description": "list files", "parameters": TOOL_SCHEMA}],
    "temperature": 0.5,
}
ENDPOINTS = {  # path -> (base body, schema name, where the tool schema is, forcing the tool)
    "/v1/chat/completions": (CHAT_BASE, "ChatCompletionRequest", ("tools", 0, "function", "parameters"),
                             {"tool_choice": "required"}),
    "/v1/messages": (MESSAGES_BASE, "MessagesRequest", ("tools", 0, "input_schema"),
                     {"tool_choice": {"type": "any"}}),
    "/v1/messages/count_tokens": (COUNT_BASE, "CountTokensRequest", ("tools", 0, "input_schema"), {}),
    "/v1/responses": (RESPONSES_BASE, "ResponsesRequest", ("tools", 0, "parameters"), {"tool_choice": "required"}),
}
PROBE = ("/v1/chat/completions", {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "ok"}]})

# --- mutations ------------------------------------------------------------------------------

WRONG_VALUES = [0, -1, 1.5, True, False, "text", "", [], [1, "a"], {}, {"x": 1}, [[[]]], {"type": {"type": 1}}]
BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80abc", b"\xe2\x82"]
BAD_TOOL_SCHEMAS = [
    {"type": 5}, {"type": "object", "properties": []}, {"type": "object", "properties": {"a": {"type": "nonsense"}}},
    {"$ref": "#/definitions/missing"}, {"type": "object", "required": "path"},
    {"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}}, {"anyOf": []}, {"enum": []},
    {"type": "string", "minLength": 10, "maxLength": 2}, {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}, {"not": {}},
    {"type": ["object", "array", "null"]}, {"type": "object", "additionalProperties": {"type": "bogus"}},
    {"type": "object", "properties": {"d": {"format": "no-such-format", "type": "string"}}}, {},
    {"type": "object", "properties": {"\u0000\ud7ff": {"type": "string"}}, "required": ["\u0000\ud7ff"]},
]
BAD_ARGUMENTS = ["{not json", "", "[1, 2]", "null", "\"text\"", "{\"path\": NaN}", "{\"path\": \"a\"", "}{",
                 "{\"path\": \"\\ud800\"}", 5, [1], {"path": {"deep": [1, {"x": None}]}}, None, True]
BAD_RESULTS = [{"weird": 1}, [{"type": "image", "source": {}}], 5, [[["x"]]], "", None, [{"type": "text"}],
               [{"type": "text", "text": 7}], {"type": "tool_result"}, True]
SAMPLING = {
    "/v1/chat/completions": {"temperature": [-1, -1e-9, "hot", 1e308], "top_p": [0, 1.5, -0.1], "top_k": [-2, 1.5],
                             "min_p": [2, -1], "presence_penalty": [3, -3], "frequency_penalty": [2.5],
                             "repetition_penalty": [0, -1], "max_tokens": [0, -1, 1.5, "10", 2 ** 64],
                             "max_completion_tokens": [0, -5], "n": [2, 0, -1], "seed": [2 ** 64, 1.5, "1"],
                             "logit_bias": [{"abc": 1}, {"999999999": 1}, {"5": 1000}, [1]],
                             "stream_options": [5, {"include_usage": "yes"}]},
    "/v1/messages": {"temperature": [1.5, -1, "1"], "top_p": [0, 2], "top_k": [-1, 0.5], "max_tokens": [0, -1, 2.5],
                     "seed": [2 ** 64], "stop_sequences": ["\n", [1]]},
    "/v1/messages/count_tokens": {"tools": [{"name": "x"}, 5]},
    "/v1/responses": {"temperature": [2.5, -0.1], "top_p": [0, 1.01], "max_output_tokens": [0, -3, "5"],
                      "seed": [2 ** 65], "include": ["x", [5]], "previous_response_id": ["", "resp_unknown", 5]},
}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every node's path in a JSON value (dict keys and list indices), the root excluded."""
    out = []
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return out
    for key, value in items:
        out.append((*prefix, key))
        out += _paths(value, (*prefix, key))
    return out


def _get(body: Any, path: tuple) -> Any:
    for key in path:
        body = body[key]
    return body


def _set(body: Any, path: tuple, value: Any) -> None:
    _get(body, path[:-1])[path[-1]] = value


def _delete(body: Any, path: tuple) -> None:
    del _get(body, path[:-1])[path[-1]]


def _nest(depth: int, leaf: Any, kind: str) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"a": leaf}
    return leaf


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


@st.composite
def mutated(draw: st.DrawFn, path: str) -> tuple[str, bytes, Any]:
    """(kind, raw body, parsed body or None when the bytes are not JSON) for one mutation of `path`'s base."""
    base, _, tool_path, forcing = ENDPOINTS[path]
    body = copy.deepcopy(base)
    kind = draw(st.sampled_from(["wrong_type", "missing", "huge_string", "deep_nesting", "invalid_utf8",
                                 "tool_schema", "tool_arguments", "tool_result", "order", "sampling", "model",
                                 "stream"]))
    nodes = _paths(body)
    if kind == "wrong_type":
        where = draw(st.sampled_from(nodes))
        current = _type_of(_get(body, where))
        _set(body, where, draw(st.sampled_from([v for v in WRONG_VALUES if _type_of(v) != current])))
    elif kind == "missing":
        _delete(body, draw(st.sampled_from(nodes)))
    elif kind == "huge_string":
        strings = [p for p in nodes if isinstance(_get(body, p), str)] + [("model",), ("extra_field",)]
        size = draw(st.sampled_from([10_000, 200_000, 1_500_000]))
        _set(body, draw(st.sampled_from(strings)), draw(st.sampled_from(["A", "é", "日本", " \n", "{\""])) * size)
    elif kind == "deep_nesting":
        where = draw(st.sampled_from([*nodes, ("extra_field",), ("jumpahead",), ("metadata",)]))
        depth = draw(st.sampled_from([20, MAX_JSON_DEPTH - 8, 300, 1000, 5000]))
        _set(body, where, _nest(depth, draw(st.sampled_from(["x", 1, None])), draw(st.sampled_from(["list", "dict"]))))
    elif kind == "invalid_utf8":
        strings = [p for p in nodes if isinstance(_get(body, p), str)]
        where = draw(st.sampled_from(strings))
        _set(body, where, _get(body, where) + "\x00@@BAD@@")
        raw = orjson.dumps(body).replace(b"@@BAD@@", draw(st.sampled_from(BAD_UTF8)))
        return kind, raw, None
    elif kind == "tool_schema":
        _set(body, tool_path, draw(st.sampled_from(BAD_TOOL_SCHEMAS + [5, "object", [], None])))
        if draw(st.booleans()):
            body.update(forcing)  # the tool is forced: its schema reaches the grammar compiler
    elif kind == "tool_arguments":
        calls = [p for p in nodes if p[-1] in ("arguments", "input") and len(p) > 2]
        _set(body, draw(st.sampled_from(calls)), draw(st.sampled_from(BAD_ARGUMENTS)))
    elif kind == "tool_result":
        results = [p for p in nodes if p[-1] in ("output",) or (p[-1] == "content" and _is_result(body, p))]
        _set(body, draw(st.sampled_from(results)), draw(st.sampled_from(BAD_RESULTS)))
    elif kind == "order":
        key = "input" if "input" in body else "messages"
        items = body[key]
        order = draw(st.permutations(range(len(items))))
        items = [items[i] for i in order]
        drop = draw(st.sampled_from([None, *range(len(items))]))
        if drop is not None and len(items) > 1:
            items.pop(drop)
        if draw(st.booleans()):
            items.append(copy.deepcopy(items[draw(st.integers(0, len(items) - 1))]))
        body[key] = items
    elif kind == "sampling":
        table = SAMPLING[path]
        field = draw(st.sampled_from(sorted(table)))
        body[field] = draw(st.sampled_from(table[field]))
    elif kind == "model":
        body["model"] = draw(st.one_of(st.text(max_size=300), st.sampled_from(["../../etc/passwd", "gpt-5", "claude-x"])))
    elif kind == "stream":
        body["stream"] = True
        if draw(st.booleans()):
            where = draw(st.sampled_from(nodes))
            _set(body, where, draw(st.sampled_from(WRONG_VALUES)))
    try:
        raw = orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):  # too deep or too large an int for orjson: write it by hand
        raw = _dumps_deep(body)
    return kind, raw, body


def _is_result(body: Any, path: tuple) -> bool:
    parent = _get(body, path[:-1])
    return isinstance(parent, dict) and (parent.get("role") == "tool" or parent.get("type") == "tool_result")


def _dumps_deep(value: Any) -> bytes:
    """JSON for values orjson refuses (nesting over 255, integers over 64 bits)."""
    import json
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    finally:
        sys.setrecursionlimit(limit)


# --- the oracle -------------------------------------------------------------------------------


def _anthropic(path: str) -> bool:
    return path.startswith(("/v1/messages", "/messages"))


def check_answer(r: httpx.Response, path: str, must_reject: bool, stream: bool) -> None:
    assert r.status_code < 500, f"{path}: {r.status_code} {r.text[:400]}"
    if r.status_code >= 400:
        body = r.json()
        if _anthropic(path):
            assert body.get("type") == "error", body
        message = body["error"]["message"]
        assert isinstance(message, str) and message and isinstance(body["error"]["type"], str)
        return
    assert not must_reject, f"{path}: the published schema rejects this body, the server answered {r.status_code}"
    assert r.status_code == 200, (r.status_code, r.text[:300])
    if stream and "text/event-stream" in r.headers.get("content-type", ""):
        text = r.text
        terminal = {"/v1/chat/completions": "data: [DONE]", "/v1/messages": "event: message_stop",
                    "/v1/responses": "event: response."}[path]
        assert terminal in text, text[-400:]
        assert "server_error" not in text and "event: error" not in text, text[-600:]
        return
    body = r.json()
    if path == "/v1/chat/completions":
        assert body["object"] == "chat.completion" and body["choices"]
    elif path == "/v1/messages":
        assert body["type"] == "message" and body["role"] == "assistant"
    elif path == "/v1/messages/count_tokens":
        assert isinstance(body["input_tokens"], int)
    else:
        assert body["object"] == "response" and body["status"] in ("completed", "incomplete")


@pytest.fixture(scope="module")
def server(engine):
    from jumpahead.policies.runtime import PolicyHooks

    hooks = [PolicyHooks([], engine.tokenizer, engine.context_length)]
    with serve(engine, hooks=hooks, max_body_bytes=BODY_LIMIT) as url, httpx.Client(base_url=url, timeout=TIMEOUT_S) as c:
        doc = c.get("/openapi.json").json()
        yield c, doc


def _validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    schema = {**doc["components"]["schemas"][name], "$defs": doc["components"]["schemas"]}
    return jsonschema.Draft202012Validator(schema)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack += [(child, depth + 1) for child in children]
    return deepest


def _valid(doc: dict[str, Any], name: str, body: Any) -> bool:
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))  # jsonschema recurses once per nesting level (and more)
    try:
        return _validator(doc, name).is_valid(body)
    finally:
        sys.setrecursionlimit(limit)


def _probe(c: httpx.Client) -> None:
    r = c.post(PROBE[0], json=PROBE[1])
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"], r.text[:300]
    PROBES["valid"] += 1


def _maybe_probe(c: httpx.Client) -> None:
    if sum(CASES.values()) % PROBE_EVERY == 0:
        _probe(c)


def run_case(c: httpx.Client, doc: dict[str, Any], path: str, kind: str, raw: bytes, parsed: Any) -> None:
    name = ENDPOINTS[path][1]
    must_reject = parsed is None or _depth(parsed) > MAX_JSON_DEPTH or not _valid(doc, name, parsed)
    stream = isinstance(parsed, dict) and parsed.get("stream") is True
    r = c.post(path, content=raw, headers={"content-type": "application/json"})
    CASES[f"{path} {kind}"] += 1
    check_answer(r, path, must_reject, stream)
    _maybe_probe(c)


def _fuzz_settings(n: int) -> settings:
    # No shrinking: on a loaded machine it would replay a failing case for minutes; the
    # failing example is printed as drawn.
    return settings(max_examples=n, deadline=None, database=None, derandomize=True,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


def _fuzz_generation(n: int):
    """A test of each generation endpoint (`path`) drawing n examples from `data`. Hypothesis
    seeds a derandomized test from its code without its decorators: the draws stay the test's own."""
    def decorate(test):
        return pytest.mark.parametrize("path", sorted(ENDPOINTS))(_fuzz_settings(n)(given(data=st.data())(test)))

    return decorate


@_fuzz_generation(FUZZ_EXAMPLES)
def test_fuzz_generation_endpoints(server, path, data):
    c, doc = server
    kind, raw, parsed = data.draw(mutated(path))
    run_case(c, doc, path, kind, raw, parsed)


@pytest.fixture(autouse=True)
def _probe_after(request):
    yield
    if "server" in request.fixturenames:
        _probe(request.getfixturevalue("server")[0])


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 100 cases, many of them generating: minutes on a loaded machine
@_fuzz_generation(SLOW_EXAMPLES)
def test_fuzz_generation_endpoints_long(server, path, data):
    c, doc = server
    kind, raw, parsed = data.draw(mutated(path))
    run_case(c, doc, path, kind, raw, parsed)


def _published(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m.upper(), p) for p, item in doc["paths"].items() for m in item]


@_fuzz_settings(FUZZ_EXAMPLES * 2)
@given(data=st.data())
def test_fuzz_raw_bodies_methods_and_path_parameters(server, data):
    """Any bytes to any published path with any method; odd ids in path parameters."""
    c, doc = server
    method, path = data.draw(st.sampled_from(_published(doc)))
    ident = data.draw(st.one_of(st.text(min_size=1, max_size=200).filter(lambda s: s not in (".", "..")),
                                st.sampled_from(["..%2F..%2Fetc%2Fpasswd", "%00", "a" * 5000, "resp_" + "f" * 32])))
    concrete = path.replace("{response_id}", quote(ident, safe="")).replace("{model_id}", quote(ident, safe=""))
    method = data.draw(st.sampled_from([method, method, "PUT", "PATCH", "DELETE", "POST", "GET"]))
    raw = data.draw(st.one_of(st.binary(max_size=2000), st.sampled_from([b"", b"null", b"[]", b"{}", b"{\"messages\": 1}",
                                                                        b"\xff\xfe{", b"{" * 3000])))
    r = c.request(method, concrete, content=raw, headers={"content-type": "application/json"})
    CASES[f"raw {method}"] += 1
    assert r.status_code < 500, (method, concrete, r.status_code, r.text[:300])
    if r.status_code >= 400 and method != "HEAD":
        body = r.json()
        assert body["error"]["message"], body
    _maybe_probe(c)


def test_openapi_lists_every_route_with_valid_schemas(server, engine):
    from starlette.routing import Route

    from jumpahead.proxy.server import create_app

    c, doc = server
    assert doc["openapi"].startswith("3.")
    published = {(m, p) for m, p in _published(doc)}
    for route in create_app(engine).routes:
        assert isinstance(route, Route)
        path = route.path.replace("{model_id:path}", "{model_id}")
        for method in route.methods or ():
            if method == "HEAD" and path != "/":
                continue  # Starlette answers HEAD on every GET route
            assert (method, path) in published, f"{method} {path} is served but not in /openapi.json"
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    # the valid bases are valid under the published schemas and are served
    for path, (base, name, _, _) in ENDPOINTS.items():
        assert _validator(doc, name).is_valid(base), name
        run_case(c, doc, path, "valid", orjson.dumps(base), base)
        # the schema's required fields are really required
        for field in doc["components"]["schemas"][name].get("required", []):
            body = {k: v for k, v in base.items() if k != field}
            run_case(c, doc, path, "missing", orjson.dumps(body), body)


def test_deep_bodies_are_refused_when_read(server):
    """Found by the fuzzer: tool-call arguments nested past orjson's write limit (254)
    were accepted, then failed when re-serialized (a 500). Over MAX_JSON_DEPTH: 400."""
    c, _ = server
    deep = _nest(200, {"path": "."}, "dict")
    chat = copy.deepcopy(CHAT_BASE)
    chat["messages"][2]["tool_calls"][0]["function"]["arguments"] = deep
    messages = copy.deepcopy(MESSAGES_BASE)
    messages["messages"][1]["content"][1]["input"] = deep
    responses = copy.deepcopy(RESPONSES_BASE)
    responses["input"][1]["arguments"] = deep
    for path, body in (("/v1/chat/completions", chat), ("/v1/messages", messages), ("/v1/responses", responses),
                       ("/v1/messages/count_tokens", {**messages, "max_tokens": None})):
        r = c.post(path, content=_dumps_deep(body), headers={"content-type": "application/json"})
        check_answer(r, path, True, False)
        assert "deeper than" in r.text
    # just under the limit (the tool schema nests as deep as a body may): read and counted
    ok = copy.deepcopy(COUNT_BASE)
    ok["tools"][0]["input_schema"]["properties"]["path"]["x"] = _nest(MAX_JSON_DEPTH - 10, 1, "list")
    r = c.post("/v1/messages/count_tokens", content=orjson.dumps(ok), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text[:300]


def test_zz_report_the_number_of_cases(capsys):
    """Prints the figures (run after the fuzz tests of this module, in file order)."""
    total = sum(CASES.values())
    by_kind = Counter()
    for key, n in CASES.items():
        by_kind[key.rsplit(" ", 1)[1]] += n
    with capsys.disabled():
        print(f"\nfuzz: {total} cases, no 5xx, every 4xx in its protocol's error shape; "
              f"{PROBES['valid']} valid requests between them all served; by kind: "
              + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
