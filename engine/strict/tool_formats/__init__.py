"""Tool-call families: which format a model's chat template writes calls in, one module
per family (hermes, qwen3_coder, glm, kimi, mistral, harmony, deepseek, llama3_json).

Each module holds the family's markers, its parser (mlx-lm's module named where mlx-lm
has one, else its own), its writer, its partial-call reader and completer, the scanner
the boundary tracker uses, and what its grammar needs (base.py says what a `Format`
provides). `FAMILIES` is built from the modules' `ToolFamily` objects; a new family is
its module and one line in `_MODULE_FAMILIES` (and its detection rule below when mlx-lm
does not infer its parser).

A family is detected from the tokenizer (mlx-lm's inferred tool parser, else markers in
the chat template). Its grammar (grammar.py, `structural_tag`) is xgrammar's own
structural tag for the model, adjusted for what the proxy asks of it.
"""

from __future__ import annotations

from typing import Any

from . import deepseek, glm, harmony, hermes, kimi, llama3_json, mistral, qwen3_coder
from .base import SEPARATORS, EarlierCall, Format, PartialCall, ToolFamily, ToolParser
from .grammar import structural_tag

_MODULE_FAMILIES = (hermes.FAMILY, qwen3_coder.FAMILY, glm.FAMILY, kimi.FAMILY, mistral.FAMILY, harmony.FAMILY,
                    deepseek.FAMILY_V3, deepseek.FAMILY_R1, llama3_json.FAMILY)

FAMILIES: dict[str, ToolFamily] = {f.name: f for f in _MODULE_FAMILIES}

# mlx-lm's tool parser module (inferred from the template) -> family
_BY_MLX_PARSER = {f.parser: f.name for f in _MODULE_FAMILIES if f.parser != "jumpahead"}

__all__ = ["FAMILIES", "SEPARATORS", "EarlierCall", "Format", "PartialCall", "ToolFamily", "ToolParser",
           "detect_family", "family_of", "structural_tag"]


def detect_family(tokenizer: Any) -> ToolFamily | None:
    """The family of a TokenizerWrapper's chat template (None: no known tool format)."""
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is not None:
        name = _BY_MLX_PARSER.get(getattr(parser, "__module__", "").rsplit(".", 1)[-1])
        return FAMILIES[name] if name else None
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    if "<|channel|>" in template and "<|call|>" in template:
        return FAMILIES["harmony"]
    if "<｜tool▁calls▁begin｜>" in template:
        return FAMILIES["deepseek_r1" if "```json" in template else "deepseek_v3"]
    if "<|start_header_id|>" in template and '"parameters": ' in template:
        return FAMILIES["llama3_json"]
    return None


def family_of(tokenizer: Any) -> ToolFamily:
    """The tokenizer's family, Hermes where none is detected (the form jumps read by default)."""
    return detect_family(tokenizer) or FAMILIES["hermes"]
