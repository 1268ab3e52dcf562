"""Tool-call parsers for the families mlx-lm has none for: gpt-oss harmony, DeepSeek
(V3/V3.1 and R1 layouts) and Llama 3 JSON, with the mlx-lm signature
`parse_tool_call(text, tools) -> dict | list[dict]` (raising ValueError on text that is
not a call), and `tool_markers(tokenizer)`: the output parser's markers and parser for
a tokenizer, mlx-lm's own where it has one.

Harmony is parsed here rather than with `openai-harmony`: that library parses token ids
of its o200k vocabulary, which it downloads at first use (no download is possible
offline, and a model served here may not use that vocabulary's ids).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from jumpahead.engine.tool_formats import ToolFamily, detect_family

ToolParser = Callable[[str, Any], Any]

_DECODER = json.JSONDecoder()


def _object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("tool-call arguments are not a JSON object")
    return value


# --- harmony (gpt-oss) ------------------------------------------------------------------
# After the first "<|channel|>commentary to=" (the output parser's start marker) each call
# is `functions.NAME [<|constrain|>json]<|message|>{...}<|call|>`; further calls are new
# messages, `<|start|>assistant<|channel|>commentary to=...`.
_HARMONY_CALL = re.compile(
    r"^\s*(?:functions\.)?([^\s<]+)\s*(?:<\|constrain\|>\s*json\s*)?<\|message\|>(.*?)(?:<\|call\|>)?\s*$", re.DOTALL)
_HARMONY_NEXT = re.compile(r"<\|call\|>\s*(?:<\|start\|>\s*assistant\s*)?<\|channel\|>\s*commentary\s+to=")


def parse_harmony(text: str, tools: Any = None) -> list[dict]:
    calls = []
    for part in _HARMONY_NEXT.split(text):
        match = _HARMONY_CALL.match(part)
        if match is None:
            raise ValueError(f"not a harmony tool call: {part[:80]!r}")
        calls.append({"name": match.group(1), "arguments": _object(match.group(2).strip())})
    return calls


# --- DeepSeek ---------------------------------------------------------------------------
# Between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, each call is
# `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (V3.1) or
# `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>` (V3, R1).
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
_DS_R1 = re.compile(r"^\s*function<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*)\n```\s*$", re.DOTALL)
_DS_V31 = re.compile(r"^\s*([^<\s]+)\s*<｜tool▁sep｜>(.*)$", re.DOTALL)


def parse_deepseek(text: str, tools: Any = None) -> list[dict]:
    bodies = _DS_CALL.findall(text)
    if not bodies:
        raise ValueError("no DeepSeek tool call")
    calls = []
    for body in bodies:
        match = _DS_R1.match(body) or _DS_V31.match(body)
        if match is None:
            raise ValueError(f"not a DeepSeek tool call: {body[:80]!r}")
        calls.append({"name": match.group(1).strip(), "arguments": _object(match.group(2).strip())})
    return calls


# --- Llama 3 JSON -----------------------------------------------------------------------
# `{"name": NAME, "parameters": {...}}`, several joined by "; " (vLLM's llama3_json reading);
# the text arrives without the `{"name": ` start marker the output parser consumed.
def parse_llama3_json(text: str, tools: Any = None) -> list[dict]:
    text = '{"name": ' + text
    calls, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n;":
            pos += 1
        if pos >= len(text):
            break
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a Llama 3 JSON tool call: {exc}") from exc
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError("a Llama 3 tool call needs a string 'name'")
        arguments = item.get("parameters", item.get("arguments", {}))
        if not isinstance(arguments, dict):
            raise ValueError("Llama 3 tool-call parameters are not a JSON object")
        calls.append({"name": item["name"], "arguments": arguments})
    if not calls:
        raise ValueError("no Llama 3 tool call")
    return calls


_PARSERS: dict[str, ToolParser] = {
    "harmony": parse_harmony,
    "deepseek_v3": parse_deepseek,
    "deepseek_r1": parse_deepseek,
    "llama3_json": parse_llama3_json,
}


def tool_markers(tokenizer: Any) -> tuple[str | None, str | None, ToolParser | None, ToolFamily | None]:
    """(start, end, parser, family) for a TokenizerWrapper: mlx-lm's parser and markers
    where it has them, else the detected family's from this module."""
    family = detect_family(tokenizer)
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is not None:
        return getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None), parser, family
    if family is not None and family.name in _PARSERS:
        return family.start, family.end, _PARSERS[family.name], family
    return None, None, None, family
