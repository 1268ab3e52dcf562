"""Anthropic Messages: request body -> Turn, Turn output -> message JSON and SSE events.

Lenient where real clients are loose (a `system` role inside `messages`,
`cache_control` anywhere, `output_config`, `thinking`, `eager_input_streaming`, unknown
fields and server tools are ignored), strict where the answer would change (types and
ranges of sampling fields, roles, tool names, `context_management` edits: applied by
the policy runtime, proxy/anthropic_context.py). Model reasoning becomes thinking blocks;
tool calls become tool_use blocks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson

from jumpahead.engine.types import SamplingParams

from . import sse
from .anthropic_context import applied_edits, parse_context_management
from jumpahead.core.content import content_texts
from jumpahead.core.errors import anthropic_error_body, invalid_request
from jumpahead.core.fields import boolean, integer, number, obj
from .signing import Signer, default_signer
from jumpahead.core.tool_stream import partial_json
from jumpahead.core.options import parse_options
from jumpahead.core.turn import (
    ContentDelta,
    Message,
    OutputEvent,
    ReasoningDelta,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallArgs,
    ToolCallDelta,
    ToolCallStart,
    ToolChoice,
    Turn,
    TurnEnd,
    TurnFinish,
    TurnOutput,
    Usage,
)
from .wire import WireContext

_SEED_MASK = (1 << 63) - 1
NO_VISION = "this model reads text only; image and PDF blocks cannot be served"


# --- request -------------------------------------------------------------------------


def _text_of(content: Any, param: str) -> str:
    """Text of a string or of an array of text blocks (tool results, system)."""
    texts = content_texts(content, _block_text, param)
    if texts is None:
        raise invalid_request(f"{param} must be a string or an array of content blocks", param=param)
    return "\n".join(texts)


def _block_text(block: Any, where: str) -> str | None:
    block = obj(block, where)
    kind = block.get("type", "text")
    if kind in ("image", "document") and not _text_document(block):
        raise invalid_request(f"{where}: {NO_VISION}", param=where)
    text = _text_document(block) if kind == "document" else block.get("text")
    if kind == "search_result":
        text = _text_of(block.get("content"), f"{where}.content")
    if text is not None and not isinstance(text, str):
        raise invalid_request(f"{where}.text must be a string", param=f"{where}.text")
    return text


BILLING_HEADER = "x-anthropic-billing-header:"


def _drop_billing_header(system: Any) -> Any:
    """Claude Code's first system block is billing metadata that changes with every
    client version (and may carry per-request values). A local model does not need it,
    and since it comes first it would defeat prefix reuse for the whole ~20k-token
    prompt (docs/prefix-cache.md), so it is left out of the rendered prompt."""
    if isinstance(system, list):
        return [b for b in system if not (isinstance(b, dict) and isinstance(b.get("text"), str)
                                          and b["text"].lstrip().startswith(BILLING_HEADER))]
    if isinstance(system, str) and system.lstrip().startswith(BILLING_HEADER):
        first, _, rest = system.lstrip().partition("\n")
        return rest
    return system


def _text_document(block: dict[str, Any]) -> str | None:
    source = block.get("source")
    if block.get("type") == "document" and isinstance(source, dict) and source.get("type") == "text":
        data = source.get("data")
        return data if isinstance(data, str) else None
    return None


def _blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, dict):
        return [content]
    if not isinstance(content, list):
        raise invalid_request(f"{param} must be a string or an array of content blocks", param=param)
    return [obj({"type": "text", "text": b} if isinstance(b, str) else b, f"{param}[{i}]")
            for i, b in enumerate(content)]


def _user_messages(content: Any, param: str) -> list[Message]:
    """A user message: tool_result blocks become tool messages, the rest user text, in order."""
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(Message("user", "\n".join(texts)))
            texts.clear()

    for i, block in enumerate(_blocks(content, param)):
        where = f"{param}[{i}]"
        kind = block.get("type", "text")
        if kind == "tool_result":
            flush()
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid_request(f"{where}.tool_use_id must be a non-empty string", param=f"{where}.tool_use_id")
            out.append(Message("tool", _text_of(block.get("content"), f"{where}.content"), tool_call_id=call_id))
        else:
            text = _text_of([block], param)
            if text or kind == "text":
                texts.append(text)
    flush()
    return out or [Message("user", "")]


def _assistant_message(content: Any, param: str, signer: Signer | None = None,
                       dropped: list[int] | None = None) -> Message:
    """An assistant message. With a `signer`, a thinking block is kept only when its
    signature is this server's signature of its text (proxy/signing.py); others are
    left out and counted in `dropped`."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(_blocks(content, param)):
        where = f"{param}[{i}]"
        kind = block.get("type", "text")
        if kind == "text":
            text = block.get("text", "")
            if not isinstance(text, str):
                raise invalid_request(f"{where}.text must be a string", param=f"{where}.text")
            texts.append(text)
        elif kind == "thinking":
            text = block.get("thinking")
            if isinstance(text, str):
                if signer is None or signer.verify(text, block.get("signature")):
                    thinking.append(text)
                elif dropped is not None:
                    dropped.append(i)
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise invalid_request(f"{where}.name must be a non-empty string", param=f"{where}.name")
            call_id = block.get("id")
            arguments = block.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                call_id = f"toolu_{uuid.uuid4().hex[:24]}"
            text = orjson.dumps(arguments if arguments is not None else {}).decode()
            calls.append(ToolCall(name=name, arguments=text, id=call_id))
        # redacted_thinking, server_tool_use, web_search_tool_result, ...: not ours to replay
    return Message("assistant", "\n".join(texts) if texts or not calls else None,
                   reasoning="\n".join(thinking) or None, tool_calls=calls)


def _message(raw: Any, i: int, signer: Signer | None = None, dropped: list[int] | None = None) -> list[Message]:
    param = f"messages[{i}]"
    raw = obj(raw, param)
    role = raw.get("role")
    content = raw.get("content")
    if role == "user":
        return _user_messages(content if content is not None else "", f"{param}.content")
    if role == "assistant":
        return [_assistant_message(content if content is not None else [], f"{param}.content", signer, dropped)]
    if role in ("system", "developer"):
        return [Message("system", _text_of(content, f"{param}.content"))]
    raise invalid_request(f"{param}.role must be user or assistant, got {role!r}", param=f"{param}.role")


def _tools(raw_tools: Any) -> list[Tool]:
    if raw_tools is None:
        return []
    if not isinstance(raw_tools, list):
        raise invalid_request("tools must be an array", param="tools")
    tools = []
    for i, raw in enumerate(raw_tools):
        raw = obj(raw, f"tools[{i}]")
        schema = raw.get("input_schema")
        if schema is None:
            continue  # server tools (web_search_..., code_execution_...) run at Anthropic, not here
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"tools[{i}].name must be a non-empty string", param=f"tools[{i}].name")
        if not isinstance(schema, dict):
            raise invalid_request(f"tools[{i}].input_schema must be a JSON schema object",
                                  param=f"tools[{i}].input_schema")
        description = raw.get("description")
        tools.append(Tool(name, description if isinstance(description, str) else "", schema))
    return tools


def _tool_choice(value: Any, tools: list[Tool]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    value = obj(value, "tool_choice")
    kind = value.get("type")
    if kind == "auto":
        return ToolChoice("auto")
    if kind == "any":
        return ToolChoice("required")
    if kind == "none":
        return ToolChoice("none")
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request("tool_choice.name must be a non-empty string", param="tool_choice.name")
        if name not in {t.name for t in tools}:
            raise invalid_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice.name")
        return ToolChoice("function", name)
    raise invalid_request(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", param="tool_choice.type")


def _parallel_tool_calls(value: Any) -> bool | None:
    """`tool_choice.disable_parallel_tool_use` as OpenAI's `parallel_tool_calls` (its
    negation; None when not given): true makes a forced call exactly one call."""
    if not isinstance(value, dict):
        return None  # _tool_choice has rejected anything else
    disable = value.get("disable_parallel_tool_use")
    if disable is None:
        return None
    if not isinstance(disable, bool):
        raise invalid_request(f"tool_choice.disable_parallel_tool_use must be a boolean, got {type(disable).__name__}",
                              param="tool_choice.disable_parallel_tool_use")
    return not disable


def _thinking(value: Any) -> bool | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "enabled":
        return True
    if kind == "disabled":
        return False
    return None  # adaptive: the template's default


def _stop_sequences(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid_request("stop_sequences must be an array of strings", param="stop_sequences")
    return [s for s in value if s]


def parse_messages_request(body: Any, *, for_counting: bool = False, signer: Signer | None = None) -> Turn:
    """Validate a /v1/messages body (or count_tokens body) and translate it into a Turn.

    With a `signer` (the server's), thinking blocks whose signature does not verify
    are left out of the history; their number is `turn.extra["thinking_dropped"]`.
    Raises APIError(400) naming the offending field.
    """
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise invalid_request("messages must be a non-empty array", param="messages")
    messages: list[Message] = []
    system = _drop_billing_header(body.get("system"))
    if system is not None:
        text = _text_of(system, "system")
        if text:
            messages.append(Message("system", text))
    dropped: list[int] = []
    for i, raw in enumerate(raw_messages):
        messages.extend(_message(raw, i, signer, dropped))
    tools = _tools(body.get("tools"))
    max_tokens = None if for_counting else integer(body, "max_tokens", lo=1)
    top_k = integer(body, "top_k", lo=0)
    seed = integer(body, "seed")
    sampling = SamplingParams(
        temperature=number(body, "temperature", 1.0, lo=0.0, hi=1.0),
        top_p=number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        top_k=top_k or 0,
        seed=None if seed is None else seed & _SEED_MASK,
    )
    extra: dict[str, Any] = {k: body[k] for k in ("metadata", "thinking", "output_config", "context_management",
                                                 "service_tier") if k in body}
    if dropped:
        extra["thinking_dropped"] = len(dropped)
    edits = None
    if body.get("context_management") is not None:
        edits = parse_context_management(body["context_management"])  # applied by the policy runtime
    output_config = body.get("output_config")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_request(f"model must be a string, got {type(model).__name__}", param="model")
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    parallel = _parallel_tool_calls(body.get("tool_choice"))
    return Turn(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=_stop_sequences(body.get("stop_sequences")),
        stream=False if for_counting else boolean(body, "stream"),
        thinking=_thinking(body.get("thinking")),
        model=model if isinstance(model, str) and model else None,
        options=parse_options(body.get("jumpahead")),
        response_format=ResponseFormat.from_wire(output_config.get("format")) if isinstance(output_config, dict) else None,
        parallel_tool_calls=parallel,
        # Anthropic prefill: a final assistant message is the start of the answer
        continue_final=messages[-1].role == "assistant" and not messages[-1].tool_calls,
        context_edits=edits,
        extra=extra,
    )


# --- response ------------------------------------------------------------------------


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call: ToolCall) -> str:
    """Our call ids are `call_...`; Anthropic clients expect `toolu_...`."""
    return "toolu_" + call.id.removeprefix("call_") if call.id.startswith("call_") else call.id


def tool_input(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as the object Anthropic's `input` must be."""
    try:
        value = orjson.loads(call.arguments) if call.arguments.strip() else {}
    except orjson.JSONDecodeError:
        if call.partial or call.issues:
            # a call cut off or broken after it was streamed: what the SDK itself reads
            # from the streamed prefix (jiter's partial mode, complete strings only)
            partial = partial_json(call.arguments, trailing_strings=False)
            if isinstance(partial, dict):
                return partial
        return {"arguments": call.arguments}  # keep the model's text rather than drop it
    return value if isinstance(value, dict) else {"arguments": value}


def stop_reason(finish: TurnFinish, stop_sequence: str | None) -> str:
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence else "end_turn"


def usage_json(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }
    if usage.fill is not None:
        out["fill"] = usage.fill
    report = usage.report.to_json()
    if report is not None:
        out["report"] = report
    return out


def message_object(out: TurnOutput, *, id: str, model: str, signer: Signer | None = None) -> dict[str, Any]:
    """The non-streaming `message` object."""
    content: list[dict[str, Any]] = []
    if out.reasoning:
        signature = (signer or default_signer()).sign(out.reasoning)
        content.append({"type": "thinking", "thinking": out.reasoning, "signature": signature})
    if out.content:
        content.append({"type": "text", "text": out.content})
    for call in out.tool_calls:
        content.append({"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": tool_input(call)})
    message = {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(out.finish_reason, out.stop_sequence),
        "stop_sequence": out.stop_sequence,
        "usage": usage_json(out.usage),
    }
    context_management = applied_edits(out.usage)  # the request's context edits (proxy/anthropic_context.py)
    if context_management is not None:
        message["context_management"] = context_management
    return message


class MessagesStream:
    """Encodes a Turn's OutputEvents as Anthropic SSE events (bytes frames).

    message_start, ping, then per block content_block_start / *_delta / stop, then
    message_delta (stop_reason, usage) and message_stop. A thinking block ends with a
    signature_delta (proxy/signing.py). After a failure: the open block is closed, an
    `error` event says why, and message_stop still ends the stream.

    With `start_usage`, message_start waits for the first event and takes its usage
    from it: by then the engine knows how many prompt tokens came from the prefix
    cache, so message_start and message_delta report the same input and cache counts.
    The applied context edits go into the final message_delta, as the API sends them.
    """

    def __init__(self, *, id: str, model: str, signer: Signer | None = None,
                 start_usage: Callable[[], Usage] | None = None) -> None:
        self.id = id
        self.model = model
        self.signer = signer or default_signer()
        self.start_usage = start_usage
        self.index = -1  # index of the last block started
        self.open: str | None = None  # type of the open block
        self.thinking = ""  # text of the open thinking block (signed when it closes)
        self.started = False
        self.done = False

    def start(self, prompt_tokens: int = 0) -> list[bytes]:
        """message_start and a ping; nothing yet when it waits for `start_usage`."""
        if self.start_usage is not None:
            return []
        return self._message_start(Usage(prompt_tokens=prompt_tokens))

    def _message_start(self, usage: Usage) -> list[bytes]:
        self.started = True
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": usage_json(usage)}
        return [sse.event("message_start", {"type": "message_start", "message": message}), self.ping()]

    def _ensure_started(self) -> list[bytes]:
        if self.started:
            return []
        return self._message_start(self.start_usage() if self.start_usage is not None else Usage())

    @staticmethod
    def ping() -> bytes:
        return sse.event("ping", {"type": "ping"})

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        frames = []
        if self.open == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": self.signer.sign(self.thinking)}))
            self.thinking = ""
        self.open = None
        return frames + [sse.event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _begin(self, block: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        self.index += 1
        self.open = block["type"]
        frames.append(sse.event("content_block_start",
                                {"type": "content_block_start", "index": self.index, "content_block": block}))
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse.event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def encode(self, event: OutputEvent) -> list[bytes]:
        return self._ensure_started() + self._encode(event)

    def _encode(self, event: OutputEvent) -> list[bytes]:
        if isinstance(event, ReasoningDelta) and event.text:
            frames = [] if self.open == "thinking" else self._begin({"type": "thinking", "thinking": "",
                                                                     "signature": ""})
            self.thinking += event.text
            return frames + [self._delta({"type": "thinking_delta", "thinking": event.text})]
        if isinstance(event, ContentDelta) and event.text:
            frames = [] if self.open == "text" else self._begin({"type": "text", "text": ""})
            return frames + [self._delta({"type": "text_delta", "text": event.text})]
        if isinstance(event, ToolCallStart):
            call = event.call
            return self._begin({"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": {}})
        if isinstance(event, ToolCallArgs):
            return [self._delta({"type": "input_json_delta", "partial_json": event.text})] if event.text else []
        if isinstance(event, ToolCallDelta):
            call = event.call
            if event.streamed is None:
                frames = self._begin({"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": {}})
                text = orjson.dumps(tool_input(call)).decode()
            else:  # streamed: the arguments so far are out; they are the JSON of the input
                frames, text = [], event.rest
            if text:
                frames.append(self._delta({"type": "input_json_delta", "partial_json": text}))
            return frames + self._close()
        if isinstance(event, TurnEnd):
            if event.finish_reason in ("error", "cancelled"):
                return self.fail(event.error or f"generation {event.finish_reason}")
            self.done = True
            delta = {"stop_reason": stop_reason(event.finish_reason, event.stop_sequence),
                     "stop_sequence": event.stop_sequence}
            final: dict[str, Any] = {"type": "message_delta", "delta": delta, "usage": usage_json(event.usage)}
            context_management = applied_edits(event.usage)
            if context_management is not None:
                final["context_management"] = context_management
            return self._close() + [
                sse.event("message_delta", final),
                sse.event("message_stop", {"type": "message_stop"}),
            ]
        return []

    def fail(self, message: str) -> list[bytes]:
        """End the stream after a failure: close the block, say why, message_stop."""
        if self.done:
            return []
        self.done = True
        return self._ensure_started() + self._close() + [
            sse.event("error", anthropic_error_body(message, 500)),
            sse.event("message_stop", {"type": "message_stop"}),
        ]


class _MessagesWire:
    """A MessagesStream's frames: message_start waits for the first event (its usage
    then knows the cached prompt tokens), pings fill long silences."""

    def __init__(self, encoder: MessagesStream, prompt_tokens: int) -> None:
        self.encoder = encoder
        self.heartbeat = encoder.ping
        self.first = encoder.start(prompt_tokens)

    def start(self) -> list[bytes]:
        return self.first

    def encode(self, event: OutputEvent) -> list[bytes]:
        return self.encoder.encode(event)

    def fail(self, message: str) -> list[bytes]:
        return self.encoder.fail(message)

    def end(self) -> list[bytes]:
        return []


class MessagesProtocol:
    """/v1/messages (proxy/wire.py WireProtocol)."""

    protocol = "messages"

    def __init__(self, ctx: WireContext) -> None:
        self.ctx = ctx
        self._id: str | None = None

    @property
    def id(self) -> str:
        if self._id is None:
            self._id = message_id()
        return self._id

    async def parse(self, body: Any) -> Turn:
        turn = parse_messages_request(body, signer=self.ctx.signer)
        self.ctx.stats["thinking_dropped"] += turn.extra.get("thinking_dropped", 0)
        return turn

    def body(self, out: TurnOutput, model: str) -> dict[str, Any]:
        return message_object(out, id=self.id, model=model, signer=self.ctx.signer)

    def stream(self, prepared: Any, model: str) -> _MessagesWire:
        encoder = MessagesStream(id=self.id, model=model, signer=self.ctx.signer,
                                 start_usage=lambda: Usage(len(prepared.request.prompt), 0, prepared.cached_tokens))
        return _MessagesWire(encoder, len(prepared.request.prompt))
