"""What every tool-call family module provides (engine/strict/tool_formats/<family>.py).

A family is one `ToolFamily`: the output parser's markers, the xgrammar structural tag
it maps to, its parser, and a `Format` object that knows the family's text:

- `write(calls)`: the calls as the family's chat template writes them (from the start
  marker on, without the end of the turn);
- `read(call_text)`: the call being written (the parser's `call_text`, the text after
  the start marker) as a `PartialCall` (name, finished arguments, where the writer
  stands), or None where the text is not a readable prefix of the family's layout;
- `complete(call, items)`: the text that finishes that call with the arguments still to
  write and closes it, as the template would write it (None where they do not fit);
- `scanner()`: an incremental reader of a call's text for the boundary tracker, giving
  `("tool_name", name)` and `("argument_key", key)` as they are crossed;
- `calls_in(text)`: the complete calls written in a text (a rendered context);
- `call_end(text, pos)`: where the call open at `pos` of a complete text ends (after its
  closing marker), for recorded continuations.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SEPARATORS = (", ", ": ")

ToolParser = Callable[[str, Any], Any]


def decoded_arguments(args: Any) -> dict[str, Any] | None:
    """A call's arguments as a dict (a JSON string is decoded); None when they are not an object."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return args if isinstance(args, dict) else None


@dataclass
class PartialCall:
    """A call being written: its name, the arguments already complete, where the writer
    stands (`STAGES` in partial.py) and, for families read by the writer's prefix, the
    call's text so far (`written`) and its index in the section (`index`)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)  # complete arguments, in written order
    stage: str = "outer"
    key: str | None = None  # stage after_key / after_colon / string: the key being written
    partial: str = ""  # stage key: key text so far; stage string: decoded value so far
    tail: str = ""  # stage outer: the opener text written after the name
    trailing_space: bool = False  # the text so far ends in whitespace
    written: str = ""  # the call's own text so far (families completed from the writer's text)
    index: int = 0  # the call's position among the calls of its section


@dataclass(frozen=True)
class EarlierCall:
    """A complete call written in a text, with its span."""

    name: str
    arguments: dict[str, Any]
    start: int
    end: int


class Format:
    """The text of one family's calls (see the module doc). Subclasses implement it."""

    family: str = ""

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        raise NotImplementedError

    def read(self, call_text: str) -> PartialCall | None:
        raise NotImplementedError

    def layout(self, call_text: str) -> Any:
        """The layout to complete with (separators the writer used)."""
        return self

    def complete(self, call: PartialCall, items: list[tuple[str, Any]], layout: Any = None) -> str | None:
        raise NotImplementedError

    def scanner(self) -> Any:
        raise NotImplementedError

    def calls_in(self, text: str) -> list[EarlierCall]:
        raise NotImplementedError

    def call_end(self, text: str, pos: int) -> int | None:
        raise NotImplementedError


@dataclass(frozen=True)
class ToolFamily:
    """One tool-call format. `start`/`end` are the output parser's call markers
    (`end` "": the calls run to the end of the output and are parsed together)."""

    name: str
    start: str
    end: str
    xgrammar: str | None  # xgrammar builtin structural tag key (None: built here)
    separator: str = ""  # between two calls where the builtin tag allows free text
    parser: str = ""  # mlx-lm tool_parsers module, or "jumpahead" (the family module's `parse`)
    format: Format | None = field(default=None, compare=False, hash=False, repr=False)
    own_parser: ToolParser | None = field(default=None, compare=False, hash=False, repr=False)
    # a structural tag built by the module where xgrammar has no builtin one (tools -> tag)
    build_tag: Callable[[list[dict]], dict] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def parse(self) -> ToolParser:
        """`parse_tool_call(text, tools)`: the family's parser (mlx-lm's where it has one)."""
        if self.own_parser is not None:
            return self.own_parser
        return importlib.import_module(f"mlx_lm.tool_parsers.{self.parser}").parse_tool_call

    # the Format's operations, on the family
    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        assert self.format is not None
        return self.format.write(calls)

    def read(self, call_text: str) -> PartialCall | None:
        assert self.format is not None
        return self.format.read(call_text)

    def layout(self, call_text: str) -> Any:
        assert self.format is not None
        return self.format.layout(call_text)

    def complete(self, call: PartialCall, items: list[tuple[str, Any]], layout: Any = None) -> str | None:
        assert self.format is not None
        return self.format.complete(call, items, layout)

    def scanner(self) -> Any:
        assert self.format is not None
        return self.format.scanner()

    def calls_in(self, text: str) -> list[EarlierCall]:
        assert self.format is not None
        return self.format.calls_in(text)

    def call_end(self, text: str, pos: int) -> int | None:
        assert self.format is not None
        return self.format.call_end(text, pos)
