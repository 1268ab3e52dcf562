"""Kimi K2: a section of numbered calls,

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>

Parser: mlx-lm's `kimi_k2` (markers: the section's). Grammar: xgrammar's `kimi` tag
(grammar.py fixes each call's index where the position is known).
"""

from __future__ import annotations

from .base import ToolFamily
from .partial import JsonFormat

START, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

FORMAT = JsonFormat(
    "kimi", start=START, split=CALL, leading_split=True, head="functions.", name_re=r"([^\s:<]+)(?=:)",
    opener=lambda item, key, index: f":{index}{ARGS}{{", closer=CALL_END, section_end=END,
    guards=(CALL_END, END, CALL), parse=None, parser_end=END)

FAMILY = ToolFamily("kimi", START, END, "kimi", parser="kimi_k2", format=FORMAT)
FORMAT.parse = FAMILY.parse
