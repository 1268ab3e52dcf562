"""Llama 3.x JSON tool calling: the assistant message is one bare JSON object,
`{"name": NAME, "parameters": {...}}`; several are joined with "; " (as vLLM's
llama3_json parser reads them; the Meta template itself renders only one). The output
parser's start marker `{"name": ` is part of the object, so the parser's text arrives
without it. Parser: here (mlx-lm has none).
"""

from __future__ import annotations

import json
from typing import Any

from .base import ToolFamily
from .partial import JsonFormat

START = '{"name": '
SPLIT = "; "

_DECODER = json.JSONDecoder()


def parse_llama3_json(text: str, tools: Any = None) -> list[dict]:
    text = START + text
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


FORMAT = JsonFormat(
    "llama3_json", start=START, split=SPLIT + START, head='"', name_re=r'((?:[^"\\]|\\.)*)(?=")', json_name=True,
    opener=lambda item, key, index: f'"{item}"parameters"{key}{{', closer="}", parse=parse_llama3_json,
    stops=("<|eot_id|>", "<|eom_id|>"))

FAMILY = ToolFamily("llama3_json", START, "", "llama", "; ", parser="jumpahead", format=FORMAT,
                    own_parser=parse_llama3_json)
