"""Every tool-call family under grammar (engine/strict/tool_formats/, one module per family).

Each family is served with its chat template (tests/data/tool_templates/, written after
the family's published template) on the default model's weights and tokenizer: a model
folder of the default model's files with that template in tokenizer_config.json, loaded
with the real loading code (mlx-lm then infers the family's own parser from the
template, as it would for the real model). Oracles:

- grammar == template: the text the family's template renders for one and for two
  calls is accepted by the family's grammar, whole (xgrammar matcher);
- parsers == template: the family's parser (mlx-lm's where it has one) reads the
  template's rendering back into the same calls;
- through the real HTTP server and the OpenAI SDK, tool_choice "required" answers with
  one call (parallel_tool_calls false) and with two (`jumpahead.tool_calls: 2`): the
  raw output (from the trace recorder) is what the family's template renders for the
  calls the client received (modulo whitespace), those calls fit the tools' schemas,
  and the family's own parser accepts the raw text.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)

TEMPLATES = Path(__file__).parent / "data" / "tool_templates"
FAMILIES = ["hermes", "qwen3_coder", "glm", "kimi", "mistral", "harmony", "deepseek_v3", "llama3_json"]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CALLS_1 = [("get_weather", {"city": "Paris"})]
CALLS_2 = [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3})]

# What a family's template writes after the calls to end the assistant message.
END_OF_TURN = {"hermes": "<|im_end|>", "qwen3_coder": "<|im_end|>", "glm": "", "kimi": "<|im_end|>",
               "mistral": "<|im_end|>", "harmony": "", "deepseek_v3": "<｜end▁of▁sentence｜>",
               "llama3_json": "<|eot_id|>"}


@pytest.fixture(scope="module")
def default_folder() -> Path:
    from jumpahead.engine.model.default_model import ensure_default_model

    return Path(ensure_default_model(progress=lambda s: None))


def family_folder(default: Path, root: Path, family: str) -> Path:
    """The default model's files with `family`'s chat template (hermes: its own)."""
    if family == "hermes":
        return default
    folder = root / family
    if folder.exists():
        return folder
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).symlink_to(default / name)
    config = json.loads((default / "tokenizer_config.json").read_text())
    config["chat_template"] = (TEMPLATES / f"{family}.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tokenizers(default_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each family's TokenizerWrapper, loaded as mlx-lm loads a model folder's."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    root = tmp_path_factory.mktemp("families")
    return {f: load_tokenizer(family_folder(default_folder, root, f)) for f in FAMILIES}


def _message(calls: list[tuple[str, dict]]) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{i:09d}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}


def rendered_calls(family: str, tokenizer: Any, calls: list[tuple[str, dict]]) -> str:
    """The text the family's template writes for an assistant message of `calls`, from
    the generation prompt on, without its end-of-turn marker."""
    user = {"role": "user", "content": "Weather in Paris, and 2 + 3?"}
    if family == "llama3_json" and len(calls) > 1:  # the template renders one call a message
        return "; ".join(rendered_calls(family, tokenizer, [c]) for c in calls)
    base = tokenizer.apply_chat_template([user], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([user, _message(calls)], tools=TOOLS, tokenize=False)
    assert full.startswith(base), family
    text = full[len(base):].strip()
    end = END_OF_TURN[family]
    if end:
        assert text.endswith(end), (family, text)
        text = text[: -len(end)]
    return text


def own_parse(family: str, tokenizer: Any, raw: str) -> list[tuple[str, dict]]:
    """The calls in `raw`, read by the family's own parser: mlx-lm's where it has one,
    split at mlx-lm's markers; else jumpahead's (the family module's)."""
    from jumpahead.core.tool_parsers import tool_markers

    start, end, parser, fam = tool_markers(tokenizer)
    assert fam is not None and fam.name == family and parser is not None
    if getattr(tokenizer, "tool_parser", None) is None:
        assert raw.startswith(start), raw
        bodies = [raw[len(start):]]
    elif end:
        bodies = re.findall(re.escape(start) + "(.*?)" + re.escape(end), raw, re.DOTALL)
        assert squash("".join(start + b + end for b in bodies)) == squash(raw), raw
    else:
        assert raw.startswith(start), raw
        bodies = [raw[len(start):]]
    out = []
    for body in bodies:
        parsed = parser(body, TOOLS)
        for item in parsed if isinstance(parsed, list) else [parsed]:
            args = item["arguments"]
            out.append((item["name"], json.loads(args) if isinstance(args, str) else args))
    return out


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- detection ---------------------------------------------------------------------------


def test_each_template_is_detected_as_its_family(tokenizers):
    from jumpahead.engine.strict.tool_formats import detect_family

    for family, tok in tokenizers.items():
        found = detect_family(tok)
        assert found is not None and found.name == family, (family, found)
    # families mlx-lm reads itself keep mlx-lm's parser
    for family, module in [("hermes", "json_tools"), ("qwen3_coder", "qwen3_coder"), ("glm", "glm47"),
                           ("kimi", "kimi_k2"), ("mistral", "mistral")]:
        assert tokenizers[family].tool_parser.__module__.endswith(module)


# --- grammar == template, parser == template ----------------------------------------------


_BOOKS: dict[int, Any] = {}


def _grammar_accepts(tokenizer: Any, spec: dict, text: str) -> bool:
    import xgrammar as xg

    from jumpahead.engine.strict.grammar import GrammarBook

    book = _BOOKS.get(id(tokenizer))
    if book is None:
        book = _BOOKS[id(tokenizer)] = GrammarBook(tokenizer._tokenizer, 49152, tokenizer.eos_token_ids)
    matcher = xg.GrammarMatcher(book.compile(spec))
    return matcher.accept_string(text) and matcher.accept_token(sorted(tokenizer.eos_token_ids)[0]) \
        and matcher.is_terminated()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "harmony"])
def test_grammar_accepts_what_the_template_renders(tokenizers, family):
    tok = tokenizers[family]
    one, two = rendered_calls(family, tok, CALLS_1), rendered_calls(family, tok, CALLS_2)
    spec = {"type": "tool_calls", "family": family, "tools": TOOLS}
    assert _grammar_accepts(tok, spec, one) and _grammar_accepts(tok, spec, two), (one, two)
    assert _grammar_accepts(tok, {**spec, "count": 2}, two)
    assert not _grammar_accepts(tok, {**spec, "count": 2}, one)
    assert not _grammar_accepts(tok, {**spec, "parallel": False}, two)
    assert _grammar_accepts(tok, {**spec, "name": "get_weather"}, one)
    assert not _grammar_accepts(tok, {**spec, "name": "add"}, one)
    # text before the calls is not an answer under tool_choice required
    assert not _grammar_accepts(tok, spec, "Sure. " + one)


def test_harmony_grammar_accepts_the_harmony_message_layout(tokenizers):
    """The HF gpt-oss template puts the recipient in the header (`assistant to=...
    <|channel|>commentary json`); xgrammar's harmony tag writes the layout of the harmony
    spec (`<|channel|>commentary to=... <|constrain|>json`). Both are harmony; this checks
    the spec layout, as openai-harmony renders a call."""
    tok = tokenizers["harmony"]
    one = '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    two = one + '<|start|>assistant<|channel|>commentary to=functions.add<|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>'
    spec = {"type": "tool_calls", "family": "harmony", "tools": TOOLS}
    assert _grammar_accepts(tok, spec, one) and _grammar_accepts(tok, spec, two)
    assert _grammar_accepts(tok, {**spec, "count": 2}, two) and not _grammar_accepts(tok, {**spec, "count": 2}, one)
    assert own_parse("harmony", tok, one) == CALLS_1 and own_parse("harmony", tok, two) == CALLS_2


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "harmony"])
def test_family_parser_reads_the_template_rendering(tokenizers, family):
    tok = tokenizers[family]
    for calls in (CALLS_1, CALLS_2):
        assert own_parse(family, tok, rendered_calls(family, tok, calls)) == calls


def test_jumpahead_parsers_on_other_layouts():
    from jumpahead.core.tool_parsers import parse_deepseek, parse_harmony, parse_llama3_json

    r1 = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{"a": 1, "b": 2}\n```'
          '<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Rome"}\n```'
          '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert parse_deepseek(r1) == [{"name": "add", "arguments": {"a": 1, "b": 2}},
                                  {"name": "get_weather", "arguments": {"city": "Rome"}}]
    # harmony with the spec's space before <|constrain|>, and without a content type
    assert parse_harmony('functions.add <|constrain|>json<|message|>{"a": 1}<|call|>') == [
        {"name": "add", "arguments": {"a": 1}}]
    assert parse_harmony('functions.add<|message|>{}') == [{"name": "add", "arguments": {}}]
    assert parse_llama3_json('"add", "arguments": {"a": 1}}') == [{"name": "add", "arguments": {"a": 1}}]
    for bad, fn in [("functions.add<|message|>[1]", parse_harmony), ("nonsense", parse_harmony),
                    ("<｜tool▁call▁begin｜>add{}<｜tool▁call▁end｜>", parse_deepseek), ('"add", "parameters": [}', parse_llama3_json)]:
        with pytest.raises(ValueError):
            fn(bad)


def test_bad_family_or_count_is_an_engine_error(tokenizers):
    from jumpahead.engine.strict.grammar import GrammarBook
    from jumpahead.engine.types import EngineError

    tok = tokenizers["hermes"]
    book = GrammarBook(tok._tokenizer, 49152, tok.eos_token_ids)
    for spec in [{"type": "tool_calls", "family": "nope", "tools": TOOLS},
                 {"type": "tool_calls", "family": "kimi", "tools": TOOLS, "name": "missing"},
                 {"type": "tool_calls", "family": "kimi", "tools": TOOLS, "count": 0},
                 {"type": "tool_calls", "family": "kimi", "tools": []}]:
        with pytest.raises(EngineError):
            book.compile(spec)


# --- through the real server ----------------------------------------------------------------


@pytest.mark.slow  # ~6 min for the 8 families on 2 quiet cores (a model load and two answers each)
@pytest.mark.parametrize("family", FAMILIES)
def test_required_answers_in_the_family_format_over_http(default_folder, tmp_path, family):
    from openai import OpenAI

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model
    from jumpahead.traces.recorder import TraceRecorder
    from jumpahead.traces.trace_file import read_trace
    from tests.serving import serve

    model, tok, info = load_model(str(family_folder(default_folder, tmp_path, family)), progress=lambda s: None)
    engine = Engine(model, tok, info, EngineConfig(max_batch=2, prefix_cache_dir=str(tmp_path / "cache")))
    recorder = TraceRecorder(tmp_path / "traces", tokenizer=tok, model=family)
    answers = []
    try:
        with serve(engine, hooks=[recorder]) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=1800)
            user = [{"role": "user", "content": "What is the weather in Paris? And what is 2 + 3?"}]
            for n, extra in [(1, {"parallel_tool_calls": False}), (2, {"extra_body": {"jumpahead": {"tool_calls": 2}}})]:
                out = client.chat.completions.create(model="m", messages=user, tools=TOOLS, tool_choice="required",
                                                     temperature=0, max_tokens=256, **extra)
                answers.append((n, out.choices[0]))
    finally:
        recorder.close()
        engine.close()
    turns = [t for path in sorted((tmp_path / "traces").glob("*.jsonl")) for t in read_trace(path)[1]]
    raws = [turn["response"]["runs"] for turn in turns]
    assert len(raws) == 2
    for (n, choice), runs in zip(answers, raws):
        msg = choice.message
        assert choice.finish_reason == "tool_calls" and not msg.content, (family, choice)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
        assert len(calls) == n, (family, calls)
        for name, args in calls:
            jsonschema.validate(args, SCHEMAS[name])
        raw = "".join(r["text"] for r in runs)
        for eos in ("<|im_end|>", "<|endoftext|>"):  # the model's EOS tokens (it may end on either)
            raw = raw.removesuffix(eos)
        raw = raw.strip()
        assert own_parse(family, tok, raw) == calls, (family, raw)
        if family != "harmony":  # see test_harmony_grammar_accepts_the_harmony_message_layout
            assert squash(raw) == squash(rendered_calls(family, tok, calls)), (family, raw)


# --- proxy wiring --------------------------------------------------------------------------


def _turn(**kw: Any) -> Any:
    from jumpahead.core.turn import Message, Tool, ToolChoice, Turn

    tools = [Tool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in TOOLS]
    return Turn(messages=[Message("user", "hi")], tools=tools, tool_choice=kw.pop("choice", ToolChoice("required")), **kw)


def test_tool_choice_maps_to_the_family_grammar(tokenizers):
    from jumpahead.core.errors import APIError
    from jumpahead.core.options import parse_options
    from jumpahead.core.turn_runner import strict_fill_fields
    from jumpahead.core.turn import ToolChoice

    for family, tok in tokenizers.items():
        turn = _turn()
        grammar, _ = strict_fill_fields(tok, turn, turn.tools, False)
        assert (grammar["type"], grammar["family"], grammar["parallel"]) == ("tool_calls", family, False)
        assert "count" not in grammar and "name" not in grammar
    tok = tokenizers["kimi"]
    turn = _turn(parallel_tool_calls=True)
    assert strict_fill_fields(tok, turn, turn.tools, False)[0]["parallel"] is True
    turn = _turn(choice=ToolChoice("function", "add"), options=parse_options({"tool_calls": 3}))
    grammar, _ = strict_fill_fields(tok, turn, turn.tools, False)
    assert (grammar["name"], grammar["parallel"], grammar["count"]) == ("add", False, 3)
    turn = _turn(choice=ToolChoice("auto"))
    assert strict_fill_fields(tok, turn, turn.tools, False)[0] is None  # auto: the template scaffold only
    for bad in (0, 65, "2", 1.5, True):  # refused where the request is read, before any grammar
        with pytest.raises(APIError) as err:
            parse_options({"tool_calls": bad})
        assert err.value.status == 400 and "jumpahead.tool_calls" in str(err.value)


@pytest.mark.parametrize("family", ["harmony", "deepseek_v3", "llama3_json"])
def test_output_parser_reads_families_mlx_lm_has_no_parser_for(tokenizers, family):
    from jumpahead.core.output_parser import OutputParser
    from jumpahead.core.turn import ToolCallDelta

    tok = tokenizers[family]
    text = {"harmony": '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"city": "Paris"}'
                       '<|call|><|start|>assistant<|channel|>commentary to=functions.add<|constrain|>json<|message|>'
                       '{"a": 2, "b": 3}<|call|>'}.get(family) or rendered_calls(family, tok, CALLS_2)
    turn = _turn()
    parser = OutputParser.for_tokenizer(tok, turn.tools)
    events = [e for i in range(0, len(text), 7) for e in parser.feed(text[i:i + 7])] + parser.finish()
    calls = [(e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, ToolCallDelta)]
    assert calls == CALLS_2 and not parser.malformed and all(not c.issues for c in parser.tool_calls)
    # without tools the same text is plain content
    plain = OutputParser.for_tokenizer(tok, None)
    assert not [e for e in plain.feed(text) + plain.finish() if isinstance(e, ToolCallDelta)]
