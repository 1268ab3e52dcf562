"""The grammar that makes `tool_choice` required / named produce exactly a family's format.

A family's grammar is xgrammar's own structural tag for the model
(`xgrammar.get_model_structural_tag`), adjusted for what the proxy asks of it:

- the answer is the calls and nothing else: free text that a builtin tag lets in before
  or between calls (`triggered_tags`) is replaced by the family's separator;
- one call or any number (`parallel_tool_calls`), or exactly `count` calls;
- JSON arguments use the separators chat templates render with `tojson` (`", "`,
  `": "`), so the model writes what its own template would and strict fill has
  fixed text to supply (free whitespace also lets a weak model loop on blanks).

Mistral has no builtin tag in xgrammar; its module builds one in the same shape
(`ToolFamily.build_tag`).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Sequence

import xgrammar as xg

from ...types import EngineError
from .base import SEPARATORS, ToolFamily


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
        assert family.build_tag is not None, family.name
        tag = family.build_tag(chosen)
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
