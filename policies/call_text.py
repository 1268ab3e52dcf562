"""A tool call being written, and how to finish it: the policies' view of the family
modules' partial-call readers (engine/strict/tool_formats/).

The Hermes / ChatML JSON form's reader and completer are `parse_partial` and `complete`
(engine/strict/tool_formats/partial.py); every family's are `family.read(call_text)` and
`family.complete(call, items, layout)` (engine/strict/tool_formats/<family>.py). Policies never
guess a layout they cannot read: anything unexpected is None.
"""

from __future__ import annotations

from jumpahead.engine.strict.tool_formats.base import PartialCall
from jumpahead.engine.strict.tool_formats.partial import (
    DEFAULT_END,
    DEFAULT_START,
    STAGES,
    CallFormat,
    _scan_arguments,
    _string,
    complete,
    parse_partial,
)

__all__ = ["DEFAULT_END", "DEFAULT_START", "STAGES", "CallFormat", "PartialCall", "_scan_arguments", "_string",
           "complete", "parse_partial"]
