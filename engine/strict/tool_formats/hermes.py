"""Hermes / ChatML JSON calls (Qwen2.5, Qwen3, SmolLM, the default model):

    <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>

one call between each pair of markers, calls separated by a newline. Parser: mlx-lm's
`json_tools`. The partial reader and completer are partial.py's `parse_partial` and
`complete` (the form they were written for); the tracker's scanner is a JSON object scan.
"""

from __future__ import annotations

import json
from typing import Any

from .base import EarlierCall, Format, PartialCall, ToolFamily, decoded_arguments
from .partial import DEFAULT_END, DEFAULT_START, CallFormat, complete, parse_partial
from .scan import CallScanner


class HermesFormat(Format):
    family = "hermes"
    start, end = DEFAULT_START, DEFAULT_END

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        fmt = CallFormat()
        return "\n".join(f'{self.start}\n{{"name": {fmt.dump(n)}, "arguments": {fmt.dump(a)}}}\n{self.end}'
                         for n, a in calls)

    def read(self, call_text: str) -> PartialCall | None:
        return parse_partial(call_text)

    def layout(self, call_text: str) -> CallFormat:
        return CallFormat.detect(call_text, self.end)

    def complete(self, call: PartialCall, items: list[tuple[str, Any]], layout: Any = None) -> str | None:
        return complete(call, items, layout if isinstance(layout, CallFormat) else CallFormat(end=self.end))

    def scanner(self) -> CallScanner:
        return CallScanner()

    def calls_in(self, text: str, start: str = DEFAULT_START, end: str = DEFAULT_END) -> list[EarlierCall]:
        """The complete calls written in `text` in the `<tool_call>{json}</tool_call>` form."""
        calls: list[EarlierCall] = []
        pos = 0
        while (i := text.find(start, pos)) >= 0:
            j = text.find(end, i + len(start))
            if j < 0:
                break
            body = text[i + len(start) : j]
            pos = j + len(end)
            try:
                doc = json.loads(body)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("name"), str):
                args = decoded_arguments(doc.get("arguments", {}))
                if args is not None:
                    lead = len(body) - len(body.lstrip())
                    calls.append(EarlierCall(doc["name"], args, i + len(start) + lead, j))
        return calls

    def call_end(self, text: str, pos: int) -> int | None:
        j = text.find(self.end, pos)
        return None if j < 0 else j + len(self.end)


FAMILY = ToolFamily("hermes", DEFAULT_START, DEFAULT_END, "qwen_3", "\n", parser="json_tools", format=HermesFormat())
