"""The policy runtime: the turn hooks (core/exchange.py) that run policies.

`PolicyHooks(specs, tokenizer, context_length, generate)` goes into create_app's
`hooks` (before the trace recorder, so traces show the context after policies):

- `before_render`: builds this request's policy instances (the server's specs plus the
  request's `jumpahead.policies`; `"replace": true` drops the server's), gives each
  `on_request` a RequestContext in order, and keeps a SessionState per agent session
  (its memo survives across the session's requests; bounded LRU of sessions);
- `row_proposers`: each policy's `proposers(ctx)`, plus one BoundaryProposer
  (policies/boundary.py) when any policy has boundary hooks;
- `after_turn`: late boundaries and `turn_end` (observation), `on_result`, then the
  report: `exchange.notes["interventions"]`, `exchange.notes["policies"]`, the same in
  the answer's `usage.report.policies`, and counters for /metrics.

Every hook call is timed and charged to its policy's H. A hook that raises (or returns
something it should not) disables that policy for the rest of the request with one
warning; the request still completes.

This module is the bridge between policies and the turn pipeline (core/), so it imports core types.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jumpahead.engine.interface import LocalEngine
from jumpahead.core.errors import invalid_request
from jumpahead.core.exchange import Exchange
from jumpahead.core.turn import Turn, TurnOutput

from .api import BOUNDARIES, BoundaryEvent, Intervention, Policy, RequestContext, SessionState, TurnResult
from .boundary import BoundaryProposer
from .context_edits import edit_specs
from .context_edits import report as context_edits_report
from .registry import PolicyError, PolicySpec, parse_spec, spec_from_object
from .tracker import OutputTracker

log = logging.getLogger(__name__)

MAX_SESSIONS = 512  # agent sessions whose memo is kept (least recently used dropped)
STATE_KEY = "policies"  # Exchange.state slot of this request's PolicyRun


def uses_boundaries(policy: Any) -> bool:
    if isinstance(policy, Policy):
        return policy.uses_boundaries
    return callable(getattr(policy, "on_boundary", None)) or any(
        callable(getattr(policy, f"on_{b}", None))
        for b in BOUNDARIES)


def _dispatch(policy: Any, event: BoundaryEvent) -> Any:
    hook = getattr(policy, "on_boundary", None)
    if callable(hook):
        return hook(event)
    hook = getattr(policy, f"on_{event.boundary}", None)
    return hook(event) if callable(hook) else None


def policy_name(policy: Any, spec: PolicySpec) -> str:
    name = getattr(policy, "name", None)
    if not isinstance(name, str) or not name or name == Policy.name:
        name = spec.name if spec.builtin else spec.target.rpartition(":")[2]
    return name


@dataclass
class Active:
    """One policy instance in one request, with its time (H) by hook."""

    name: str
    policy: Any
    spec: PolicySpec
    disabled: bool = False
    seconds: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"h_ms": round(sum(self.seconds.values()) * 1000, 3)}
        for hook, s in self.seconds.items():
            out[f"{hook}_ms"] = round(s * 1000, 3)
        if self.calls.get("on_boundary"):
            out["boundary_calls"] = self.calls["on_boundary"]
        if self.disabled:
            out["disabled"] = True
        return out


class PolicyRun:
    """One request's policies: instances, timings, interventions, errors."""

    def __init__(self, actives: list[Active], session: SessionState) -> None:
        self.actives = actives
        self.session = session
        self.interventions: list[dict[str, Any]] = []
        self.errors: list[dict[str, str]] = []
        self.proposer: BoundaryProposer | None = None
        self.ctx: dict[str, RequestContext] = {}
        self.context_edits: dict[str, Any] | None = None  # the request's Anthropic context edits, applied
        self._lock = threading.Lock()

    def call(self, active: Active, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one hook, timed; a raise disables the policy for this request."""
        if active.disabled:
            return None
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception as exc:
            self.fail(active, hook, f"{type(exc).__name__}: {exc}", exc)
            return None
        finally:
            active.seconds[hook] += time.perf_counter() - t0
            active.calls[hook] += 1

    def fail(self, active: Active, hook: str, message: str, exc: BaseException | None = None) -> None:
        active.disabled = True
        self.note_error(active.name, hook, message)
        _warn_once(active.name, hook, message, exc)

    def note_error(self, policy: str, hook: str, message: str) -> None:
        with self._lock:
            self.errors.append({"policy": policy, "hook": hook, "error": message[:500]})

    def record(self, intervention: dict[str, Any]) -> None:
        with self._lock:
            self.interventions.append(intervention)

    def fire(self, event: BoundaryEvent, observe: bool = False) -> tuple[str, Intervention, float] | None:
        """Ask each policy with boundary hooks; the first intervention wins (the later
        policies are not asked: the output is about to change). `observe`: the row has
        ended, returned interventions are ignored."""
        for active in self.actives:
            if active.disabled or not uses_boundaries(active.policy):
                continue
            t0 = time.perf_counter()
            found = self.call(active, "on_boundary", _dispatch, active.policy, event)
            if found is None or observe:
                continue
            if not isinstance(found, Intervention):
                self.fail(active, "on_boundary", f"returned {type(found).__name__}, not an Intervention or None")
                continue
            if found.text is None and found.tokens is None:
                continue
            return active.name, found, time.perf_counter() - t0
        return None

    def report(self, watch_s: float = 0.0) -> dict[str, Any]:
        by_policy = {a.name: a.report() for a in self.actives}
        total = sum(sum(a.seconds.values()) for a in self.actives) + watch_s
        out: dict[str, Any] = {
            "active": [a.name for a in self.actives],
            "h_ms": round(total * 1000, 3),
            "watch_ms": round(watch_s * 1000, 3),
            "by_policy": by_policy,
            "interventions": len(self.interventions),
            "supplied_tokens": sum(int(i.get("emitted", 0) or 0) for i in self.interventions),
        }
        if self.errors:
            out["errors"] = list(self.errors)
        return out


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(name: str, hook: str, message: str, exc: BaseException | None) -> None:
    """A warning per failing request; the traceback only the first time per policy hook."""
    with _warned_lock:
        first = (name, hook) not in _warned
        _warned.add((name, hook))
    log.warning("policy %s disabled for this request: %s raised %s", name, hook, message,
                exc_info=exc if first and exc is not None else None)


class SessionStore:
    """SessionState per agent session id, least recently used dropped past `limit`."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> SessionState:
        with self._lock:
            state = self._states.get(session_id)
            if state is None:
                state = self._states[session_id] = SessionState(session_id)
            self._states.move_to_end(session_id)
            while len(self._states) > self.limit:
                self._states.popitem(last=False)
            return state

    def __len__(self) -> int:
        return len(self._states)


def request_specs(turn: Turn) -> tuple[list[PolicySpec], bool]:
    """The request's `jumpahead.policies` (and whether they replace the server's).
    Raises APIError(400) naming a bad spec."""
    options = turn.options  # its shape checked by core/options.py; the specs' grammar is ours
    if options.policies is None:
        return [], False
    specs = []
    for i, item in enumerate(options.policies):
        try:
            specs.append(spec_from_object(item))
        except PolicyError as exc:
            raise invalid_request(f"jumpahead.policies[{i}]: {exc}", param="jumpahead.policies") from None
    return specs, options.replace


class PolicyHooks:
    """The turn hooks that run policies (see the module doc)."""

    def __init__(self, specs: Sequence[str | PolicySpec], tokenizer: Any, context_length: int,
                 generate: Callable[[str, int], str] | None = None, *, allow_request_user_policies: bool = False,
                 max_sessions: int = MAX_SESSIONS) -> None:
        self.specs = [s if isinstance(s, PolicySpec) else parse_spec(s) for s in specs]
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.generate = generate
        # A request may name built-ins and the user classes this server was started
        # with; importing any other module by a client's say-so stays off unless asked.
        self.allow_request_user_policies = allow_request_user_policies
        self.sessions = SessionStore(max_sessions)
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    def check(self) -> None:
        """Import and instantiate each server spec once: startup errors, not request errors."""
        for spec in self.specs:
            spec.build()

    # --- hooks ---------------------------------------------------------------------------
    def before_render(self, exchange: Exchange, turn: Turn) -> Turn:
        specs = self._specs(turn)
        asked_edits = turn.context_edits is not None  # Anthropic context_management (answered even if empty)
        if not specs and not asked_edits:
            return turn
        actives, failed = [], []
        for spec, from_request in specs:
            try:
                policy = spec.build()
            except PolicyError as exc:
                if from_request:
                    raise invalid_request(f"jumpahead.policies: {exc}", param="jumpahead.policies") from None
                failed.append((spec.name, str(exc)))  # checked at startup; fails only now: skip it
                continue
            actives.append(Active(policy_name(policy, spec), policy, spec))
        _unique_names(actives)
        session = self.sessions.get(exchange.session_id or "")
        run = PolicyRun(actives, session)
        for name, message in failed:
            run.note_error(name, "__init__", message)
            _warn_once(name, "__init__", message, None)
        exchange.state[STATE_KEY] = run
        for active in actives:
            ctx = self._context(turn, session, active)
            run.ctx[active.name] = ctx
            hook = getattr(active.policy, "on_request", None)
            if not callable(hook):
                continue
            new = run.call(active, "on_request", hook, ctx)
            for note in ctx.notes:
                run.record({"policy": active.name, "boundary": "request", **note})
            if new is None or active.disabled:
                continue
            if not isinstance(new, Turn):
                run.fail(active, "on_request", f"returned {type(new).__name__}, not a Turn or None")
                continue
            turn = new
        if asked_edits:
            run.context_edits = context_edits_report([a.policy for a in actives if not a.disabled])
        session.requests += 1
        return turn

    def row_proposers(self, exchange: Exchange, prepared: Any) -> list:
        run = exchange.state.get(STATE_KEY) if exchange is not None else None
        if not isinstance(run, PolicyRun):
            return []
        out: list = []
        for active in run.actives:
            hook = getattr(active.policy, "proposers", None)
            if not callable(hook) or active.disabled:
                continue
            ctx = run.ctx.get(active.name) or self._context(prepared.turn, run.session, active)
            ctx.turn = prepared.turn
            found = run.call(active, "proposers", hook, ctx)
            if found is None or active.disabled:
                continue
            if not isinstance(found, (list, tuple)) or not all(callable(getattr(p, "propose", None)) for p in found):
                run.fail(active, "proposers", "did not return a list of proposers")
                continue
            out.extend(found)
        if any(uses_boundaries(a.policy) and not a.disabled for a in run.actives):
            # The parser as the runner left it (an assistant prefix already fed).
            tracker = OutputTracker(self.tokenizer, copy.deepcopy(prepared.parser))
            run.proposer = BoundaryProposer(run, tracker, self.tokenizer, list(prepared.request.prompt))
            out.insert(0, run.proposer)  # first: it proposes only at boundaries, and must see each round
        return out

    def after_turn(self, exchange: Exchange, prepared: Any, out: TurnOutput) -> None:
        run = exchange.state.pop(STATE_KEY, None) if exchange is not None else None
        if not isinstance(run, PolicyRun):
            return
        watch_s = 0.0
        if run.proposer is not None:
            run.proposer.finish(list(prepared.output_tokens), len(prepared.request.prompt))
            watch_s = run.proposer.watch_s
        result_base = dict(
            reasoning=out.reasoning, content=out.content,
            tool_calls=[{"name": c.name, "arguments": c.arguments, "id": c.id} for c in out.tool_calls],
            finish_reason=out.finish_reason, output_tokens=list(prepared.output_tokens),
            interventions=list(run.interventions))
        for active in run.actives:
            hook = getattr(active.policy, "on_result", None)
            if callable(hook):
                run.call(active, "on_result", hook, TurnResult(session=run.session, **result_base))
        report = run.report(watch_s)
        exchange.notes["interventions"] = [*exchange.notes.get("interventions", []), *run.interventions]
        exchange.notes["policies"] = report
        out.usage.report.policies = {**report, "interventions": list(run.interventions)}
        if run.context_edits is not None:
            out.usage.report.context_edits = run.context_edits  # the Messages protocol answers applied_edits from it
        self._count(run, report)

    # --- reports -------------------------------------------------------------------------
    def _count(self, run: PolicyRun, report: dict[str, Any]) -> None:
        with self._lock:
            c = self.counters
            c["requests"] += 1
            c["h_us"] += int(report["h_ms"] * 1000)
            c["watch_us"] += int(report["watch_ms"] * 1000)
            for active in run.actives:
                c[f"h_us/{active.name}"] += int(sum(active.seconds.values()) * 1e6)
            for iv in run.interventions:
                c[f"interventions/{iv['policy']}/{iv.get('kind', 'request')}"] += 1
                c["tokens_supplied"] += int(iv.get("emitted", 0) or 0)
                c["tokens_proposed"] += int(iv.get("tokens", 0) or 0) if iv.get("boundary") != "request" else 0
                c["decide_us"] += int(float(iv.get("decide_ms", 0) or 0) * 1000)
            for err in run.errors:
                c[f"errors/{err['policy']}"] += 1

    def metrics(self) -> dict[str, Any]:
        """The /metrics "policies" section."""
        with self._lock:
            c = dict(self.counters)
        nested: dict[str, Any] = {"interventions": {}, "h_ms_by_policy": {}, "errors": {}}
        flat: dict[str, Any] = {}
        for key, value in c.items():
            if key.startswith("interventions/"):
                _, policy, kind = key.split("/", 2)
                nested["interventions"].setdefault(policy, {})[kind] = value
            elif key.startswith("h_us/"):
                nested["h_ms_by_policy"][key[5:]] = round(value / 1000, 3)
            elif key.startswith("errors/"):
                nested["errors"][key[7:]] = value
            elif key.endswith("_us"):
                flat[key[:-3] + "_ms"] = round(value / 1000, 3)
            else:
                flat[key] = value
        return {"policies": {"server": [str(s) for s in self.specs], "sessions": len(self.sessions), **flat, **nested}}

    def health(self) -> dict[str, Any]:
        return {"policies": [str(s) for s in self.specs]}

    # --- internals -----------------------------------------------------------------------
    def _specs(self, turn: Turn) -> list[tuple[PolicySpec, bool]]:
        requested, replace = request_specs(turn)
        allowed = {s.target for s in self.specs}
        for spec in requested:
            if not spec.builtin and spec.target not in allowed and not self.allow_request_user_policies:
                raise invalid_request(f"jumpahead.policies: user policy {spec.name} is not enabled on this server "
                                      "(a request may name built-in policies and the ones the server was started "
                                      "with: serve --policy)", param="jumpahead.policies")
        base = [] if replace else [(s, False) for s in self.specs]
        edits = edit_specs(turn.context_edits or [])  # after the server's and the request's policies
        return base + [(s, True) for s in requested] + [(s, True) for s in edits]

    def _context(self, turn: Turn, session: SessionState, active: Active) -> RequestContext:
        return RequestContext(turn=turn, session=session, tokenizer=self.tokenizer,
                              context_length=self.context_length, options=dict(active.spec.options),
                              generate=self.generate)


def _unique_names(actives: list[Active]) -> None:
    seen: Counter[str] = Counter()
    for a in actives:
        seen[a.name] += 1
        if seen[a.name] > 1:
            a.name = f"{a.name}#{seen[a.name]}"


def engine_generator(engine: LocalEngine, temperature: float = 0.0) -> Callable[[str, int], str]:
    """`generate(prompt_text, max_tokens) -> text` on the serving engine: the prompt as
    one user message, blocking (RequestContext.generate; e.g. model-written summaries)."""
    from jumpahead.engine.types import GenerationRequest, SamplingParams

    def generate(prompt_text: str, max_tokens: int) -> str:
        if threading.current_thread().name == "jumpahead-engine":
            # a boundary hook runs on the engine thread: waiting for the engine there hangs it
            raise RuntimeError("generate() cannot run inside a boundary hook (the engine thread); "
                               "call it from on_request")
        ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt_text}],
                                                   add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        request = GenerationRequest(prompt=[int(i) for i in ids], sampling=SamplingParams(temperature=temperature),
                                    max_tokens=max(1, int(max_tokens)), methods=["none"])
        chunks = engine.generate_sync(request)
        last = chunks[-1]
        if last.finish_reason == "error":
            raise RuntimeError(f"generation failed: {last.error}")
        return "".join(c.text for c in chunks)

    return generate
