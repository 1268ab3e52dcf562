"""OpenAI chat completions: request body -> Turn, Turn output -> wire JSON.

Validation is strict about what would change the answer (types and ranges of
sampling fields, message roles, tool-call names) and lenient about everything else:
unknown fields are ignored, content may be a string, a part array or null, and the
`developer` and legacy `function` roles are mapped onto system and tool.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from jumpahead.engine.types import SamplingParams

from . import sse
from jumpahead.core.content import content_texts
from jumpahead.core.errors import error_body, invalid_request
from jumpahead.core.fields import boolean, integer, number, obj
from jumpahead.core.logprobs import top_logprobs
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
    TurnOutput,
    Usage,
    new_tool_call_id,
)
from .wire import WireContext

IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"
_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image_url", "input_image", "image")
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
_SEED_MASK = (1 << 63) - 1


# --- field readers -------------------------------------------------------------------

_number, _integer, _boolean, _object = number, integer, boolean, obj


# --- messages ------------------------------------------------------------------------


def content_text(content: Any, param: str) -> str | None:
    """A message's content as plain text: strings kept, text parts joined, images noted."""
    if content is None:
        return None
    texts = content_texts(content, _part_text, param)
    if texts is None:
        raise invalid_request(f"{param} must be a string, an array of content parts or null", param=param)
    return "\n".join(texts)


def _part_text(part: Any, where: str) -> str | None:
    if not isinstance(part, dict):
        raise invalid_request(f"{where} must be a content part object", param=where)
    kind = part.get("type", "text")
    text = part.get("text")
    if kind in _TEXT_PARTS or (text is not None and kind not in _IMAGE_PARTS):
        if not isinstance(text, str):
            raise invalid_request(f"{where}.text must be a string", param=f"{where}.text")
        return text
    if kind in _IMAGE_PARTS:
        return IMAGE_PLACEHOLDER
    return None  # other part kinds (refusal without text, file ids, audio) carry no text for us


def _arguments_text(arguments: Any, param: str) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict | list):
        return orjson.dumps(arguments).decode()
    raise invalid_request(f"{param} must be a JSON string", param=param)


def _tool_call(raw: Any, param: str) -> ToolCall:
    raw = _object(raw, param)
    function = raw.get("function", raw)  # tolerate a flat {"name", "arguments"}
    function = _object(function, f"{param}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{param}.function.name must be a non-empty string", param=f"{param}.function.name")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = new_tool_call_id()
    return ToolCall(name=name, arguments=_arguments_text(function.get("arguments"), f"{param}.function.arguments"),
                    id=call_id)


def _message(raw: Any, i: int) -> Message:
    param = f"messages[{i}]"
    raw = _object(raw, param)
    role = raw.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise invalid_request(
            f"{param}.role must be one of {', '.join(_ROLES)}, got {role!r}", param=f"{param}.role"
        )
    message = Message(role=_ROLES[role], content=content_text(raw.get("content"), f"{param}.content"))  # type: ignore[arg-type]
    name = raw.get("name")
    if isinstance(name, str) and name:
        message.name = name
    if message.role == "assistant":
        reasoning = raw.get("reasoning_content", raw.get("reasoning"))
        if isinstance(reasoning, str) and reasoning:
            message.reasoning = reasoning
        tool_calls = raw.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise invalid_request(f"{param}.tool_calls must be an array", param=f"{param}.tool_calls")
            message.tool_calls = [_tool_call(c, f"{param}.tool_calls[{j}]") for j, c in enumerate(tool_calls)]
        elif isinstance(raw.get("function_call"), dict):
            message.tool_calls = [_tool_call({"function": raw["function_call"]}, f"{param}.function_call")]
    elif message.role == "tool":
        call_id = raw.get("tool_call_id")
        if isinstance(call_id, str) and call_id:
            message.tool_call_id = call_id
        if message.content is None:
            message.content = ""
    elif message.content is None:
        message.content = ""
    return message


# --- tools ---------------------------------------------------------------------------


def _tool(raw: Any, i: int) -> Tool | None:
    param = f"tools[{i}]"
    raw = _object(raw, param)
    kind = raw.get("type", "function")
    if kind != "function":
        return None  # hosted tools (web_search, ...) are not ours to run
    function = raw.get("function", raw)  # tolerate the flat Responses shape
    function = _object(function, f"{param}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{param}.function.name must be a non-empty string", param=f"{param}.function.name")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid_request(f"{param}.function.parameters must be a JSON schema object",
                              param=f"{param}.function.parameters")
    description = function.get("description")
    return Tool(name=name, description=description if isinstance(description, str) else "", parameters=parameters)


def _tool_choice(value: Any, tools: list[Tool]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise invalid_request(f"tool_choice must be auto, none, required or a function, got {value!r}",
                                  param="tool_choice")
        return ToolChoice(value)  # type: ignore[arg-type]
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("auto", "none", "required"):
            return ToolChoice(kind)
        function = value.get("function", value)
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise invalid_request("tool_choice.function.name must be a non-empty string", param="tool_choice")
        if tools and name not in {t.name for t in tools}:
            raise invalid_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return ToolChoice("function", name)
    raise invalid_request("tool_choice must be a string or an object", param="tool_choice")


# --- sampling ------------------------------------------------------------------------


def _logit_bias(value: Any, vocab_size: int | None) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_request("logit_bias must be an object of token id -> bias", param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise invalid_request(f"logit_bias key {key!r} is not a token id", param="logit_bias") from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise invalid_request(f"logit_bias token id {token} is outside the vocabulary", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise invalid_request(f"logit_bias[{key}] must be a number in [-100, 100]", param="logit_bias")
        out[token] = float(bias)
    return out


def sampling_params(body: dict[str, Any], vocab_size: int | None = None) -> SamplingParams:
    top_k = _integer(body, "top_k", lo=-1)
    seed = _integer(body, "seed")
    return SamplingParams(
        temperature=_number(body, "temperature", 1.0, lo=0.0),
        top_p=_number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        top_k=max(top_k or 0, 0),
        min_p=_number(body, "min_p", 0.0, lo=0.0, hi=1.0),
        seed=None if seed is None else seed & _SEED_MASK,
        repetition_penalty=_number(body, "repetition_penalty", 1.0, lo=0.0, lo_open=True),
        presence_penalty=_number(body, "presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        logit_bias=_logit_bias(body.get("logit_bias"), vocab_size),
    )


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid_request("stop must be a string or an array of strings", param="stop")
    return [s for s in value if s]


def _logprobs(body: dict[str, Any]) -> int | None:
    """`logprobs: true` plus `top_logprobs` (0..20, only with logprobs): how many
    alternatives per token; None when logprobs are not asked for."""
    wanted = _boolean(body, "logprobs")
    top = top_logprobs(body)
    if top is not None and not wanted:
        raise invalid_request("top_logprobs requires logprobs to be true", param="top_logprobs")
    return (top or 0) if wanted else None


def _thinking(body: dict[str, Any]) -> bool | None:
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("enable_thinking"), bool):
        return kwargs["enable_thinking"]
    effort = body.get("reasoning_effort")
    if effort == "none":
        return False
    return None


# --- request -------------------------------------------------------------------------


def parse_chat_request(body: Any, vocab_size: int | None = None) -> Turn:
    """Validate a /v1/chat/completions body and translate it into a Turn.

    Raises APIError(400) naming the offending field.
    """
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise invalid_request("messages must be a non-empty array", param="messages")
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]

    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise invalid_request("tools must be an array", param="tools")
    tools = [tool for i, raw in enumerate(raw_tools or []) if (tool := _tool(raw, i)) is not None]

    n = _integer(body, "n", lo=1)
    if n not in (None, 1):
        raise invalid_request("only n=1 is supported", param="n")

    max_tokens = _integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", lo=1)

    stream = _boolean(body, "stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        include_usage = _boolean(_object(stream_options, "stream_options"), "include_usage")

    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_request(f"model must be a string, got {type(model).__name__}", param="model")
    extra = {k: body[k] for k in ("reasoning_effort", "metadata", "user") if k in body}
    parallel = body.get("parallel_tool_calls")
    return Turn(
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        sampling=sampling_params(body, vocab_size),
        max_tokens=max_tokens,
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        thinking=_thinking(body),
        model=model if isinstance(model, str) and model else None,
        options=parse_options(body.get("jumpahead")),
        response_format=ResponseFormat.from_wire(body.get("response_format")),
        parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
        continue_final=body.get("continue_final_message") is True,
        extra=extra,
        logprobs=_logprobs(body),
    )


# --- responses -----------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def _usage(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if usage.fill is not None:
        out["fill"] = usage.fill
    report = usage.report.to_json()
    if report is not None:
        out["report"] = report
    return out


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _logprobs_json(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """`choices[].logprobs`: the content tokens' entries (core/logprobs.py); null when not asked."""
    return None if entries is None else {"content": entries, "refusal": None}


def chat_completion(out: TurnOutput, *, id: str, model: str, created: int | None = None) -> dict[str, Any]:
    """The non-streaming `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": out.content}
    if out.tool_calls:
        message["content"] = out.content or None
        message["tool_calls"] = [_tool_call_json(c) for c in out.tool_calls]
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    return {
        "id": id,
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": _logprobs_json(out.logprobs),
                     "finish_reason": out.finish_reason}],
        "usage": _usage(out.usage),
        "system_fingerprint": None,
    }


class ChatStream:
    """Encodes a Turn's OutputEvents as `chat.completion.chunk` objects."""

    def __init__(self, *, id: str, model: str, include_usage: bool = False, created: int | None = None) -> None:
        self.id = id
        self.model = model
        self.include_usage = include_usage
        self.created = created if created is not None else int(time.time())

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": _logprobs_json(logprobs),
                         "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _call_head(self, index: int, call: ToolCall) -> dict[str, Any]:
        return self._chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})

    def _call_args(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]})

    def start(self) -> dict[str, Any]:
        """The first chunk: announces the assistant role."""
        return self._chunk({"role": "assistant", "content": ""})

    def encode(self, event: OutputEvent) -> list[dict[str, Any]]:
        """Chunks for one event. An error TurnEnd becomes an `{"error": ...}` object."""
        if isinstance(event, ContentDelta):
            # each chunk carries the logprobs of the tokens its text came from
            return [self._chunk({"content": event.text}, logprobs=event.logprobs)] if event.text else []
        if isinstance(event, ReasoningDelta):
            return [self._chunk({"reasoning_content": event.text})] if event.text else []
        if isinstance(event, ToolCallStart):
            return [self._call_head(event.index, event.call)]
        if isinstance(event, ToolCallArgs):
            return [self._call_args(event.index, event.text)] if event.text else []
        if isinstance(event, ToolCallDelta):
            # A streamed call already has its head and part of its arguments out.
            chunks = [self._call_head(event.index, event.call)] if event.streamed is None else []
            rest = event.rest
            return chunks + ([self._call_args(event.index, rest)] if rest or event.streamed is None else [])
        if isinstance(event, TurnEnd):
            if event.finish_reason in ("error", "cancelled"):
                message = event.error or f"generation {event.finish_reason}"
                return [{"error": {"message": message, "type": "server_error", "param": None, "code": None}}]
            chunks = [self._chunk({}, event.finish_reason)]
            if self.include_usage:
                usage_chunk = self._chunk({})
                usage_chunk["choices"] = []
                usage_chunk["usage"] = _usage(event.usage)
                chunks.append(usage_chunk)
            return chunks
        return []


class _ChatWire:
    """A ChatStream in SSE `data:` frames: no heartbeat, an error object after a fault,
    and `data: [DONE]` last, also after an error."""

    heartbeat = None

    def __init__(self, encoder: ChatStream) -> None:
        self.encoder = encoder

    def start(self) -> list[bytes]:
        return [sse.data(self.encoder.start())]

    def encode(self, event: OutputEvent) -> list[bytes]:
        return [sse.data(chunk) for chunk in self.encoder.encode(event)]

    def fail(self, message: str) -> list[bytes]:
        return [sse.data(error_body(message, type="server_error"))]

    def end(self) -> list[bytes]:
        return [sse.DONE]


class ChatProtocol:
    """/v1/chat/completions (proxy/wire.py WireProtocol)."""

    protocol = "chat"

    def __init__(self, ctx: WireContext) -> None:
        self.ctx = ctx
        self.turn: Turn | None = None
        self._id: str | None = None

    @property
    def id(self) -> str:
        if self._id is None:
            self._id = completion_id()
        return self._id

    async def parse(self, body: Any) -> Turn:
        self.turn = parse_chat_request(body, self.ctx.engine.info.vocab_size)
        return self.turn

    def body(self, out: TurnOutput, model: str) -> dict[str, Any]:
        return chat_completion(out, id=self.id, model=model)

    def stream(self, prepared: Any, model: str) -> _ChatWire:
        assert self.turn is not None
        return _ChatWire(ChatStream(id=self.id, model=model, include_usage=self.turn.include_usage))
