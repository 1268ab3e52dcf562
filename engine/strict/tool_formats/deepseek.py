"""DeepSeek: between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each call is

    <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>                       (V3.1: `deepseek_v3`)
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>  (V3, R1: `deepseek_r1`)

One parser reads both layouts (mlx-lm has none); the family is told apart by the
template (a ```json fence: R1's).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import ToolFamily
from .partial import JsonFormat

START, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"

_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
_DS_R1 = re.compile(r"^\s*function<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*)\n```\s*$", re.DOTALL)
_DS_V31 = re.compile(r"^\s*([^<\s]+)\s*<｜tool▁sep｜>(.*)$", re.DOTALL)


def _object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("tool-call arguments are not a JSON object")
    return value


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


_GUARDS = (CALL_END, END, CALL, SEP)

FORMAT_V3 = JsonFormat(
    "deepseek_v3", start=START, split=CALL, leading_split=True, head="", name_re=r"([^\s<]+)(?=\s*<)",
    opener=lambda item, key, index: SEP + "{", closer=CALL_END, section_end=END, guards=_GUARDS,
    parse=parse_deepseek, parser_end=END)
FORMAT_R1 = JsonFormat(
    "deepseek_r1", start=START, split=CALL, leading_split=True, head="function" + SEP, name_re=r"([^\n<]+)(?=\n)",
    opener=lambda item, key, index: "\n```json\n{", closer="\n```" + CALL_END, section_end=END, between="\n",
    guards=_GUARDS, parse=parse_deepseek, parser_end=END)

FAMILY_V3 = ToolFamily("deepseek_v3", START, END, "deepseek_v3_1", parser="jumpahead", format=FORMAT_V3,
                       own_parser=parse_deepseek)
FAMILY_R1 = ToolFamily("deepseek_r1", START, END, "deepseek_r1", parser="jumpahead", format=FORMAT_R1,
                       own_parser=parse_deepseek)
