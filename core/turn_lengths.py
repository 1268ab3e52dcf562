"""The session's recent turn lengths, read off the history an agent resends.

Agents send the whole conversation every turn, so the model's earlier answers in this
session are in the request: their lengths in tokens are what the engine's throughput
objective forecasts a row's length from (GenerationRequest.recent_lengths,
engine/schedule/forecast.py). Each assistant message counts its reasoning, text and tool
calls (name and arguments, plus the call markup) as the model wrote them.
"""

from __future__ import annotations

from typing import Any

from .prompt import continues_final_message
from .turn import Message, Turn

RECENT = 4  # turns the forecast looks back on
CALL_MARKUP = 12  # tokens of a call's wrapper (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`), about
END = 1  # the end-of-turn token


def message_tokens(tokenizer: Any, message: Message) -> int:
    """An assistant message's length in tokens, as the model wrote it (about)."""
    text = (message.reasoning or "") + (message.content or "")
    text += "".join(call.name + (call.arguments or "") for call in message.tool_calls)
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    return len(ids) + CALL_MARKUP * len(message.tool_calls) + END


def recent_turn_lengths(tokenizer: Any, turn: Turn, last: int = RECENT) -> list[int]:
    """Token lengths of the last `last` assistant messages of the history, oldest first
    (an assistant message the answer continues is not a finished turn)."""
    messages = turn.messages[:-1] if continues_final_message(turn) else turn.messages
    out: list[int] = []
    for message in reversed(messages):
        if message.role == "assistant" and (message.content or message.reasoning or message.tool_calls):
            out.append(message_tokens(tokenizer, message))
            if len(out) == last:
                break
    return out[::-1]
