"""The one Session model every importer produces and every trace tool reads.

A Session is an agent conversation in normalized form: messages in order (system,
user, assistant with reasoning / visible text / tool calls, tool results), the tools
offered where known, and the per-message model where the source says it. Importers
(`traces/formats.py`) map each agent's own format onto it; analysis, replay and the
policies' tests read only this.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

from jumpahead.core.turn import Message, Tool, ToolCall, ToolChoice, Turn

from .turn_json import message_from_json, message_to_json, response_format_from_json

# The conversation is modelled once: a session's messages are the turn pipeline's own
# `Message`s (with the recorded provenance fields model, timestamp and meta) and its
# calls `ToolCall`s, whose arguments a JSON value given by an importer becomes text of.


@dataclass
class Session:
    id: str
    format: str  # the importer that read it ("pi", "claude-code", "jumpahead", ...)
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function tools, where known
    source: str = ""  # the file it came from
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what the importer skipped and why

    # --- counts (the importer tests compare these with counts taken from raw files) ---
    def assistant_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.role == "assistant"]

    @property
    def turns(self) -> int:
        """Assistant messages (one model call each)."""
        return len(self.assistant_indices())

    @property
    def tool_call_count(self) -> int:
        return sum(len(m.tool_calls) for m in self.messages if m.role == "assistant")

    @property
    def reasoning_count(self) -> int:
        """Assistant messages that carry reasoning text."""
        return sum(1 for m in self.messages if m.role == "assistant" and (m.reasoning or "").strip())

    @property
    def models(self) -> list[str]:
        return sorted({m.model for m in self.messages if m.model})

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "format": self.format,
            "source": self.source,
            "messages": len(self.messages),
            "turns": self.turns,
            "tool_calls": self.tool_call_count,
            "tool_results": sum(1 for m in self.messages if m.role == "tool"),
            "reasoning_blocks": self.reasoning_count,
            "user_messages": sum(1 for m in self.messages if m.role == "user"),
            "models": self.models,
            "tools_offered": len(self.tools),
            "warnings": len(self.warnings),
        }

    # --- serialisation (`jumpahead traces import --out`): plain JSON values, exact round trip ---
    def to_dict(self) -> dict[str, Any]:
        """The session as JSON values; its messages in the one JSON form of a Message
        (traces/turn_json.py), which recorded trace contexts use too."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "messages"}
        out["messages"] = [message_to_json(m) for m in self.messages]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        fields = dict(data)
        fields["messages"] = [message_from_json(m) for m in data.get("messages", [])]
        return cls(**fields)

    # --- the bridge to the server's own Turn (replay, policies) ---
    def context_indices(self, upto: int) -> list[int]:
        """Indices of the messages the agent sent before message `upto`.

        Without compaction that is 0..upto-1. After a compaction summary (a message with
        meta["compaction"], set by importers) the agent sent the summary, the earlier
        messages it kept (from meta["compaction"]["first_kept"], None: none) and what
        followed the summary."""
        last = next((i for i in range(upto - 1, -1, -1) if "compaction" in self.messages[i].meta), None)
        if last is None:
            return list(range(upto))
        kept = self.messages[last].meta["compaction"].get("first_kept")
        earlier = list(range(kept, last)) if isinstance(kept, int) and 0 <= kept < last else []
        return [last, *earlier, *range(last + 1, upto)]

    def turn_messages(self, upto: int) -> list[Message]:
        """The messages the agent sent before message `upto` (context_indices), as a
        request holds them: without the recorded provenance, every call with an id."""
        out = []
        for i in self.context_indices(upto):
            m = self.messages[i]
            # importers set ids where the source has them; tool results refer to them
            calls = [ToolCall(name=c.name, arguments=c.arguments, id=c.id or f"call_{i}_{j}")
                     for j, c in enumerate(m.tool_calls)]
            out.append(Message(role=m.role, content=m.content if m.content is not None else "",
                               reasoning=m.reasoning or None, tool_calls=calls, tool_call_id=m.tool_call_id,
                               name=m.name))
        return out

    def turn(self, index: int) -> Turn:
        """The `Turn` that asks for assistant message `index` (its history before it).

        Where the source recorded the request's tool choice and thinking switch (our own
        traces, in the message's meta), the Turn asks with them: a required or named
        tool choice constrains the answer (and strict fill) by a grammar."""
        if self.messages[index].role != "assistant":
            raise ValueError(f"message {index} is a {self.messages[index].role} message, not an assistant turn")
        tools = []
        for t in self.tools:
            fn = t.get("function", t)
            if isinstance(fn, dict) and fn.get("name"):
                tools.append(Tool(fn["name"], fn.get("description", "") or "", fn.get("parameters") or fn.get("input_schema")))
        turn = Turn(messages=self.turn_messages(index), tools=tools)
        meta = self.messages[index].meta
        choice = meta.get("tool_choice")
        if isinstance(choice, dict) and choice.get("mode"):
            turn.tool_choice = ToolChoice(str(choice["mode"]), choice.get("name"))
        if isinstance(meta.get("thinking"), bool):
            turn.thinking = meta["thinking"]
        turn.response_format = response_format_from_json(meta)  # the same grammar again
        return turn
