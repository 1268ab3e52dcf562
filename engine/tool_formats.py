"""Tool-call families: which format a model's chat template writes calls in, and the
grammar that makes `tool_choice` required / named produce exactly that format.

A family is detected from the tokenizer (mlx-lm's inferred tool parser, else markers in
the chat template). Its grammar is xgrammar's own structural tag for the model
(`xgrammar.get_model_structural_tag`), adjusted for what the proxy asks of it:

- the answer is the calls and nothing else: free text that a builtin tag lets in before
  or between calls (`triggered_tags`) is replaced by the family's separator;
- one call or any number (`parallel_tool_calls`), or exactly `count` calls;
- JSON arguments use the separators chat templates render with `tojson` (`", "`,
  `": "`), so the model writes what its own template would and strict fill has
  fixed text to supply (free whitespace also lets a weak model loop on blanks).

Mistral has no builtin tag in xgrammar; its tag is built here in the same shape.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Sequence

import xgrammar as xg

from .types import EngineError

SEPARATORS = (", ", ": ")


@dataclass(frozen=True)
class ToolFamily:
    """One tool-call format. `start`/`end` are the output parser's call markers
    (`end` "": the calls run to the end of the output and are parsed together)."""

    name: str
    start: str
    end: str
    xgrammar: str | None  # xgrammar builtin structural tag key (None: built here)
    separator: str = ""  # between two calls where the builtin tag allows free text
    parser: str = ""  # mlx-lm tool_parsers module, or "jumpahead" (proxy/tool_parsers.py)


FAMILIES: dict[str, ToolFamily] = {f.name: f for f in (
    ToolFamily("hermes", "<tool_call>", "</tool_call>", "qwen_3", "\n", parser="json_tools"),
    ToolFamily("qwen3_coder", "<tool_call>", "</tool_call>", "qwen_3_coder", "\n", parser="qwen3_coder"),
    ToolFamily("glm", "<tool_call>", "</tool_call>", "glm_4_7", "", parser="glm47"),
    ToolFamily("kimi", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "kimi", parser="kimi_k2"),
    ToolFamily("mistral", "[TOOL_CALLS]", "", None, parser="mistral"),
    # harmony: each call is its own message (`<|call|>`, then `<|start|>assistant`)
    ToolFamily("harmony", "<|channel|>commentary to=", "", "harmony", parser="jumpahead"),
    ToolFamily("deepseek_v3", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "deepseek_v3_1", parser="jumpahead"),
    ToolFamily("deepseek_r1", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "deepseek_r1", parser="jumpahead"),
    # Llama 3.x writes one bare JSON object; several are joined with "; " (as vLLM's
    # llama3_json parser reads them; the Meta template itself renders only one).
    ToolFamily("llama3_json", '{"name": ', "", "llama", "; ", parser="jumpahead"),
)}

# mlx-lm's tool parser module (inferred from the template) -> family
_BY_MLX_PARSER = {"json_tools": "hermes", "qwen3_coder": "qwen3_coder", "glm47": "glm", "kimi_k2": "kimi",
                  "mistral": "mistral"}


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


def _function(tool: dict) -> dict:
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def _openai_tools(tools: Sequence[dict], name: str | None) -> list[dict]:
    out = []
    for tool in tools:
        fn = _function(tool)
        if not isinstance(fn.get("name"), str) or not fn["name"] or (name is not None and fn["name"] != name):
            continue
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": {"name": fn["name"], "parameters": params}})
    if not out:
        raise EngineError(f"tool_choice names a function that is not among the tools: {name!r}" if name
                          else "tool_choice requires tools")
    return out


def _mistral_tag(tools: list[dict]) -> dict:
    """`[TOOL_CALLS]name[ARGS]{...}` per call, calls back to back (Mistral v11+ templates)."""
    tags = [{"type": "tag", "begin": f"[TOOL_CALLS]{t['function']['name']}[ARGS]",
             "content": {"type": "json_schema", "json_schema": t["function"]["parameters"], "style": "json"},
             "end": ""} for t in tools]
    return {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": tags, "separator": ""}}


def _calls_node(fmt: dict) -> dict | None:
    """The node of a structural tag that holds the call tags."""
    if fmt.get("type") in ("triggered_tags", "tags_with_separator") and fmt.get("tags"):
        return fmt
    for key in ("content", "format"):
        child = fmt.get(key)
        if isinstance(child, dict) and (hit := _calls_node(child)):
            return hit
    for child in fmt.get("elements") or []:
        if isinstance(child, dict) and (hit := _calls_node(child)):
            return hit
    return None


def _compact_json(node: Any, strict: bool) -> Any:
    """JSON-style argument contents as a grammar with the template's separators."""
    if isinstance(node, list):
        return [_compact_json(x, strict) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and node.get("style", "json") == "json":
        grammar = xg.Grammar.from_json_schema(json.dumps(node["json_schema"]), any_whitespace=False,
                                              separators=SEPARATORS, strict_mode=strict)
        return {"type": "grammar", "grammar": str(grammar)}
    return {k: _compact_json(v, strict) for k, v in node.items()}


def structural_tag(family: ToolFamily, tools: Sequence[dict], name: str | None = None,
                   parallel: bool = True, count: int | None = None, strict: bool = True) -> dict:
    """The structural tag (as a dict) for an answer that is only tool calls of `family`.

    `name`: calls of that function only, one call unless `count`; else at least one
    call of any of `tools`, more only when `parallel`; `count`: exactly that many.
    """
    chosen = _openai_tools(tools, name)
    if count is not None and count < 1:
        raise EngineError("the number of tool calls must be at least 1")
    if family.xgrammar is None:
        tag = _mistral_tag(chosen)
    else:
        try:
            tag = xg.get_model_structural_tag(family.xgrammar, tools=chosen, tool_choice="required",
                                              reasoning="disabled").model_dump(exclude_none=True, mode="json")
        except ValueError as exc:
            raise EngineError(f"cannot build the {family.name} tool-call grammar: {exc}") from exc
    tag = copy.deepcopy(tag)
    node = _calls_node(tag["format"])
    if node is None:
        raise EngineError(f"xgrammar's {family.xgrammar} tag has no call list")
    tags = node["tags"]
    sep = node.get("separator", family.separator) if node["type"] == "tags_with_separator" else family.separator
    if count is None and (name is not None or not parallel):
        count = 1
    node.clear()
    if count is None:
        node.update({"type": "tags_with_separator", "tags": tags, "separator": sep, "at_least_one": True})
    else:
        one = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        elements: list[dict] = []
        for i in range(count):
            if i and sep:
                elements.append({"type": "const_string", "value": sep})
            elements.append(_call_index(copy.deepcopy(one), i))
        node.update({"type": "sequence", "elements": elements} if count > 1 else elements[0])
    return _compact_json(tag, strict)


def _call_index(node: Any, index: int) -> Any:
    """Kimi numbers its call ids (`functions.NAME:INDEX`): where the position is known,
    the index is fixed instead of left to the model (`\\d+`)."""
    if isinstance(node, list):
        return [_call_index(x, index) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "regex" and node.get("pattern") == r"\d+":
        return {"type": "const_string", "value": str(index)}
    return {k: _call_index(v, index) for k, v in node.items()}
