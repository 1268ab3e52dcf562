"""gpt-oss harmony: each call is its own assistant message on the commentary channel,

    <|channel|>commentary to=functions.NAME<|constrain|>json<|message|>{...}<|call|>

further calls as `<|start|>assistant<|channel|>commentary to=...` (the layout of the
harmony spec, which xgrammar's `harmony` tag and openai-harmony write; the Hugging Face
template puts the recipient in the header instead). The output parser's start marker is
the first `<|channel|>commentary to=`; the calls run to the end of the output.

Parsed here rather than with `openai-harmony`: that library parses token ids of its
o200k vocabulary, which it downloads at first use (no download is possible offline,
and a model served here may not use that vocabulary's ids).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import ToolFamily
from .partial import JsonFormat

START = "<|channel|>commentary to="
CALL_END = "<|call|>"
NEXT = "<|start|>assistant" + START

# After the first "<|channel|>commentary to=" (the output parser's start marker) each call
# is `functions.NAME [<|constrain|>json]<|message|>{...}<|call|>`; further calls are new
# messages, `<|start|>assistant<|channel|>commentary to=...`.
_HARMONY_CALL = re.compile(
    r"^\s*(?:functions\.)?([^\s<]+)\s*(?:<\|constrain\|>\s*json\s*)?<\|message\|>(.*?)(?:<\|call\|>)?\s*$", re.DOTALL)
_HARMONY_NEXT = re.compile(r"<\|call\|>\s*(?:<\|start\|>\s*assistant\s*)?<\|channel\|>\s*commentary\s+to=")


def _object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("tool-call arguments are not a JSON object")
    return value


def parse_harmony(text: str, tools: Any = None) -> list[dict]:
    calls = []
    for part in _HARMONY_NEXT.split(text):
        match = _HARMONY_CALL.match(part)
        if match is None:
            raise ValueError(f"not a harmony tool call: {part[:80]!r}")
        calls.append({"name": match.group(1), "arguments": _object(match.group(2).strip())})
    return calls


FORMAT = JsonFormat(
    "harmony", start=START, split=NEXT, split_find=START, head="functions.", name_re=r"([^\s<]+)(?=\s*<)",
    opener=lambda item, key, index: "<|constrain|>json<|message|>{", closer=CALL_END,
    guards=(CALL_END, "<|start|>", "<|channel|>"), parse=parse_harmony, stops=("<|return|>", "<|end|>"))

FAMILY = ToolFamily("harmony", START, "", "harmony", parser="jumpahead", format=FORMAT, own_parser=parse_harmony)
