"""OpenAI Responses streaming: a Turn's OutputEvents as Responses SSE events."""

from __future__ import annotations

import time
from typing import Any

from . import sse
from .openai_responses import (
    ResponsesContext,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    response_object,
)
from jumpahead.core.tool_stream import partial_json
from jumpahead.core.turn import (
    ContentDelta,
    OutputEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallArgs,
    ToolCallDelta,
    ToolCallStart,
    TurnEnd,
    TurnOutput,
    Usage,
)


class ResponsesStream:
    """Encodes a Turn's OutputEvents as Responses SSE events (bytes frames).

    response.created and response.in_progress, then the context's lead items (a
    server-side compaction item, added and done at once), then per output item
    output_item.added, its part and delta events, output_item.done; then
    response.completed (or response.incomplete); after a failure response.failed.
    """

    def __init__(self, ctx: ResponsesContext, *, id: str, model: str, created_at: int | None = None) -> None:
        self.ctx = ctx
        self.id = id
        self.model = model
        self.created_at = created_at if created_at is not None else int(time.time())
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished output items
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.text = ""  # text of the open item
        self.logprobs: list[dict[str, Any]] = []  # logprob entries of the open message's text (when asked)
        self.out = TurnOutput()  # the whole answer, for the store
        self.done = False
        self.call: dict[str, Any] | None = None  # the streamed call's added item
        self.call_args = ""  # its argument text so far
        self.call_sent = ""  # a custom tool's input text sent so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse.event(kind, payload)

    def _response(self, status: str, usage: Usage | None = None, error: str | None = None) -> dict[str, Any]:
        return response_object(self.ctx, id=self.id, model=self.model, created_at=self.created_at, status=status,
                               output=list(self.items), usage=usage, error=error)

    def start(self) -> list[bytes]:
        response = self._response("in_progress")
        frames = [self._event("response.created", response=response),
                  self._event("response.in_progress", response=response)]
        for item in self.ctx.lead_items:  # a server-side compaction item comes first, whole
            frames += [self._event("response.output_item.added", output_index=self._index, item=item),
                       self._event("response.output_item.done", output_index=self._index, item=item)]
            self.items.append(item)
        return frames

    @property
    def _index(self) -> int:
        return len(self.items)

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        self.open, self.text, self.logprobs = item, "", []
        frames.append(self._event("response.output_item.added", output_index=self._index, item=item))
        if item["type"] == "reasoning":
            frames.append(self._event("response.reasoning_summary_part.added", item_id=item["id"],
                                      output_index=self._index, summary_index=0,
                                      part={"type": "summary_text", "text": ""}))
        elif item["type"] == "message":
            frames.append(self._event("response.content_part.added", item_id=item["id"], output_index=self._index,
                                      content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        return frames

    def _close(self) -> list[bytes]:
        item, text, index, logprobs = self.open, self.text, self._index, self.logprobs
        if item is None:
            return []
        self.open = None
        frames = []
        if item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            frames += [
                self._event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                            summary_index=0, text=text),
                self._event("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                            summary_index=0, part=part),
            ]
            done = reasoning_item(text, self.ctx, id=item["id"])
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            frames += [
                self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=text, logprobs=logprobs),
                self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                            part=part),
            ]
            done = message_item(text, id=item["id"], logprobs=logprobs)
        frames.append(self._event("response.output_item.done", output_index=index, item=done))
        self.items.append(done)
        return frames

    def encode(self, event: OutputEvent) -> list[bytes]:
        self.out.add(event)
        if isinstance(event, ReasoningDelta) and event.text:
            frames = [] if self.open and self.open["type"] == "reasoning" else self._open(
                {"type": "reasoning", "id": new_id("rs"), "summary": []})
            self.text += event.text
            return frames + [self._event("response.reasoning_summary_text.delta", item_id=self.open["id"],
                                         output_index=self._index, summary_index=0, delta=event.text)]
        if isinstance(event, ContentDelta) and event.text:
            frames = [] if self.open and self.open["type"] == "message" else self._open(
                message_item("", status="in_progress"))
            self.text += event.text
            self.logprobs += event.logprobs or []
            return frames + [self._event("response.output_text.delta", item_id=self.open["id"],
                                         output_index=self._index, content_index=0, delta=event.text,
                                         logprobs=event.logprobs or [])]
        if isinstance(event, ToolCallStart):
            frames = self._close()
            self.call, self.call_args, self.call_sent = call_item(event.call, self.ctx, done=False), "", ""
            return frames + [self._event("response.output_item.added", output_index=self._index, item=self.call)]
        if isinstance(event, ToolCallArgs):
            return self._call_delta(event.text)
        if isinstance(event, ToolCallDelta):
            return self._call(event.call, event.rest if event.streamed is not None else None)
        if isinstance(event, TurnEnd):
            if event.finish_reason in ("error", "cancelled"):
                return self.fail(event.error or f"generation {event.finish_reason}")
            frames = self._close()
            self.done = True
            status = "incomplete" if event.finish_reason == "length" else "completed"
            return frames + [self._event(f"response.{status}", response=self._response(status, event.usage))]
        return []

    def _call_delta(self, text: str) -> list[bytes]:
        """Argument text of the streamed call; a custom tool streams its `input` string."""
        item = self.call
        if item is None or not text:
            return []
        self.call_args += text
        if item["type"] != "custom_tool_call":
            return [self._event("response.function_call_arguments.delta", item_id=item["id"],
                                output_index=self._index, delta=text)]
        value = partial_json(self.call_args)
        text = value.get("input") if isinstance(value, dict) else None
        if not isinstance(text, str) or not text.startswith(self.call_sent) or len(text) == len(self.call_sent):
            return []
        delta, self.call_sent = text[len(self.call_sent):], text
        return [self._event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=self._index,
                            delta=delta)]

    def _call(self, call: ToolCall, rest: str | None = None) -> list[bytes]:
        """A finished call; `rest` is set when it was streamed (its argument text not yet sent)."""
        frames: list[bytes] = []
        if rest is None or self.call is None:
            frames = self._close()
            added = call_item(call, self.ctx, done=False)
            frames.append(self._event("response.output_item.added", output_index=self._index, item=added))
            sent_args = sent_input = ""
        else:
            added, sent_args, sent_input = self.call, self.call_args, self.call_sent
        self.call = None
        index = self._index
        done = call_item(call, self.ctx, id=added["id"])
        if done["type"] == "custom_tool_call":
            delta = done["input"][len(sent_input):] if done["input"].startswith(sent_input) else ""
            frames += [
                *([self._event("response.custom_tool_call_input.delta", item_id=done["id"], output_index=index,
                               delta=delta)] if delta or not sent_input else []),
                self._event("response.custom_tool_call_input.done", item_id=done["id"], output_index=index,
                            input=done["input"]),
            ]
        else:
            args = done["arguments"]
            delta = args[len(sent_args):] if args.startswith(sent_args) else ""
            frames += [
                *([self._event("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                               delta=delta)] if delta or not sent_args else []),
                self._event("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                            name=done["name"], arguments=done["arguments"]),
            ]
        frames.append(self._event("response.output_item.done", output_index=index, item=done))
        self.items.append(done)
        return frames

    def fail(self, message: str) -> list[bytes]:
        """End the stream after a failure: close the open item, then response.failed."""
        if self.done:
            return []
        self.done = True
        self.out.finish_reason, self.out.error = "error", message
        return self._close() + [self._event("response.failed", response=self._response("failed", error=message))]
