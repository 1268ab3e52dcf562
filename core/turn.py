"""The one internal form of a chat turn, shared by every wire protocol.

A wire protocol (OpenAI chat, Anthropic messages, OpenAI responses) translates its request
into a `Turn` and maps the `OutputEvent`s (or the collected `TurnOutput`) of the model's
answer back onto its wire format. Nothing here knows a protocol or a tensor.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

import orjson

from jumpahead.engine.types import SamplingParams

from .options import RequestOptions

Role = Literal["system", "user", "assistant", "tool"]
ToolChoiceMode = Literal["auto", "none", "required", "function"]
TurnFinish = Literal["stop", "length", "tool_calls", "error", "cancelled"]


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One call of a tool. `arguments` is a JSON text (as OpenAI sends it); a JSON value
    given instead (agents' session files hold objects) is kept as its compact JSON text,
    and text that is no JSON at all (some agents' raw-text tools) is kept as it is."""

    name: str
    arguments: str = "{}"
    # The model's calls get new_tool_call_id(); a client's or a recorded call keeps its
    # own, and a recorded call without one stays "" (Session.turn names it by position).
    id: str = ""
    # Problems found while parsing or validating (unknown tool, schema violations).
    # Reported to logs and traces; the call is still handed to the client.
    issues: list[str] = field(default_factory=list)
    # Cut off (max_tokens) before the call was complete: `arguments` is a prefix.
    partial: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.arguments, str):
            self.arguments = orjson.dumps(self.arguments).decode()

    @property
    def args(self) -> Any:
        """The arguments as a JSON value: an object or array text parsed, other text (raw
        arguments) as it is, {} for none."""
        text = self.arguments.strip()
        if not text:
            return {}
        if text[:1] in ("{", "["):
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                pass
        return self.arguments


@dataclass
class Message:
    """A message in normalized chat form: content is plain text (or None).

    The one conversation model: a request's messages (the wire protocols translate into it) and
    an imported session's messages (traces/session.py) alike. The last three fields are
    a recorded message's provenance; the turn pipeline neither sets nor reads them."""

    role: Role
    content: str | None = None
    reasoning: str | None = None  # an assistant message's earlier reasoning
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # role == "tool": the call it answers
    name: str | None = None  # the tool's name on a tool message, or a speaker name
    model: str | None = None  # the model that wrote this message, where a session says
    timestamp: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # format-specific extras (compaction, recorded request, ...)


@dataclass
class Tool:
    """A function the model may call; `parameters` is its JSON schema (or None)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI `tools[]` entry, which chat templates and tool parsers expect."""
        function: dict[str, Any] = {"name": self.name, "description": self.description}
        function["parameters"] = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": function}


@dataclass
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # mode == "function": the tool that must be called


@dataclass(frozen=True)
class ResponseFormat:
    """A JSON answer the client asked for (chat `response_format`, Responses
    `text.format`, Anthropic `output_config.format`): strict fill's grammar."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None  # json_schema only
    strict: bool = True
    name: str = "response"

    @classmethod
    def from_wire(cls, fmt: Any) -> ResponseFormat | None:
        """Any of the three protocols' format objects; None for text or unknown shapes."""
        if not isinstance(fmt, dict):
            return None
        if fmt.get("type") == "json_object":
            return cls("json_object")
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") if isinstance(fmt.get("json_schema"), dict) else fmt
            if isinstance(spec.get("schema"), dict):
                name = spec.get("name") if isinstance(spec.get("name"), str) and spec.get("name") else "response"
                return cls("json_schema", spec["schema"], spec.get("strict") is not False, name)
        return None

    def grammar(self) -> dict[str, Any]:
        """The engine grammar (engine/strict/fill.py) that holds the answer to this format."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "schema": self.schema, "strict": self.strict}

    def as_openai(self) -> dict[str, Any]:
        """Chat's `response_format` (what an upstream engine is sent)."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema, "strict": self.strict}}


# Context edits: a request's asks to clear old context before the prompt is rendered,
# applied by the policy runtime as sticky rewrites (policies/context_edits.py). Their wire
# form is Anthropic's `context_management` (proxy/anthropic_context.py parses it); `kind`
# names an edit in the report the runtime leaves in `usage.report.context_edits`.
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"


@dataclass(frozen=True)
class ClearToolUsesEdit:
    """Old tool results become a placeholder once the prompt passes `trigger`."""

    kind: ClassVar[str] = CLEAR_TOOL_USES
    trigger: int = 100_000
    trigger_unit: Literal["input_tokens", "tool_uses"] = "input_tokens"
    keep: int = 3  # the newest tool uses left as they are
    clear_at_least: int = 0  # input tokens a new clear must remove
    exclude_tools: tuple[str, ...] = ()  # tools whose uses are never cleared
    clear_tool_inputs: bool | tuple[str, ...] = False  # the calls' inputs too (all, or these tools')


@dataclass(frozen=True)
class ClearThinkingEdit:
    """The reasoning of all but the last `keep` thinking turns is dropped."""

    kind: ClassVar[str] = CLEAR_THINKING
    keep: int | Literal["all"] = 1


ContextEditSpec = Union[ClearToolUsesEdit, ClearThinkingEdit]


@dataclass
class Turn:
    """One request for the model's next assistant message."""

    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: the server's default
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False  # streaming: send a usage record at the end
    thinking: bool | None = None  # None: the chat template's default
    model: str | None = None  # the name the client asked for
    # Logprobs of the content tokens (core/logprobs.py): None = not asked; N = with
    # the N most likely alternatives per token.
    logprobs: int | None = None
    # The request's `jumpahead` object (core/options.py), parsed once by the wire protocol.
    options: RequestOptions = field(default_factory=RequestOptions)
    response_format: ResponseFormat | None = None  # a JSON answer asked for
    # The protocol's parallel-calls switch (chat `parallel_tool_calls`, Anthropic
    # `disable_parallel_tool_use` negated); None: not said.
    parallel_tool_calls: bool | None = None
    # The answer continues the last assistant message (Anthropic prefill, chat
    # `continue_final_message`) instead of starting a new one.
    continue_final: bool = False
    # Context edits asked for (Anthropic `context_management`, parsed by
    # proxy/anthropic_context.py), applied by the policy runtime; None: not asked.
    context_edits: list[ContextEditSpec] | None = None
    # Protocol fields passed through for traces, policies and an upstream engine
    # (reasoning_effort, metadata, ...); nothing here drives behaviour.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice.mode != "none"


@dataclass
class TurnReport:
    """What jumpahead did to a turn besides generating it, for the client: the wire protocols
    send it as `usage.report`, beside the engine's own telemetry `usage.fill`."""

    # The policy runtime's report (policies/runtime.py): active policies, their hook
    # and watch time, errors, and the interventions with what each supplied.
    policies: dict[str, Any] | None = None
    # The context edits the policy runtime applied (policies/context_edits.py);
    # the Messages protocol answers `context_management.applied_edits` from it.
    context_edits: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any] | None:
        out = {k: v for k, v in (("policies", self.policies), ("context_edits", self.context_edits)) if v is not None}
        return out or None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache
    fill: dict | None = None  # the engine's telemetry (engine/fill_report.py: tokens by kind, rounds, ...)
    # The turn's report (the same object from TurnEnd to the collected output, so a hook
    # that writes it after the turn reaches the wire's last event).
    report: TurnReport = field(default_factory=TurnReport)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# --- output events: what the model's answer turns into, in order -----------------


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ContentDelta:
    text: str
    # OpenAI logprob entries of the tokens this text came from (core/logprobs.py);
    # None when the request did not ask for logprobs.
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class ToolCallStart:
    """A tool call began: its id and name are known (`call.arguments` is still empty)."""

    index: int
    call: ToolCall


@dataclass
class ToolCallArgs:
    """More argument text of the started call `index` (the deltas concatenate to a
    prefix of the finished call's `arguments`)."""

    index: int
    text: str


@dataclass
class ToolCallDelta:
    """A complete tool call, the `index`-th of this turn.

    `streamed`: the argument text already sent after a ToolCallStart (None when the
    call was not streamed); the rest is `call.arguments[len(streamed):]`."""

    index: int
    call: ToolCall
    streamed: str | None = None

    @property
    def rest(self) -> str:
        """The argument text still to send."""
        if self.streamed is None:
            return self.call.arguments
        args = self.call.arguments
        return args[len(self.streamed):] if args.startswith(self.streamed) else ""


@dataclass
class TurnEnd:
    """The last event of every turn."""

    finish_reason: TurnFinish
    usage: Usage
    error: str | None = None
    stop_sequence: str | None = None  # the stop string that ended the turn, if one did


OutputEvent = Union[ReasoningDelta, ContentDelta, ToolCallStart, ToolCallArgs, ToolCallDelta, TurnEnd]


@dataclass
class TurnOutput:
    """The whole answer, collected from the events."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: TurnFinish = "stop"
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    stop_sequence: str | None = None
    logprobs: list[dict[str, Any]] | None = None  # the content's entries, when asked (see Turn.logprobs)

    def add(self, event: OutputEvent) -> None:
        if isinstance(event, ReasoningDelta):
            self.reasoning += event.text
        elif isinstance(event, ContentDelta):
            self.content += event.text
            if event.logprobs is not None:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.extend(event.logprobs)
        elif isinstance(event, ToolCallDelta):
            self.tool_calls.append(event.call)
        elif isinstance(event, TurnEnd):
            self.finish_reason = event.finish_reason
            self.usage = event.usage
            self.error = event.error
            self.stop_sequence = event.stop_sequence
