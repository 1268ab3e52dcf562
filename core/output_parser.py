"""Split the model's output text, fed in deltas, into reasoning, content and tool calls.

The parser is a small state machine over the text (not the tokens), so it gives the
same result however the text is chunked:

    start --<think>--> reasoning --</think>--> content --<tool_call>--> tool --</tool_call>--> content

- A prompt whose chat template already opened `<think>` starts in `reasoning`.
- Text that might be the beginning of a marker is held back until it is decided; a
  partial marker is never shown as text.
- A tool call's text is parsed, when its end marker arrives, with the tokenizer's tool
  parser (mlx-lm `tool_parsers`); one that fails to parse is surfaced as content text,
  markers included. Arguments are checked against the tool's JSON schema; problems are
  recorded on the call (`ToolCall.issues`), never raised.
- A JSON call (`{"name": ..., "arguments": ...}`) streams while it is written: a
  ToolCallStart once its name is complete, ToolCallArgs as its arguments grow
  (core/tool_stream.py), then the ToolCallDelta with the rest. A call that began
  (its name complete) stays a call: cut off at the end of the output it is a partial
  call (`ToolCall.partial`), never markup shown as text.
- Reasoning text carries no newlines at its start or end: chat templates add their
  own around it when the message is sent back (`<think>\n...\n</think>`), so the
  re-rendered history matches what was generated.
- Whitespace between content and tool calls is dropped; trailing whitespace of a
  text-only answer is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from .tool_stream import JsonCallStreamer
from .turn import (
    ContentDelta,
    OutputEvent,
    ReasoningDelta,
    Tool,
    ToolCall,
    ToolCallArgs,
    ToolCallDelta,
    ToolCallStart,
    new_tool_call_id,
)

log = logging.getLogger(__name__)

ToolParser = Callable[[str, Any], Any]

START, REASONING, CONTENT, TOOL = "start", "reasoning", "content", "tool"
DEFAULT_THINK = ("<think>", "</think>")
_MAX_ISSUES = 5


def _partial_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


class ToolCallValidator:
    """Checks a call against the request's tools: known name, arguments fit the schema."""

    def __init__(self, tools: list[Tool]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._validators: dict[str, Any] = {}

    def issues(self, name: str, arguments: Any) -> list[str]:
        if not self._tools:
            return []
        tool = self._tools.get(name)
        if tool is None:
            return [f"unknown tool {name!r}"]
        if not isinstance(arguments, dict):
            return ["arguments are not a JSON object"]
        if not tool.parameters:
            return []
        try:
            validator = self._validator(tool)
            errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        except Exception as exc:  # a schema jsonschema cannot use: report, go on
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return [f"schema of {name!r} not checkable: {first_line}"]
        return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors[:_MAX_ISSUES]]

    def _validator(self, tool: Tool) -> Any:
        validator = self._validators.get(tool.name)
        if validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(tool.parameters, default=jsonschema.Draft202012Validator)
            validator = cls(tool.parameters)
            self._validators[tool.name] = validator
        return validator


class OutputParser:
    """Incremental parser: `feed(text)` per delta, `finish()` once at the end."""

    def __init__(
        self,
        *,
        think_start: str | None = DEFAULT_THINK[0],
        think_end: str | None = DEFAULT_THINK[1],
        think_anywhere: bool = False,
        in_reasoning: bool = False,
        tool_start: str | None = None,
        tool_end: str | None = None,
        tool_parser: ToolParser | None = None,
        tools: list[Tool] | None = None,
        max_calls: int | None = None,
    ) -> None:
        self.think_start = think_start or None
        self.think_end = think_end or None
        # Where a dedicated think token exists it can open reasoning anywhere in the
        # content; a literal "<think>" only counts at the start of the output.
        self.think_anywhere = think_anywhere and self.think_start is not None
        self.tools = list(tools or [])
        self.tool_parser = tool_parser if tool_start else None
        self.tool_start = tool_start if self.tool_parser else None
        self.tool_end = tool_end or None
        self._openai_tools = [tool.as_openai() for tool in self.tools]
        self._validator = ToolCallValidator(self.tools)
        self._state = REASONING if (in_reasoning and self.think_end) else START
        self._buf = ""
        self._pending_ws = ""  # content whitespace not yet shown
        self._strip_leading = False  # drop whitespace at the start of the next content
        self._ws_before_marker = ""
        self._events: list[OutputEvent] = []
        self.tool_calls: list[ToolCall] = []
        self.malformed: list[str] = []  # tool-call texts that failed to parse
        self._reasoning_nl = ""  # newlines at the end of reasoning so far, not yet shown
        self._reasoning_begun = False  # the open reasoning block has shown text
        self._streamer: JsonCallStreamer | None = None  # the open call, when it is JSON
        self._stream_decided = False  # the open call's first character was seen
        self._start: ToolCall | None = None  # the open call, once announced
        # At most this many calls (`parallel_tool_calls: false` is 1): the output ends
        # after the last one allowed, and whatever follows it is dropped.
        self.max_calls = max_calls

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Any, tools: list[Tool] | None, *, in_reasoning: bool = False, max_calls: int | None = None
    ) -> OutputParser:
        """A parser with the markers and tool parser of an mlx-lm TokenizerWrapper.

        `tools` empty or None disables tool-call parsing (tool_choice none, no tools).
        """
        from .tool_parsers import tool_markers  # mlx-lm's parser, else the family's (harmony, DeepSeek, Llama 3)

        has_thinking = bool(getattr(tokenizer, "has_thinking", False))
        think = (tokenizer.think_start, tokenizer.think_end) if has_thinking else DEFAULT_THINK
        tool_start, tool_end, tool_parser, _ = tool_markers(tokenizer)
        return cls(
            think_start=think[0],
            think_end=think[1],
            think_anywhere=has_thinking,
            in_reasoning=in_reasoning,
            tool_start=tool_start if tools else None,
            tool_end=tool_end,
            tool_parser=tool_parser if tools else None,
            tools=tools,
            max_calls=max_calls,
        )

    # --- public ---------------------------------------------------------------

    @property
    def state(self) -> str:
        """Where the output is: "start", "reasoning", "content" or "tool" (policies watch it)."""
        return self._state

    @property
    def done(self) -> bool:
        """The calls allowed (`max_calls`) are all out: the rest of the output is dropped."""
        return self.max_calls is not None and len(self.tool_calls) >= self.max_calls

    @property
    def call_text(self) -> str:
        """Inside a tool call: its text so far, after the start marker ("" elsewhere)."""
        return self._buf if self._state == TOOL else ""

    def feed(self, text: str) -> list[OutputEvent]:
        self._buf += text
        self._drain(final=False)
        return self._take()

    def finish(self) -> list[OutputEvent]:
        self._drain(final=True)
        if self._pending_ws and not self.tool_calls:
            self._emit(ContentDelta(self._pending_ws))
        self._pending_ws = ""
        return self._take()

    # --- state machine --------------------------------------------------------

    def _take(self) -> list[OutputEvent]:
        events, self._events = self._events, []
        return events

    def _emit(self, event: OutputEvent) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(event, ReasoningDelta | ContentDelta) and type(last) is type(event):
            last.text += event.text  # type: ignore[union-attr]
        else:
            self._events.append(event)

    def _drain(self, final: bool) -> None:
        while True:
            if self.done:
                self._buf = ""
                return
            state = self._state
            if state == START:
                progressed = self._step_start(final)
            elif state == REASONING:
                progressed = self._step_reasoning(final)
            elif state == CONTENT:
                progressed = self._step_content(final)
            else:
                progressed = self._step_tool(final)
            if not progressed:
                return

    def _step_start(self, final: bool) -> bool:
        rest = self._buf.lstrip()
        if self.think_start and self.think_end:
            if rest.startswith(self.think_start):
                self._buf = rest[len(self.think_start) :]
                self._state = REASONING
                return True
            if not final and self.think_start.startswith(rest):
                return False  # only whitespace or a partial "<think>" so far
        self._state = CONTENT
        return True

    def _step_reasoning(self, final: bool) -> bool:
        assert self.think_end is not None
        ends = [(self.think_end, CONTENT)]
        if self.tool_start:  # a tool call may follow unclosed reasoning
            ends.append((self.tool_start, TOOL))
        found = [(i, marker, nxt) for marker, nxt in ends if (i := self._buf.find(marker)) >= 0]
        if found:
            i, marker, nxt = min(found)
            self._show_reasoning(self._buf[:i])
            self._end_reasoning()
            self._buf = self._buf[i + len(marker) :]
            self._state = nxt
            self._strip_leading = True
            return True
        keep = 0 if final else _partial_suffix(self._buf, [m for m, _ in ends])
        cut = len(self._buf) - keep
        if cut:
            self._show_reasoning(self._buf[:cut])
            self._buf = self._buf[cut:]
        if final:
            self._end_reasoning()
        return False

    def _show_reasoning(self, text: str) -> None:
        """Reasoning text, less the newlines at the block's start and (held back) end."""
        if not self._reasoning_begun:
            text = text.lstrip("\n")
            if not text:
                return
            self._reasoning_begun = True
        text = self._reasoning_nl + text
        body = text.rstrip("\n")
        self._reasoning_nl = text[len(body) :]
        if body:
            self._emit(ReasoningDelta(body))

    def _end_reasoning(self) -> None:
        self._reasoning_nl, self._reasoning_begun = "", False

    def _content_markers(self) -> list[tuple[str, str]]:
        markers = []
        if self.tool_start:
            markers.append((self.tool_start, TOOL))
        if self.think_anywhere and self.think_start:
            markers.append((self.think_start, REASONING))
        return markers

    def _step_content(self, final: bool) -> bool:
        if self._strip_leading:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._strip_leading = False
        markers = self._content_markers()
        found = [(i, marker, nxt) for marker, nxt in markers if (i := self._buf.find(marker)) >= 0]
        if found:
            i, marker, nxt = min(found)
            self._show_content(self._buf[:i])
            # whitespace before a marker is layout, not content (unless the call is malformed)
            self._ws_before_marker, self._pending_ws = self._pending_ws, ""
            self._buf = self._buf[i + len(marker) :]
            self._state = nxt
            return True
        keep = 0 if final else _partial_suffix(self._buf, [m for m, _ in markers])
        cut = len(self._buf) - keep
        if cut:
            self._show_content(self._buf[:cut])
            self._buf = self._buf[cut:]
        return False

    def _show_content(self, text: str) -> None:
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        if body:
            self._emit(ContentDelta(body))

    def _step_tool(self, final: bool) -> bool:
        if self.tool_end:
            j = self._buf.find(self.tool_end)
            if j >= 0:
                body = self._buf[:j]
                self._buf = self._buf[j + len(self.tool_end) :]
                self._state = CONTENT
                self._strip_leading = self._tool_text(body, closed=True)
                return True
        if final:
            body, self._buf = self._buf, ""
            self._tool_text(body, closed=False)
            self._state = CONTENT
        else:
            keep = _partial_suffix(self._buf, [self.tool_end]) if self.tool_end else 0
            self._stream_call(self._buf[: len(self._buf) - keep])
        return False

    # --- tool calls -----------------------------------------------------------

    def _stream_call(self, body: str) -> None:
        """Announce the open call once its name is complete; emit its new argument text."""
        if not self._stream_decided:
            head = body.lstrip()
            if not head:
                return
            self._stream_decided = True
            if JsonCallStreamer.applies(head):
                self._streamer = JsonCallStreamer()
        streamer = self._streamer
        if streamer is None:
            return
        delta = streamer.update(body)
        if self._start is None and streamer.name is not None:
            self._start = ToolCall(name=streamer.name, arguments="", id=new_tool_call_id())
            self._emit(ToolCallStart(len(self.tool_calls), ToolCall(self._start.name, "", self._start.id)))
        if delta:
            self._emit(ToolCallArgs(len(self.tool_calls), delta))

    def _began(self, body: str) -> JsonCallStreamer | None:
        """The streamer of a call whose name is complete in `body` (None: not a call yet).

        A body closed within one chunk was never streamed: the same scan decides, so
        the outcome does not depend on the chunking."""
        if self._streamer is None and not self._stream_decided and JsonCallStreamer.applies(body):
            self._streamer = JsonCallStreamer()
            self._streamer.update(body)
        streamer = self._streamer
        return streamer if streamer is not None and streamer.name is not None else None

    def _tool_text(self, body: str, closed: bool) -> bool:
        """Emit the calls in `body`, or show it as text. True when calls were emitted."""
        try:
            return self._emit_calls(body, closed)
        finally:
            self._streamer, self._stream_decided, self._start = None, False, None

    def _emit_calls(self, body: str, closed: bool) -> bool:
        calls = self._parse_calls(body)
        began = self._began(body)
        sent = began.sent if began is not None and self._start is not None else None  # what the client has
        if calls is None and began is not None:
            # The call began (its name is complete): it stays a call, as far as it got.
            issue = "the call is not valid JSON" if closed else "cut off before the call was complete"
            log.warning("tool call %s: %s", began.name, issue)
            calls = [ToolCall(began.name, began.partial_arguments(body), new_tool_call_id(), issues=[issue],
                              partial=not closed)]
        if calls is None:
            self.malformed.append(body)
            raw = f"{self.tool_start}{body}{self.tool_end if closed and self.tool_end else ''}"
            if not closed and JsonCallStreamer.applies(body):  # a JSON call cut before its name
                log.warning("tool call cut off before its name; dropped: %.200r", raw)
                return False
            log.warning("unparseable tool call surfaced as text: %.200r", raw)
            self._show_content(self._ws_before_marker + raw)
            return False
        if self.max_calls is not None:
            calls = calls[: self.max_calls - len(self.tool_calls)]
        for n, call in enumerate(calls):
            streamed = None
            if n == 0 and self._start is not None:
                call.id = self._start.id
                streamed = sent or ""
                if not call.arguments.startswith(streamed):  # e.g. a repeated key the parse kept last
                    log.warning("tool call %s: streamed arguments differ from the parsed call", call.name)
            self._emit(ToolCallDelta(len(self.tool_calls), call, streamed))
            self.tool_calls.append(call)
        return True

    def _parse_calls(self, body: str) -> list[ToolCall] | None:
        assert self.tool_parser is not None
        if not body.strip():
            return None
        try:
            parsed = self.tool_parser(body, self._openai_tools or None)
        except Exception as exc:  # parsers raise ValueError, JSONDecodeError, KeyError, ...
            log.debug("tool parser failed: %s", exc)
            return None
        items = parsed if isinstance(parsed, list) else [parsed]
        calls: list[ToolCall] = []
        for item in items:
            call = self._to_call(item)
            if call is None:
                return None
            calls.append(call)
        return calls or None

    def _to_call(self, item: Any) -> ToolCall | None:
        if not isinstance(item, dict):
            return None
        name = item.get("name")
        if not isinstance(name, str) or not name:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        issues: list[str] = []
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            text = arguments
            try:
                arguments = orjson.loads(text) if text.strip() else {}
            except orjson.JSONDecodeError:
                issues.append("arguments are not valid JSON")
            else:
                text = orjson.dumps(arguments).decode()
        else:
            try:
                text = orjson.dumps(arguments).decode()
            except TypeError:
                return None
        if not issues:
            issues = self._validator.issues(name, arguments)
        if issues:
            log.warning("tool call %s: %s", name, "; ".join(issues))
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = new_tool_call_id()
        return ToolCall(name=name, arguments=text, id=call_id, issues=issues)
