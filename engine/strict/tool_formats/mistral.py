"""Mistral (tokenizer v11+: Mistral Small 3.2, Devstral): `[TOOL_CALLS]NAME[ARGS]{...}`
per call, calls back to back, no end marker (the calls run to the end of the output).
Parser: mlx-lm's `mistral`. xgrammar has no builtin tag: `build_tag` makes one.
"""

from __future__ import annotations

from .base import ToolFamily
from .partial import JsonFormat

START = "[TOOL_CALLS]"


def build_tag(tools: list[dict]) -> dict:
    """`[TOOL_CALLS]name[ARGS]{...}` per call, calls back to back (Mistral v11+ templates)."""
    tags = [{"type": "tag", "begin": f"[TOOL_CALLS]{t['function']['name']}[ARGS]",
             "content": {"type": "json_schema", "json_schema": t["function"]["parameters"], "style": "json"},
             "end": ""} for t in tools]
    return {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": tags, "separator": ""}}


FORMAT = JsonFormat(
    "mistral", start=START, split=START, head="", name_re=r"([\w-]+)(?=\s*\[)",
    opener=lambda item, key, index: "[ARGS]{", closer="", guards=(START,), parser_end="", stops=("</s>",))

FAMILY = ToolFamily("mistral", START, "", None, parser="mistral", format=FORMAT, build_tag=build_tag)
FORMAT.parse = FAMILY.parse
