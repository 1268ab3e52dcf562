"""Between a Turn and an upstream's chat completions.

Out: `chat_body(turn, ...)` is the OpenAI chat-completions body for the Turn (after
policies), always streamed, optionally ending with an assistant prefix to continue.

Back: `OutputText` turns the upstream's stream deltas (content, reasoning_content,
structured tool_calls) into text in the model's own output format (`<think>...`,
`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`), which the proxy's output
parser reads like in-process output. So tool calls arrive the same way whether the
upstream parsed them (structured) or left them in its text, and policies watch one
token stream either way.
"""

from __future__ import annotations

import json
from typing import Any

from jumpahead.core.turn import Turn

DEFAULT_TOOL_MARKERS = ("<tool_call>", "</tool_call>")


def chat_messages(turn: Turn) -> list[dict[str, Any]]:
    """The Turn's messages on the OpenAI wire (arguments as JSON text)."""
    out: list[dict[str, Any]] = []
    for m in turn.messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.role == "assistant":
            if m.reasoning:
                d["reasoning_content"] = m.reasoning
            if m.tool_calls:
                d["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                                   for c in m.tool_calls]
        elif m.role == "tool":
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        elif m.name:
            d["name"] = m.name
        out.append(d)
    return out


def chat_body(turn: Turn, model: str | None, *, prefix: str | None = None,
              max_tokens: int | None = None) -> dict[str, Any]:
    """The upstream request for `turn`. `prefix`: the answer so far, sent as a final
    assistant message to continue (`continue_final_message`; the Turn's own final
    assistant message, if it already continued one, is extended)."""
    messages = chat_messages(turn)
    if prefix is not None:
        last = turn.messages[-1] if turn.messages else None
        if turn.continue_final and last is not None and last.role == "assistant" \
                and not last.tool_calls:
            messages[-1] = {**messages[-1], "content": (last.content or "") + prefix}
        else:
            messages.append({"role": "assistant", "content": prefix})
    body: dict[str, Any] = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if prefix is not None or turn.continue_final:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    limit = max_tokens if max_tokens is not None else turn.max_tokens
    if limit is not None:
        body["max_tokens"] = int(limit)
    s = turn.sampling
    body["temperature"] = s.temperature
    if s.top_p != 1.0:
        body["top_p"] = s.top_p
    if s.top_k:
        body["top_k"] = s.top_k
    if s.min_p:
        body["min_p"] = s.min_p
    if s.seed is not None:
        body["seed"] = s.seed
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if s.repetition_penalty != 1.0:
        body["repetition_penalty"] = s.repetition_penalty
    if turn.stop:
        body["stop"] = list(turn.stop)
    if turn.tools_enabled:
        body["tools"] = [t.as_openai() for t in turn.tools]
        choice = turn.tool_choice
        if choice.mode == "function" and choice.name:
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            body["tool_choice"] = choice.mode
    if turn.response_format is not None:  # whichever protocol's field asked for it
        body["response_format"] = turn.response_format.as_openai()
    if turn.extra.get("reasoning_effort") is not None:
        body["reasoning_effort"] = turn.extra["reasoning_effort"]
    # chat's own, or Anthropic's disable_parallel_tool_use negated; only with tools
    # (OpenAI rejects it without)
    if turn.parallel_tool_calls is not None and turn.tools_enabled:
        body["parallel_tool_calls"] = turn.parallel_tool_calls
    if turn.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": bool(turn.thinking)}
    return body


def _call_renderings(name: str, arguments: str) -> list[str]:
    """A structured call written as JSON bodies the model could have typed (the
    upstream's argument text verbatim first, then common json.dumps layouts)."""
    out = [f'{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments or "{}"}}}']
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return out
    for kwargs in ({"ensure_ascii": False}, {"ensure_ascii": True},
                   {"ensure_ascii": False, "separators": (",", ":")}):
        out.append(json.dumps({"name": name, "arguments": value}, **kwargs))  # type: ignore[arg-type]
    return out


class OutputText:
    """Upstream deltas -> text in the model's output format (see the module doc).

    `emitted` is everything returned so far (the answer as the model wrote it), which
    is what a continuation request sends back as the assistant prefix.
    """

    def __init__(self, tokenizer: Any, *, in_reasoning: bool = False) -> None:
        has_thinking = bool(getattr(tokenizer, "has_thinking", False))
        self.think = (tokenizer.think_start, tokenizer.think_end) if has_thinking else ("<think>", "</think>")
        self.tool = (getattr(tokenizer, "tool_call_start", None) or DEFAULT_TOOL_MARKERS[0],
                     getattr(tokenizer, "tool_call_end", None) or DEFAULT_TOOL_MARKERS[1])
        self.in_think = in_reasoning
        self.emitted = ""
        self.calls: dict[int, dict[str, Any]] = {}  # index -> {"name", "args", "open", "resume"}
        self.current: int | None = None
        self.mismatches = 0  # continued calls whose structured form did not extend the prefix

    def _out(self, text: str) -> str:
        self.emitted += text
        return text

    def _close_think(self) -> str:
        if not self.in_think:
            return ""
        self.in_think = False
        return self._out(f"{self.think[1]}\n\n")

    def _open_call_text(self) -> str | None:
        """The text of a tool call the answer opened and has not closed (a continued prefix)."""
        at = self.emitted.rfind(self.tool[0])
        if at < 0 or self.tool[1] in self.emitted[at:]:
            return None
        return self.emitted[at:]

    def delta(self, delta: dict[str, Any]) -> str:
        """Text for one `choices[0].delta` (or a non-streamed `message`)."""
        out = ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out += self._close_call()
            if not self.in_think:
                self.in_think = True
                out += self._out(f"{self.think[0]}\n")
            out += self._out(reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            out += self._close_call() + self._close_think() + self._out(content)
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                out += self._close_think() + self._tool_delta(call)
        return out

    def _tool_delta(self, call: dict[str, Any]) -> str:
        index = int(call.get("index", len(self.calls)) if call.get("index") is not None else len(self.calls))
        fn = call.get("function") or {}
        out = ""
        if index not in self.calls:
            out += self._close_call()
            resume = self._open_call_text()
            self.calls[index] = {"name": "", "args": "", "open": False, "resume": resume}
            self.current = index
        entry = self.calls[index]
        if isinstance(fn.get("name"), str):
            entry["name"] += fn["name"]
        args = fn.get("arguments")
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        if entry["resume"] is not None:  # a continued call: whole, at its close
            entry["args"] += args or ""
            return out
        if not entry["open"] and entry["name"]:
            entry["open"] = True
            sep = "\n" if self.emitted and not self.emitted.endswith("\n") else ""
            out += self._out(f'{sep}{self.tool[0]}\n{{"name": {json.dumps(entry["name"], ensure_ascii=False)}, '
                             f'"arguments": ')
        if isinstance(args, str) and args:
            entry["args"] += args  # arguments before the name are held until it comes
        if entry["open"] and entry["args"]:
            out += self._out(entry["args"])
            entry["args"] = ""
            entry["wrote"] = True
        return out

    def _close_call(self) -> str:
        if self.current is None:
            return ""
        entry = self.calls[self.current]
        self.current = None
        if entry["resume"] is not None:
            return self._out(self._resume_rest(entry))
        if not entry["open"]:
            return ""
        tail = "" if entry.get("wrote") else "{}"
        return self._out(f"{tail}}}\n{self.tool[1]}")

    def _resume_rest(self, entry: dict[str, Any]) -> str:
        """The rest of a call the prefix opened, from the upstream's whole structured call."""
        prefix = entry["resume"]
        body_so_far = prefix[len(self.tool[0]):].lstrip()
        for body in _call_renderings(entry["name"], entry["args"]):
            if body.startswith(body_so_far):
                return f"{body[len(body_so_far):]}\n{self.tool[1]}"
        # Engines that stream a continued call's arguments as the text after the prefix
        # (jumpahead): the prefix plus that text is the call.
        for rest in (entry["args"] + "}", entry["args"]):
            try:
                whole = json.loads(body_so_far + rest)
            except ValueError:
                continue
            if isinstance(whole, dict) and "arguments" in whole:
                return f"{rest}\n{self.tool[1]}"
        self.mismatches += 1  # cannot extend what was written: close it and write the call whole
        return f"\n{self.tool[1]}\n{self.tool[0]}\n{_call_renderings(entry['name'], entry['args'])[0]}\n{self.tool[1]}"

    def extend(self, text: str) -> None:
        """Text supplied from outside the upstream (a jump): it owns whatever was open,
        so the state is read back from the text (a call it left open is resumed from
        the continuation's structured call)."""
        self.emitted += text
        self.current = None
        self.calls = {}  # the next request's stream numbers its calls afresh
        start, end = self.emitted.rfind(self.think[0]), self.emitted.rfind(self.think[1])
        if start >= 0 or end >= 0:
            self.in_think = start > end

    def finish(self) -> str:
        """Text that closes what the stream left open (a tool call)."""
        return self._close_call()
