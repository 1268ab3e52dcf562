"""Render a Turn into prompt token ids with the tokenizer's chat template.

Chat templates are strict about shapes real clients send loosely: content must be a
string, tool-call arguments a mapping, `system` only first (some templates), no
`developer` role. The Turn is already normalized (see openai_chat.py); this module
turns it into the dicts templates expect and retries with simpler shapes when a
template refuses a legal conversation.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from .errors import invalid_request
from .turn import Message, Turn

log = logging.getLogger(__name__)


def _arguments_for_template(arguments: str) -> Any:
    """Tool-call arguments as a mapping; templates run `tojson` or iterate items."""
    try:
        value = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        return arguments  # keep the client's text rather than invent arguments
    return value


def _message_dict(message: Message, call_names: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.role == "assistant":
        if message.reasoning:
            out["reasoning_content"] = message.reasoning
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments_for_template(call.arguments)},
                }
                for call in message.tool_calls
            ]
    elif message.role == "tool":
        if message.tool_call_id:
            out["tool_call_id"] = message.tool_call_id
        name = message.name or call_names.get(message.tool_call_id or "")
        if name:
            out["name"] = name
    elif message.name:
        out["name"] = message.name
    return out


def template_messages(turn: Turn) -> list[dict[str, Any]]:
    """The Turn's messages as chat-template dicts (OpenAI shape, arguments as dicts)."""
    call_names: dict[str, str] = {}
    out = []
    for message in turn.messages:
        for call in message.tool_calls:
            call_names[call.id] = call.name
        out.append(_message_dict(message, call_names))
    return out


def template_tools(turn: Turn) -> list[dict[str, Any]] | None:
    """The tools to show the model, or None (tool_choice none hides them)."""
    if not turn.tools_enabled:
        return None
    return [tool.as_openai() for tool in turn.tools]


def _systems_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All system messages merged into one leading system message."""
    systems = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    if not systems:
        return messages
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest]


def _systems_into_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates without a system role: system text prefixed to the first user message."""
    systems = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not systems:
        return messages
    for m in rest:
        if m["role"] == "user":
            m["content"] = "\n\n".join([*systems, m["content"]])
            return rest
    return [{"role": "user", "content": "\n\n".join(systems)}, *rest]


def continues_final_message(turn: Turn) -> bool:
    """The output continues the last (assistant) message instead of starting a new one."""
    last = turn.messages[-1] if turn.messages else None
    return bool(
        turn.continue_final and last is not None and last.role == "assistant"
        and not last.tool_calls
    )


def render_prompt(tokenizer: Any, turn: Turn) -> list[int]:
    """Prompt token ids for the Turn: template + generation prompt (or continuation).

    Raises APIError(400) when the template cannot render the conversation.
    """
    messages = template_messages(turn)
    if not messages:
        raise invalid_request("messages must not be empty", param="messages")
    kwargs: dict[str, Any] = {"tools": template_tools(turn)}
    if turn.thinking is not None:
        kwargs["enable_thinking"] = turn.thinking
    if continues_final_message(turn):
        kwargs["continue_final_message"] = True
        kwargs["add_generation_prompt"] = False
    else:
        kwargs["add_generation_prompt"] = True

    first_error: Exception | None = None
    for reshape in (None, _systems_first, _systems_into_user):
        attempt = messages if reshape is None else reshape(messages)
        if reshape is not None and attempt is messages:
            continue  # no system messages: nothing to reshape
        try:
            ids = tokenizer.apply_chat_template(attempt, tokenize=True, **kwargs)
        except Exception as exc:  # jinja2 TemplateError, TypeError, ValueError, ...
            first_error = first_error or exc
            log.debug("chat template refused a shape: %s", exc)
            continue
        if hasattr(ids, "input_ids"):  # a BatchEncoding despite return_dict=False
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    raise invalid_request(f"the model's chat template cannot render these messages: {first_error}", param="messages")


def prompt_opens_reasoning(tokenizer: Any, prompt: list[int]) -> bool:
    """True when the prompt ends inside a reasoning block the template opened."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    start = tokenizer.rfind_think_start(prompt)
    end = tokenizer.rfind_think_end(prompt)
    return start >= 0 and start > end
