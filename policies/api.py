"""The Policy API: how a policy sees a request and its row, and what it may return.

A policy is a class with optional hooks; each hook gets plain data (text, token ids,
parsed structure), never tensors (docs/design.md, Policies):

- `on_request(ctx)`: rewrite the request's context (the core Turn) before it is
  rendered; return a new Turn (or the same, edited) or None to leave it.
- `proposers(ctx)`: extra engine Proposers for this request's row.
- boundary hooks, called as the row's output crosses parser boundaries (see
  `Boundary`); each returns an `Intervention` or None. `on_boundary` dispatches to the
  named hook (`on_reasoning_closed`, `on_block_closed` (a fenced block of the
  visible text closed, no call open), `on_tool_call_opened`, `on_tool_name`,
  `on_argument_key`, `on_turn_end`); override either.
- `on_result(result)`: observe the finished turn.

Boundary hooks run where the engine decides a row's next round, so they must be cheap;
the runtime (policies/runtime.py) times every hook and reports the time as H. A hook
that raises disables that policy for the rest of the request, with one warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the policy API imports nothing of jumpahead at import time (tests/test_layering.py)
    from jumpahead.core.turn import Turn

Boundary = Literal["reasoning_closed", "block_closed", "tool_call_opened", "tool_name", "argument_key", "turn_end"]
BOUNDARIES: tuple[str, ...] = ("reasoning_closed", "block_closed", "tool_call_opened", "tool_name", "argument_key",
                               "turn_end")


@dataclass
class SessionState:
    """What a policy may keep across the requests of one agent session (memo, counters).

    `memo` survives between requests of the same session id in this server process;
    sticky rewrites (compaction) live there."""

    id: str
    memo: dict[str, Any] = field(default_factory=dict)
    requests: int = 0  # requests of this session seen before this one


@dataclass
class RequestContext:
    """Given to `on_request` and `proposers`."""

    turn: "Turn"  # the request's context; on_request may return an edited copy
    session: SessionState
    tokenizer: Any  # the serving model's tokenizer (encode/decode, chat template)
    context_length: int  # the model's window in tokens
    options: dict[str, Any] = field(default_factory=dict)  # the policy's own key=value options
    notes: list[dict[str, Any]] = field(default_factory=list)  # interventions reported by on_request
    # Ask the serving model to write text: generate(prompt_text, max_tokens) -> text, the
    # prompt rendered as one user message (None where no engine is at hand). Blocking;
    # on_request runs off the event loop, so a policy may call it (model-written summaries).
    generate: Callable[[str, int], str] | None = None

    def count_tokens(self, turn: "Turn | None" = None) -> int:
        """Prompt tokens of `turn` (default: this one) under the model's chat template."""
        from jumpahead.core.prompt import render_prompt

        return len(render_prompt(self.tokenizer, turn if turn is not None else self.turn))


@dataclass
class BoundaryEvent:
    """The row's output at a parser boundary. Text is the decoded output so far."""

    boundary: Boundary
    output_text: str  # everything the row has emitted in this turn
    output_tokens: Sequence[int]
    reasoning: str  # reasoning text so far (without the think markers)
    content: str  # visible text so far (without tool-call markup)
    context_text: str  # the rendered prompt as text (the copy source for jumps)
    tool_name: str | None = None  # inside a tool call: its name once complete
    call_text: str = ""  # inside a tool call: its body so far (after the start marker)
    argument_key: str | None = None  # argument_key: the key just emitted
    calls_done: int = 0  # tool calls completed earlier in this turn
    session: SessionState | None = None
    prompt_tokens: int = 0
    budget: int = 0  # tokens the row may still emit


@dataclass
class Intervention:
    """What a boundary hook asks for.

    `text` (or `tokens`) is appended after the row's output: as asserted tokens (kind
    `jump`, never sampled or verified) unless `verified` is set, in which case the
    model checks them token by token like an echo proposal and keeps what it agrees
    with. `source` names where the content came from: a (start, end) character span
    of `BoundaryEvent.context_text` (or of the output with `source_in="output"`).
    """

    text: str | None = None
    tokens: list[int] | None = None
    verified: bool = False
    kind: str = "jump"
    source: tuple[int, int] | None = None
    source_in: Literal["context", "output", "trace"] = "context"
    label: str = ""  # a short account for telemetry ("write path=a.py content from tool result 3")


@dataclass
class TurnResult:
    """Given to `on_result`: the finished turn."""

    session: SessionState
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]]  # [{"name", "arguments" (JSON text), "id"}]
    finish_reason: str
    output_tokens: Sequence[int]
    interventions: list[dict[str, Any]]


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def flag_option(options: dict[str, Any], key: str, policy: str, default: str = "0") -> bool:
    """A 0/1 option (`verify=1`; also true/false, yes/no, on/off); anything else is a
    ValueError naming the policy and the option."""
    value = str(options.get(key, default)).strip().lower()
    if value not in _TRUE | _FALSE:
        raise ValueError(f"{policy}: {key} must be 0 or 1, got {options[key]!r}")
    return value in _TRUE


class Policy:
    """Base class with no-op hooks. Subclasses set `name` and override what they need.

    Options come from `--policy NAME:key=value,...`, the request's `jumpahead.policies`
    field or a TOML file, and are passed to `__init__` as keyword strings.
    """

    name: str = "policy"

    def __init__(self, **options: str) -> None:
        self.options = dict(options)

    # request level
    def on_request(self, ctx: RequestContext) -> "Turn | None":
        return None

    def proposers(self, ctx: RequestContext) -> list[Any]:
        return []

    # boundaries
    def on_boundary(self, event: BoundaryEvent) -> Intervention | None:
        hook = getattr(self, f"on_{event.boundary}", None)
        return hook(event) if hook is not None else None

    def on_reasoning_closed(self, event: BoundaryEvent) -> Intervention | None:
        return None

    def on_block_closed(self, event: BoundaryEvent) -> Intervention | None:
        return None

    def on_tool_call_opened(self, event: BoundaryEvent) -> Intervention | None:
        return None

    def on_tool_name(self, event: BoundaryEvent) -> Intervention | None:
        return None

    def on_argument_key(self, event: BoundaryEvent) -> Intervention | None:
        return None

    def on_turn_end(self, event: BoundaryEvent) -> Intervention | None:
        return None

    # after the turn
    def on_result(self, result: TurnResult) -> None:
        return None

    @property
    def uses_boundaries(self) -> bool:
        """Whether any boundary hook is overridden (else the runtime skips the row watch)."""
        base = Policy
        return any(getattr(type(self), n) is not getattr(base, n)
                   for n in ("on_boundary", *(f"on_{b}" for b in BOUNDARIES)))
