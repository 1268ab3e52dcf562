"""The output parser's tool-call markers and parser for a tokenizer. The parsers
themselves live with their families (engine/strict/tool_formats/<family>.py: harmony, DeepSeek
and Llama 3 JSON are jumpahead's; the others are mlx-lm's), re-exported here."""

from __future__ import annotations

from typing import Any

from jumpahead.engine.strict.tool_formats import ToolFamily, ToolParser, detect_family
from jumpahead.engine.strict.tool_formats.deepseek import parse_deepseek
from jumpahead.engine.strict.tool_formats.harmony import parse_harmony
from jumpahead.engine.strict.tool_formats.llama3_json import parse_llama3_json

__all__ = ["ToolParser", "parse_deepseek", "parse_harmony", "parse_llama3_json", "tool_markers"]


def tool_markers(tokenizer: Any) -> tuple[str | None, str | None, ToolParser | None, ToolFamily | None]:
    """(start, end, parser, family) for a TokenizerWrapper: mlx-lm's parser and markers
    where it has them, else the detected family's own."""
    family = detect_family(tokenizer)
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is not None:
        return getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None), parser, family
    if family is not None and family.own_parser is not None:
        return family.start, family.end, family.own_parser, family
    return None, None, None, family
