"""The per-request `jumpahead` object is one typed contract (core/options.py): one parser
every wire protocol calls, the published OpenAPI schema generated from the same type, and no
other module reading the raw object."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import httpx
import jsonschema
import pytest

from jumpahead.core.errors import APIError
from jumpahead.core.options import OPTION_NAMES, OracleCall, RequestOptions, options_schema, parse_options
from jumpahead.proxy.anthropic_messages import parse_messages_request
from jumpahead.proxy.openai_chat import parse_chat_request
from jumpahead.proxy.openai_responses import parse_responses_request
from jumpahead.proxy.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[1]
EVERY = {"methods": ["echo", "ngram"], "policies": ["jump", {"name": "compaction", "target": 0.5}], "replace": True,
         "session": "s-1", "tool_calls": 2, "compaction": {"mode": "model", "min_tokens": 10, "sticky": True},
         "oracle_output": "<tool_call>{}</tool_call>", "oracle_calls": [{"name": "write", "arguments": {"path": "a"}}]}
BAD = [("methods", 3), ("methods", ["echo", 1]), ("policies", 5), ("policies", [{"target": 1}]), ("replace", "yes"),
       ("session", ""), ("session", 7), ("tool_calls", 0), ("tool_calls", 65), ("tool_calls", True),
       ("tool_calls", "2"), ("compaction", "model"), ("compaction", {"mode": [1]}), ("oracle_output", 3),
       ("oracle_calls", {"name": "x"}), ("oracle_calls", [{"name": "x", "arguments": "{}"}])]


def test_every_option_parses_to_its_typed_field_and_back() -> None:
    options = parse_options(EVERY)
    assert options.methods == ("echo", "ngram") and options.replace is True and options.session == "s-1"
    assert options.policies == ("jump", {"name": "compaction", "target": 0.5}) and options.tool_calls == 2
    assert options.compaction == {"mode": "model", "min_tokens": "10", "sticky": "true"}  # option strings
    assert options.oracle_calls == (OracleCall("write", {"path": "a"}),)
    assert parse_options(options.to_json()) == options
    assert set(EVERY) == set(OPTION_NAMES), "the test covers every option"
    assert parse_options(None) == parse_options({}) == RequestOptions() and RequestOptions().to_json() == {}
    assert parse_options({"methods": "echo", "session": None}) == RequestOptions(methods=("echo",))  # null: absent


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_malformed_option_is_a_400_naming_it(name: str, value: object) -> None:
    with pytest.raises(APIError) as err:
        parse_options({name: value})
    assert err.value.status == 400 and f"jumpahead.{name}" in str(err.value) and err.value.param.startswith(f"jumpahead.{name}")


def test_an_unknown_option_or_a_non_object_is_refused_with_the_known_names() -> None:
    for raw in ({"method": ["echo"]}, {"methods": [], "sesion": "x"}):
        with pytest.raises(APIError) as err:
            parse_options(raw)
        assert err.value.status == 400 and "unknown jumpahead option" in str(err.value) and "methods" in str(err.value)
    for raw in (["echo"], "echo", 3):
        with pytest.raises(APIError, match="'jumpahead' must be an object"):
            parse_options(raw)


def test_the_published_schema_is_the_type() -> None:
    """Every request schema in /openapi.json lists exactly the type's options, and it
    accepts what the parser accepts and rejects what it refuses (on the cases above)."""
    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    for name in ("ChatCompletionRequest", "MessagesRequest", "CountTokensRequest", "ResponsesRequest"):
        published = schemas[name]["properties"]["jumpahead"]
        assert published == options_schema(), name
        assert set(published["properties"]) == {f.name for f in dataclasses.fields(RequestOptions)}, name
        assert all(p["description"] for p in published["properties"].values())
    validator = jsonschema.Draft202012Validator(options_schema())
    assert validator.is_valid(EVERY) and validator.is_valid(None) and validator.is_valid({"session": None})
    for name, value in BAD:
        assert not validator.is_valid({name: value}), (name, value)
    assert not validator.is_valid({"method": ["echo"]}) and not validator.is_valid(["echo"])


def test_every_wire_protocol_carries_the_options_on_the_turn() -> None:
    user = [{"role": "user", "content": "hi"}]
    turns = [parse_chat_request({"messages": user, "jumpahead": EVERY}),
             parse_messages_request({"messages": user, "max_tokens": 5, "jumpahead": EVERY}),
             parse_messages_request({"messages": user, "jumpahead": EVERY}, for_counting=True),
             parse_responses_request({"input": "hi", "jumpahead": EVERY})[0]]
    for turn in turns:
        assert turn.options == parse_options(EVERY) and "jumpahead" not in turn.extra
    for parse in (lambda j: parse_chat_request({"messages": user, "jumpahead": j}),
                  lambda j: parse_messages_request({"messages": user, "max_tokens": 5, "jumpahead": j}),
                  lambda j: parse_responses_request({"input": "hi", "jumpahead": j})):
        with pytest.raises(APIError, match="jumpahead.tool_calls"):
            parse({"tool_calls": 0})


def test_the_typed_fields_that_drive_behaviour() -> None:
    user = [{"role": "user", "content": "hi"}]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = parse_chat_request({"messages": [*user, {"role": "assistant", "content": "Sure"}], "parallel_tool_calls": False,
                               "continue_final_message": True,
                               "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    assert chat.parallel_tool_calls is False and chat.continue_final
    assert chat.response_format.grammar() == {"type": "json_schema", "schema": schema, "strict": True}
    responses, _ = parse_responses_request({"input": "hi", "text": {"format": {"type": "json_schema", "name": "n",
                                                                                "schema": schema, "strict": False}}})
    assert responses.response_format.grammar() == {"type": "json_schema", "schema": schema, "strict": False}
    messages = parse_messages_request({"messages": user, "max_tokens": 5,
                                       "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert messages.response_format.grammar() == chat.response_format.grammar()  # one form, whichever protocol asked
    assert chat.response_format.as_openai() == {"type": "json_schema",
                                                 "json_schema": {"name": "n", "schema": schema, "strict": True}}
    plain = parse_chat_request({"messages": user})
    assert plain.response_format is None and plain.parallel_tool_calls is None and not plain.continue_final


def test_the_readme_table_lists_every_option() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## The per-request `jumpahead` field", 1)[1].split("\n## ", 1)[0]
    keys = [line.split("|")[1].strip().strip("`") for line in section.splitlines()
            if line.startswith("| `")]
    assert keys == list(OPTION_NAMES)


def _source_files() -> list[Path]:
    return [p for package in ("core", "proxy", "policies", "engine", "traces", "live", "bench", "app")
            for p in sorted((ROOT / package).rglob("*.py"))]


def test_no_module_reads_the_raw_object_but_the_parser() -> None:
    """No `x.get("jumpahead")` or `x["jumpahead"]` read outside core/options.py (writing
    the object into a client's request body, or into a response, is not reading it)."""
    reads = []
    for path in _source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            if key == "jumpahead" and path.relative_to(ROOT).as_posix() not in ("core/options.py",):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    # the three wire protocols hand the body's value to the parser: body.get("jumpahead") there
    protocols = {"proxy/openai_chat.py", "proxy/anthropic_messages.py", "proxy/openai_responses.py"}
    assert {r.split(":")[0] for r in reads} <= protocols, reads
    for path in protocols:
        assert 'parse_options(body.get("jumpahead"))' in (ROOT / path).read_text(), path


def test_the_session_option_names_the_session() -> None:
    from jumpahead.proxy.session_identity import session_id

    turn = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "jumpahead": {"session": "mine"}})
    assert session_id({}, {}, turn) == "mine"
    assert session_id({"x-session-id": "header"}, {}, turn) == "header"  # a header first, as before


def test_an_unknown_option_is_a_400_on_every_endpoint(engine) -> None:
    from .serving import serve

    user = [{"role": "user", "content": "hi"}]
    bodies = {"/v1/chat/completions": {"messages": user, "max_tokens": 1},
              "/v1/messages": {"messages": user, "max_tokens": 1},
              "/v1/messages/count_tokens": {"messages": user},
              "/v1/responses": {"input": "hi", "max_output_tokens": 1},
              "/v1/responses/compact": {"input": "hi"}}
    with serve(engine) as url:
        for path, body in bodies.items():
            r = httpx.post(f"{url}{path}", json={**body, "jumpahead": {"methods": ["none"], "mehtods": ["echo"]}},
                           timeout=60)
            assert r.status_code == 400 and "mehtods" in r.json()["error"]["message"], (path, r.text)
