"""The registry of proposal methods: names, token kinds, proposers, replay arms.

Every place that lists methods reads them from here: the token kinds an emitted token
may carry (`token_kinds`, engine/types.py TokenKind), which kinds are verified or
asserted (engine/methods/proposal.py), `--methods` and a request's `jumpahead.methods`
(`parse_methods`, `describe`, the engine's `validate`), the proposers the engine builds
for a row (engine/engine.py), and the method arms of replay and live runs
(traces/arms.py, live/arms.py). A new method is its proposer's module plus one
`Method(...)` line in `BUILTIN` below (or a `register(Method(...))` call of its own).
A method that keeps state (a draft model, a drafter head, an MTP layer) carries its
whole lifecycle on that entry (`Lifecycle`: how a spec loads the state, how it is
attached to an engine, its prefix-cache companion, the measured rule that adds it to
the defaults); `attach_methods` is the one path that loads and attaches every such
method, for `Engine` (EngineConfig.method_specs) and so for serve, bench and replay.

Exact methods never change the output (docs/design.md, Proposal): verified copies (echo,
n-gram) are accepted only where the row's own sampler picks them, and checked strict
fill only where the masked sampler does. Echo and checked strict fill are the
server's default (`jumpahead serve`; `--methods none` turns every proposer off,
strict fill too): the benches show them not slowing rows with nothing to copy or a
mixed batch. N-gram is exact too but stays opt-in: it proposes on one-token matches
and has no back-off on rows with nothing to copy (echo has), and no bench has shown
it paying next to echo. Unverified methods (a policy's jumps, asserted strict fill)
change what the model reads and stay opt-in; a draft model needs a second model. A
trained drafter and a checkpoint's MTP layer join the defaults only where their own
recorded measurement on the served model shows them paying (engine/methods/drafter.py
measured_pays); without one they are opt-in.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from .proposal import Proposer
    from ..types import GenerationRequest

log = logging.getLogger("jumpahead.methods")

OFF = frozenset({"none", "off"})
SAMPLED = "sampled"  # the kind of a token the row's sampler picked (no method)
STRICT = "strict"  # strict fill: built by engine/strict/fill.py, on unless a list says none/off
# `jumpahead bench fill` measured echo against methods off: no-copy and mixed-batch
# arms no slower, copy-heavy turns faster (BENCHMARKS.md, "Exact methods by default").
# Strict fill is not listed: it runs unless a list says none/off (engine/strict/fill.py).
SERVER_DEFAULT: tuple[str, ...] = ("echo",)
# Method "drafter" joins the defaults per drafter, where the loaded drafter's own live
# A/B on the served model shows it paying (engine/methods/drafter.py measured_pays).
# Method "mtp" joins them by the same rule, per checkpoint: where a live A/B kept beside
# its MTP weights shows it paying on the served model (engine/methods/mtp.py MEASURED and
# measured_pays; `join_defaults` below). Exact is not enough: drafting costs an MTP
# forward per step whether or not the drafts land, and no bench has measured it on a
# real checkpoint. Without a measurement it is opt-in (--methods echo,mtp).


@dataclass(frozen=True)
class MethodArm:
    """A replay arm that runs one method alone (traces/arms.py): `[method, "none"]`
    (strict fill off), or `[strict]` for strict fill itself."""

    name: str
    description: str
    # strict fill asserts its tokens instead of verifying them (replay only: no server
    # option runs it, so live/arms.py refuses it)
    asserted: bool = False


class MethodError(ValueError):
    """A method's state could not be loaded or attached, or the defaults name a method
    this engine cannot run (the message says which and why)."""


@dataclass(frozen=True)
class Lifecycle:
    """How a stateful method's state comes and goes (all of it runs in `attach_methods`
    and `Engine.attach`; the engine keeps the state by method name, `Engine.method_state`).

    `load(engine, spec)`: the state a spec names (a path, "auto", a model), or None where
    the spec finds nothing and that is no error ("auto" on a model without one); raising
    one of `errors` refuses the spec with `refusal` ("cannot use drafter {spec}") and the
    reason. `attach(engine, loaded)`: checks against the engine, the runner flags the
    method needs (keep_hidden, ...); returns the state kept (default: `loaded`).
    `companion(state)`: a prefix-cache CompanionHook (engine/prefix/prefix_cache.py) keeping
    each row's state beside the target's KV. `measured(engine, state)`: (pays, why),
    whether the state's own recorded measurement on the served model says it joins the
    defaults (engine/methods/drafter.py measured_pays); None: never by default. `flag`: the
    `jumpahead serve` option whose value is the spec (app/serve.py method_specs).
    `health(engine, state)`: what /health shows under the method's name (the key is there,
    None, while nothing is attached); `metrics(state)`: entries /metrics adds (its batched
    forwards' counters, say). The engine reports every stateful method through these two,
    by no name of its own (Engine.health, Engine.metrics)."""

    load: Callable[[Any, str], Any]
    refusal: str
    flag: str = ""
    attach: Callable[[Any, Any], Any] | None = None
    companion: Callable[[Any], Any] | None = None
    measured: Callable[[Any, Any], tuple[bool, str]] | None = None
    errors: tuple[type[BaseException], ...] = (ValueError, OSError)
    health: Callable[[Any, Any], Any] | None = None
    metrics: Callable[[Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Method:
    """One proposal method (or a kind of supplied token that no `--methods` name runs).

    `factory(engine, request)` builds the row's proposer from the in-process engine
    (engine/engine.py: its config, its method states); None where something else supplies
    the tokens (strict fill: engine/strict/fill.py; jumps: policies; scripted: core/script.py).
    `needs(engine)` says why this engine cannot run the method (None: it can). The
    proposer's `name` is its kind: the scheduler skips verified proposers by name where
    no verified token can pay (engine/schedule/scheduler.py). `lifecycle`: the state a stateful
    method loads and attaches (its factory reads it: `engine.method_state(name)`)."""

    name: str
    kind: str  # the TokenKind its tokens carry
    verified: bool  # True: accepted where the row's sampler agrees; False: asserted
    description: str = ""
    factory: Callable[[Any, "GenerationRequest"], "Proposer"] | None = None
    selectable: bool = True  # a `--methods` / request `methods` name
    needs: Callable[[Any], str | None] | None = None
    arms: tuple[MethodArm, ...] = ()
    lifecycle: Lifecycle | None = None


def _in(module: str, name: str) -> Callable[..., Any]:
    """`engine/methods/<module>.py`'s `name`, imported when first called (the registry imports no mlx)."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(f".{module}", __package__), name)(*args)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


def _echo(engine: Any, req: "GenerationRequest") -> "Proposer":
    from .echo import EchoProposer

    return EchoProposer()


def _ngram(engine: Any, req: "GenerationRequest") -> "Proposer":
    from .echo import NgramProposer

    return NgramProposer()


def _state(engine: Any, name: str) -> Any:
    """The state `engine` keeps for method `name` (None: none attached)."""
    states = getattr(engine, "method_states", None)
    return None if states is None else states.get(name)


def _draft(engine: Any, req: "GenerationRequest") -> "Proposer":
    return engine.method_state("draft").proposer()


def _draft_needs(engine: Any) -> str | None:
    if _state(engine, "draft") is None:
        return "method 'draft' needs a draft model (serve --draft-model)"
    return None


def _drafter(engine: Any, req: "GenerationRequest") -> "Proposer":
    from .drafter import DrafterProposer

    return DrafterProposer(engine.method_state("drafter"))


def _drafter_needs(engine: Any) -> str | None:
    if _state(engine, "drafter") is None:
        return "method 'drafter' needs a trained drafter (serve --drafter PATH; jumpahead train-drafter)"
    return None


def _mtp(engine: Any, req: "GenerationRequest") -> "Proposer":
    return engine.method_state("mtp").proposer()


def _mtp_needs(engine: Any) -> str | None:
    if _state(engine, "mtp") is None:
        return ("method 'mtp' needs a checkpoint with an MTP layer (a Hugging Face format qwen3_next / "
                "qwen3_5 / deepseek_v3 / glm4_moe / glm4_moe_lite folder; serve --mtp auto|PATH)")
    return None


def _drafter_health(engine: Any, state: Any) -> str | None:
    """The trained drafter head's folder (None: built in memory, as tests do)."""
    return state.drafter.folder


def _mtp_health(engine: Any, state: Any) -> dict[str, Any]:
    """The MTP layer's folder, and why it drafts by default or not."""
    return {**state.describe(), "by_default": engine.method_defaults.get("mtp")}


def _draft_metrics(state: Any) -> dict[str, Any]:
    return {"draft_model": state.group.stats()}  # its batched forwards (draft_model.py DraftModelGroup)


def _mtp_metrics(state: Any) -> dict[str, Any]:
    return {"mtp_group": state.group.stats()}  # its batched forwards (mtp_group.py MtpGroup)


BUILTIN: tuple[Method, ...] = (
    Method("echo", "echo", True, "copies spans from the context (engine/methods/echo.py)", _echo,
           arms=(MethodArm("echo", "echo copies from the context, verified"),)),
    Method("ngram", "ngram", True, "prompt-lookup n-grams (engine/methods/echo.py)", _ngram,
           arms=(MethodArm("ngram", "prompt-lookup n-grams, verified"),)),
    Method("draft", "draft", True, "a draft model's tokens (engine/methods/draft_model.py)", _draft, needs=_draft_needs,
           lifecycle=Lifecycle(_in("draft_model", "load_draft"), "cannot use draft model {spec}", "--draft-model",
                               attach=_in("draft_model", "attach_draft"), companion=_in("draft_model", "DraftCompanion"),
                               metrics=_draft_metrics)),
    Method("drafter", "drafter", True, "a trained drafter head's tokens (engine/methods/drafter.py)", _drafter,
           needs=_drafter_needs,
           arms=(MethodArm("drafter", "the trained drafter's tokens, verified (replay and live load the "
                                      "drafter shipped for the default model)"),),
           lifecycle=Lifecycle(_in("drafter", "load_drafter"), "cannot use drafter {spec}", "--drafter",
                               attach=_in("drafter", "attach_drafter"), measured=_in("drafter", "drafter_pays"),
                               health=_drafter_health)),
    Method("mtp", "mtp", True, "the checkpoint's own multi-token-prediction layer (engine/methods/mtp.py)", _mtp,
           needs=_mtp_needs,
           lifecycle=Lifecycle(_in("mtp", "load_mtp"), "cannot use the MTP layer of {spec}", "--mtp",
                               attach=_in("mtp", "attach_mtp"), companion=_in("mtp", "mtp_companion"),
                               measured=_in("mtp", "mtp_pays"), health=_mtp_health, metrics=_mtp_metrics)),
    Method(STRICT, "strict", False, "template scaffold and grammar jump-forward (engine/strict/fill.py); "
           "checked (verified) unless asserted", None,
           arms=(MethodArm("strict", "strict fill, verified (the server's default)"),
                 MethodArm("strict-asserted", "strict fill, asserted unverified (DESIGN's form)", asserted=True))),
    Method("jump", "jump", False, "a policy's logical jump-ahead (policies/jump.py)", selectable=False),
    Method("scripted", "scripted", False, "a forced script's tokens (core/script.py)", selectable=False),
)

REGISTRY: dict[str, Method] = {}
# Live sets (register() adds to them): the kinds a Proposal may carry, by how they are taken.
ASSERTED_KINDS: set[str] = set()
VERIFIED_KINDS: set[str] = set()


def register(method: Method) -> Method:
    """Add `method` (its name must be new; its kind may be another method's)."""
    if method.name in REGISTRY or method.name in OFF or method.name == SAMPLED:
        raise ValueError(f"proposal method {method.name!r} is already registered")
    if method.kind == SAMPLED:
        raise ValueError("the kind 'sampled' is the sampler's own")
    REGISTRY[method.name] = method
    (VERIFIED_KINDS if method.verified else ASSERTED_KINDS).add(method.kind)
    return method


def unregister(name: str) -> None:
    """Remove a method registered by `register` (tests, plug-ins that unload)."""
    method = REGISTRY.pop(name)
    if not any(m.kind == method.kind for m in REGISTRY.values()):
        ASSERTED_KINDS.discard(method.kind)
        VERIFIED_KINDS.discard(method.kind)


for _m in BUILTIN:
    register(_m)


def known() -> tuple[str, ...]:
    """The names `--methods` and a request's `methods` accept (besides none/off)."""
    return tuple(m.name for m in REGISTRY.values() if m.selectable)


def token_kinds() -> tuple[str, ...]:
    """Every provenance an emitted token may carry: "sampled", then the methods' kinds."""
    return tuple(dict.fromkeys([SAMPLED, *(m.kind for m in REGISTRY.values())]))


def stateful() -> tuple[Method, ...]:
    """The registered methods that keep state (a `Lifecycle`), in registration order."""
    return tuple(m for m in REGISTRY.values() if m.lifecycle is not None)


def get(name: str) -> Method | None:
    """The selectable method `name` (None: no such `--methods` name)."""
    m = REGISTRY.get(name)
    return m if m is not None and m.selectable else None


def unknown_message(name: str) -> str:
    """The engine's error for a method name it does not know."""
    return f"unknown proposal method {name!r} (known: {', '.join(known())})"


def parse_methods(text: str | None) -> tuple[str, ...]:
    """A `--methods` value: None = SERVER_DEFAULT; "none"/"off" = every proposer off
    (strict fill too); else comma-separated known() names. ValueError names the bad ones."""
    if text is None:
        return SERVER_DEFAULT
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if get(m) is None and m not in OFF]
    if unknown:
        raise ValueError(f"unknown method(s) in --methods: {', '.join(unknown)} "
                         f"(known: {', '.join(known())}; 'none' turns every method off)")
    if set(names) & OFF and len(names) > 1:
        raise ValueError("--methods none cannot be combined with other methods")
    return names  # () = strict fill only


def describe(methods: Sequence[str]) -> list[str]:
    """What a method list runs, spelled out (strict fill is implied unless off)."""
    if set(methods) & OFF:
        return []
    return sorted(set(methods) | {STRICT})


def attach_methods(engine: Any, specs: Mapping[str, str | None], measured_defaults: bool = False) -> None:
    """The one path that loads and attaches stateful methods (Engine.__init__ runs it on
    EngineConfig.method_specs; serve, bench and replay reach it that way): for each
    registered method with a lifecycle, in registry order, the state its spec names
    (None, "", none, off: none) is loaded and attached (`engine.attach`); then
    `join_defaults`. MethodError: a spec refused, a spec for no such stateful method, or
    the defaults naming a method that has no state."""
    stateful = {m.name: m for m in REGISTRY.values() if m.lifecycle is not None}
    unknown = [name for name, spec in specs.items() if name not in stateful and spec not in (None, "", *OFF)]
    if unknown:
        raise MethodError(f"no stateful method {', '.join(map(repr, unknown))} (stateful: {', '.join(stateful)})")
    for name, method in stateful.items():
        lifecycle = method.lifecycle
        assert lifecycle is not None
        spec = specs.get(name)
        if spec not in (None, "", *OFF):
            try:
                state = lifecycle.load(engine, spec)
                if state is not None:
                    engine.attach(name, state)
            except lifecycle.errors as exc:
                raise MethodError(f"{lifecycle.refusal.format(spec=spec)}: {exc}") from exc
        join_defaults(engine, method, measured_defaults)


def join_defaults(engine: Any, method: Method, measured_defaults: bool) -> None:
    """Where `method` stands in `engine.config.default_methods` (the requests that name no
    methods): named there without state, MethodError (its `needs`); with state and a
    measured rule, it joins them where `measured_defaults` (serve without --methods) and
    its measurement pays, and `engine.method_defaults[name]` says whether it is on and why
    (/health, the log)."""
    name = method.name
    defaults = tuple(engine.config.default_methods)
    state = engine.method_state(name)
    if state is None:
        reason = method.needs(engine) if method.needs is not None and name in defaults else None
        if reason:
            raise MethodError(reason)
        return
    measured = method.lifecycle.measured if method.lifecycle is not None else None
    if measured is None:
        return
    pays, why = measured(engine, state)
    if measured_defaults and pays and name not in defaults:
        engine.config.default_methods = (*defaults, name)
    on = name in engine.config.default_methods
    if not measured_defaults:
        why = f"--methods {'names' if on else 'leaves out'} {name} (measurement: {why})"
    engine.method_defaults[name] = {"on": on, "why": why}
    log.info("%s %s by default: %s", name, "on" if on else "off", why)
