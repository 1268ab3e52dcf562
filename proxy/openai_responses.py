"""OpenAI Responses: request body -> Turn, Turn output -> response object and SSE events.

Input items (messages with any role, function calls and their outputs, reasoning,
custom tool calls) become the Turn's messages; `previous_response_id` prepends a
stored conversation; a compaction item (proxy/compaction_item.py) stands for the whole
conversation before it. Tools the model cannot serve are handled without failing:
hosted tools (web_search, file_search, ...) are left out, `namespace` tools are
flattened into their nested functions (and calls mapped back to name + namespace),
`custom` (free-form) tools are offered as a function with one string `input`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from jumpahead.engine.types import SamplingParams

from .compaction_item import compact_threshold, open_item
from jumpahead.core.errors import APIError, invalid_request
from jumpahead.core.fields import boolean, integer, number, obj
from jumpahead.core.logprobs import top_logprobs
from .openai_chat import content_text
from .response_store import ResponseStore, StoredResponse
from .sse import KEEPALIVE
from .signing import Signer, default_signer
from jumpahead.core.options import parse_options
from jumpahead.core.turn import Message, ResponseFormat, Tool, ToolCall, ToolChoice, Turn, TurnOutput, Usage
from .wire import WireContext

_SEED_MASK = (1 << 63) - 1
CUSTOM_INPUT_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ToolName:
    """How a model-visible tool name maps back onto the client's tool."""

    name: str  # the client's name (inside its namespace, if any)
    kind: str = "function"  # "function" or "custom"
    namespace: str | None = None


@dataclass
class ResponsesContext:
    """What the answer needs from the request besides the Turn."""

    body: dict[str, Any]
    tool_names: dict[str, ToolName] = field(default_factory=dict)  # model-visible -> client
    history: list[Message] = field(default_factory=list)  # conversation without instructions
    store: bool = True
    include_encrypted: bool = False
    previous_response_id: str | None = None
    signer: Signer = field(default_factory=default_signer)  # seals and opens encrypted_content
    reasoning_dropped: int = 0  # reasoning items sent back whose encrypted_content did not verify
    compacted: int = 0  # leading messages of `history` that the latest compaction item stands for
    compact_threshold: int | None = None  # context_management: compact above this many prompt tokens (0: default)
    lead_items: list[dict[str, Any]] = field(default_factory=list)  # output items before the answer's (compaction)

    def visible_name(self, name: str, namespace: str | None = None) -> str:
        for visible, target in self.tool_names.items():
            if target.name == name and target.namespace == namespace:
                return visible
        return name


# --- tools ---------------------------------------------------------------------------


def _function_tool(raw: dict[str, Any], param: str, kind: str) -> tuple[str, Tool]:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{param}.name must be a non-empty string", param=f"{param}.name")
    description = raw.get("description")
    description = description if isinstance(description, str) else ""
    if kind == "custom":
        return name, Tool(name, description, CUSTOM_INPUT_SCHEMA)
    parameters = raw.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid_request(f"{param}.parameters must be a JSON schema object", param=f"{param}.parameters")
    return name, Tool(name, description, parameters)


def _tools(raw_tools: Any, ctx: ResponsesContext) -> list[Tool]:
    if raw_tools is None:
        return []
    if not isinstance(raw_tools, list):
        raise invalid_request("tools must be an array", param="tools")
    found: list[tuple[ToolName, Tool]] = []
    for i, raw in enumerate(raw_tools):
        raw = obj(raw, f"tools[{i}]")
        kind = raw.get("type", "function")
        if kind in ("function", "custom"):
            name, tool = _function_tool(raw, f"tools[{i}]", kind)
            found.append((ToolName(name, kind), tool))
        elif kind == "namespace":
            namespace = raw.get("name")
            nested = raw.get("tools", raw.get("functions", []))
            if not isinstance(nested, list):
                raise invalid_request(f"tools[{i}].tools must be an array", param=f"tools[{i}].tools")
            for j, sub in enumerate(nested):
                sub = obj(sub, f"tools[{i}].tools[{j}]")
                sub_kind = sub.get("type", "function")
                if sub_kind not in ("function", "custom"):
                    continue
                name, tool = _function_tool(sub, f"tools[{i}].tools[{j}]", sub_kind)
                found.append((ToolName(name, sub_kind, namespace if isinstance(namespace, str) else None), tool))
        # web_search, file_search, code_interpreter, image_generation, mcp, ...: hosted, not ours
    counts: dict[str, int] = {}
    for target, _ in found:
        counts[target.name] = counts.get(target.name, 0) + 1
    tools = []
    for target, tool in found:
        if counts[tool.name] > 1 and target.namespace:  # the same name in two namespaces
            tool.name = f"{target.namespace}__{target.name}"
        ctx.tool_names[tool.name] = target
        tools.append(tool)
    return tools


def _tool_choice(value: Any, ctx: ResponsesContext) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise invalid_request(f"tool_choice must be auto, none, required or an object, got {value!r}",
                                  param="tool_choice")
        return ToolChoice(value)  # type: ignore[arg-type]
    value = obj(value, "tool_choice")
    kind = value.get("type")
    if kind in ("function", "custom"):
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request("tool_choice.name must be a non-empty string", param="tool_choice.name")
        visible = ctx.visible_name(name, value.get("namespace") if isinstance(value.get("namespace"), str) else None)
        if visible not in ctx.tool_names:
            raise invalid_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice.name")
        return ToolChoice("function", visible)
    if kind == "allowed_tools" and value.get("mode") == "required":
        return ToolChoice("required")
    return ToolChoice("auto")  # allowed_tools, hosted tool types: let the model choose


# --- input items ---------------------------------------------------------------------


def _output_text(value: Any, param: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        text = content_text(value, param)
        return text or ""
    return orjson.dumps(value).decode()


def _reasoning_text(item: dict[str, Any], ctx: ResponsesContext) -> str:
    """The reasoning an item carries back. `encrypted_content` is used when this server
    sealed it (proxy/signing.py); one that does not verify (another server's, or
    altered) drops the item. Without it, the summary (or content) text is used."""
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted:
        text = ctx.signer.open(encrypted)
        if text is None:
            ctx.reasoning_dropped += 1
            return ""
        return text
    parts = []
    for key in ("content", "summary"):
        for part in item.get(key) or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        if parts:
            break
    return "\n".join(parts)


class _Conversation:
    """Builds normalized messages from input items, merging an assistant's pieces."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.reasoning: list[str] = []

    def _assistant(self) -> Message:
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant":
            last = Message("assistant", None)
            self.messages.append(last)
        if self.reasoning:
            last.reasoning = "\n".join(filter(None, [last.reasoning, *self.reasoning]))
            self.reasoning = []
        return last

    def add_message(self, role: str, text: str) -> None:
        if role == "assistant":
            last = self.messages[-1] if self.messages else None
            if last is not None and last.role == "assistant" and not last.tool_calls and not self.reasoning:
                last.content = "\n".join(filter(None, [last.content, text]))
                return
            message = Message("assistant", text)
            self.messages.append(message)
            if self.reasoning:
                message.reasoning = "\n".join(self.reasoning)
                self.reasoning = []
            return
        self.messages.append(Message("system" if role in ("system", "developer") else "user", text))

    def add_call(self, call: ToolCall) -> None:
        self._assistant().tool_calls.append(call)

    def add_output(self, call_id: str, text: str) -> None:
        self.messages.append(Message("tool", text, tool_call_id=call_id))


def _item(conv: _Conversation, raw: Any, i: int, ctx: ResponsesContext) -> None:
    param = f"input[{i}]"
    item = obj(raw, param)
    kind = item.get("type", "message")
    if kind == "message" or (kind is None and "role" in item):
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise invalid_request(f"{param}.role must be user, assistant, system or developer, got {role!r}",
                                  param=f"{param}.role")
        conv.add_message(role, content_text(item.get("content"), f"{param}.content") or "")
    elif kind in ("function_call", "custom_tool_call"):
        name = item.get("name")
        call_id = item.get("call_id")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"{param}.name must be a non-empty string", param=f"{param}.name")
        if not isinstance(call_id, str) or not call_id:
            raise invalid_request(f"{param}.call_id must be a non-empty string", param=f"{param}.call_id")
        namespace = item.get("namespace") if isinstance(item.get("namespace"), str) else None
        if kind == "custom_tool_call":
            arguments = orjson.dumps({"input": _output_text(item.get("input"), f"{param}.input")}).decode()
        else:
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = orjson.dumps(arguments).decode()
        conv.add_call(ToolCall(ctx.visible_name(name, namespace), arguments or "{}", id=call_id))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid_request(f"{param}.call_id must be a non-empty string", param=f"{param}.call_id")
        conv.add_output(call_id, _output_text(item.get("output"), f"{param}.output"))
    elif kind == "reasoning":
        text = _reasoning_text(item, ctx)
        if text:
            conv.reasoning.append(text)
    elif kind == "compaction":
        # It stands for everything before it (the user messages /compact returns with
        # it are inside it too): the conversation restarts from its sealed messages.
        conv.messages[:] = open_item(item, ctx.signer, param)
        conv.reasoning = []
        ctx.compacted = len(conv.messages)
    # item_reference, web_search_call, file_search_call, ...: nothing the model can read


def _input_messages(value: Any, ctx: ResponsesContext, history: list[Message]) -> list[Message]:
    conv = _Conversation(list(history))
    if isinstance(value, str):
        conv.add_message("user", value)
    elif isinstance(value, list):
        for i, raw in enumerate(value):
            _item(conv, raw, i, ctx)
    elif value is not None:
        raise invalid_request("input must be a string or an array of input items", param="input")
    return conv.messages


# --- request -------------------------------------------------------------------------


def _thinking(reasoning: Any) -> bool | None:
    if isinstance(reasoning, dict) and reasoning.get("effort") == "none":
        return False
    return None


def parse_responses_request(body: Any, store: ResponseStore | None = None,
                            signer: Signer | None = None) -> tuple[Turn, ResponsesContext]:
    """Validate a /v1/responses body and translate it into a Turn (plus what the answer needs).

    Raises APIError(400) naming the offending field; an unknown previous_response_id is a 400 too.
    """
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    ctx = ResponsesContext(body=body, signer=signer or default_signer())
    tools = _tools(body.get("tools"), ctx)
    history: list[Message] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str) or not previous:
            raise invalid_request("previous_response_id must be a non-empty string", param="previous_response_id")
        entry = store.get(previous) if store is not None else None
        if entry is None:
            raise APIError(f"previous response {previous!r} not found (unknown, not stored, or evicted)",
                           status=400, param="previous_response_id", code="previous_response_not_found")
        history = entry.messages
        ctx.previous_response_id = previous
    messages = _input_messages(body.get("input"), ctx, history)
    ctx.history = messages
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_request("instructions must be a string", param="instructions")
    if instructions:
        messages = [Message("system", instructions), *messages]
    if not any(m.role != "system" for m in messages):
        raise invalid_request("input must contain at least one message or item", param="input")
    ctx.store = boolean(body, "store", default=True)
    ctx.compact_threshold = compact_threshold(body)
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise invalid_request("include must be an array of strings", param="include")
    ctx.include_encrypted = "reasoning.encrypted_content" in (include or [])
    # Logprobs of the output text: asked by include (OpenAI's way) or by top_logprobs alone.
    top = top_logprobs(body)
    wants_logprobs = "message.output_text.logprobs" in (include or []) or top is not None
    seed = integer(body, "seed")
    sampling = SamplingParams(
        temperature=number(body, "temperature", 1.0, lo=0.0, hi=2.0),
        top_p=number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        seed=None if seed is None else seed & _SEED_MASK,
    )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_request(f"model must be a string, got {type(model).__name__}", param="model")
    extra = {k: body[k] for k in ("reasoning", "metadata", "user", "prompt_cache_key", "text", "include", "truncation")
             if k in body}
    parallel = body.get("parallel_tool_calls")
    text = body.get("text")
    turn = Turn(
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), ctx),
        sampling=sampling,
        max_tokens=integer(body, "max_output_tokens", lo=1),
        stream=boolean(body, "stream"),
        thinking=_thinking(body.get("reasoning")),
        model=model if isinstance(model, str) and model else None,
        options=parse_options(body.get("jumpahead")),
        response_format=ResponseFormat.from_wire(text.get("format")) if isinstance(text, dict) else None,
        parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
        extra=extra,
        logprobs=(top or 0) if wants_logprobs else None,
    )
    return turn, ctx


# --- output --------------------------------------------------------------------------


def _usage(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }
    if usage.fill is not None:
        out["fill"] = usage.fill
    report = usage.report.to_json()
    if report is not None:
        out["report"] = report
    return out


def reasoning_item(text: str, ctx: ResponsesContext, id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": id or new_id("rs"),
                            "summary": [{"type": "summary_text", "text": text}] if text else []}
    if ctx.include_encrypted:
        item["encrypted_content"] = ctx.signer.seal(text)
    return item


def message_item(text: str, id: str | None = None, status: str = "completed",
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`logprobs`: the text's token entries (core/logprobs.py); [] when not asked."""
    content = []
    if status == "completed":
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs or [])}]
    return {"type": "message", "id": id or new_id("msg"), "status": status, "role": "assistant", "content": content}


def call_item(call: ToolCall, ctx: ResponsesContext, id: str | None = None, done: bool = True) -> dict[str, Any]:
    target = ctx.tool_names.get(call.name, ToolName(call.name))
    status = ("incomplete" if call.partial else "completed") if done else "in_progress"
    if target.kind == "custom":
        try:
            value = orjson.loads(call.arguments)
        except orjson.JSONDecodeError:
            value = None
        text = value["input"] if isinstance(value, dict) and isinstance(value.get("input"), str) else call.arguments
        return {"type": "custom_tool_call", "id": id or new_id("ctc"), "call_id": call.id, "name": target.name,
                "input": text if done else "", "status": status}
    item = {"type": "function_call", "id": id or new_id("fc"), "call_id": call.id, "name": target.name,
            "arguments": call.arguments if done else "", "status": status}
    if target.namespace:
        item["namespace"] = target.namespace
    return item


def output_items(out: TurnOutput, ctx: ResponsesContext) -> list[dict[str, Any]]:
    items = list(ctx.lead_items)
    if out.reasoning:
        items.append(reasoning_item(out.reasoning, ctx))
    if out.content:
        items.append(message_item(out.content, logprobs=out.logprobs))
    items.extend(call_item(call, ctx) for call in out.tool_calls)
    return items


def response_object(ctx: ResponsesContext, *, id: str, model: str, created_at: int, status: str,
                    output: list[dict[str, Any]], usage: Usage | None = None,
                    error: str | None = None) -> dict[str, Any]:
    body = ctx.body
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    tool_choice = body.get("tool_choice", "auto")
    return {
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": {"code": "server_error", "message": error} if status == "failed" else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "previous_response_id": ctx.previous_response_id,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": ctx.store,
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
        "tool_choice": tool_choice if isinstance(tool_choice, str | dict) else "auto",
        "tools": body.get("tools") if isinstance(body.get("tools"), list) else [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": _usage(usage) if usage is not None else None,
        "user": None,
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
    }


def status_of(out: TurnOutput) -> str:
    if out.finish_reason in ("error", "cancelled"):
        return "failed"
    return "incomplete" if out.finish_reason == "length" else "completed"


def assistant_message(out: TurnOutput) -> Message:
    """The answer as a conversation message (for previous_response_id)."""
    return Message("assistant", out.content or None, reasoning=out.reasoning or None, tool_calls=list(out.tool_calls))


def store_response(store: ResponseStore, ctx: ResponsesContext, out: TurnOutput, response: dict[str, Any]) -> None:
    """Keep a finished response for previous_response_id (when the request asked to store)."""
    if ctx.store and response.get("status") in ("completed", "incomplete"):
        store.put(response["id"], StoredResponse([*ctx.history, assistant_message(out)], response))


class _ResponsesWire:
    """A ResponsesStream's frames: keep-alive comments fill long silences; a response
    that completed is stored when the stream ends."""

    heartbeat = staticmethod(lambda: KEEPALIVE)

    def __init__(self, encoder: Any, store: ResponseStore, ctx: ResponsesContext) -> None:
        self.encoder = encoder
        self.store = store
        self.ctx = ctx
        self.first = encoder.start()

    def start(self) -> list[bytes]:
        return self.first

    def encode(self, event: Any) -> list[bytes]:
        return self.encoder.encode(event)

    def fail(self, message: str) -> list[bytes]:
        return self.encoder.fail(message)

    def end(self) -> list[bytes]:
        encoder = self.encoder
        if encoder.done and encoder.out.finish_reason not in ("error", "cancelled"):
            status = status_of(encoder.out)
            store_response(self.store, self.ctx, encoder.out, encoder._response(status, encoder.out.usage))
        return []


class ResponsesProtocol:
    """/v1/responses (proxy/wire.py WireProtocol)."""

    protocol = "responses"

    def __init__(self, ctx: WireContext) -> None:
        self.server = ctx
        self.ctx: ResponsesContext | None = None
        self._id: tuple[str, int] | None = None

    @property
    def id(self) -> tuple[str, int]:
        """The response id and its created_at (taken when the answer starts)."""
        if self._id is None:
            self._id = (f"resp_{uuid.uuid4().hex}", int(time.time()))
        return self._id

    async def parse(self, body: Any) -> Turn:
        from .responses_compact import apply_context_management

        turn, self.ctx = parse_responses_request(body, self.server.responses, self.server.signer)
        self.server.stats["reasoning_dropped"] += self.ctx.reasoning_dropped
        return await apply_context_management(self.server.engine, turn, self.ctx)  # context_management: compaction

    def body(self, out: TurnOutput, model: str) -> dict[str, Any]:
        assert self.ctx is not None
        rid, created = self.id
        response = response_object(self.ctx, id=rid, model=model, created_at=created, status=status_of(out),
                                   output=output_items(out, self.ctx), usage=out.usage)
        store_response(self.server.responses, self.ctx, out, response)
        return response

    def stream(self, prepared: Any, model: str) -> _ResponsesWire:
        from .responses_stream import ResponsesStream

        assert self.ctx is not None
        rid, created = self.id
        encoder = ResponsesStream(self.ctx, id=rid, model=model, created_at=created)
        return _ResponsesWire(encoder, self.server.responses, self.ctx)
