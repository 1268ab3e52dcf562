"""Replay arms: which proposal methods and policies a replayed turn runs with.

An arm name is one or more parts joined by "+": a method arm from `ARMS`
(`ordinary`, and each registered method's arms, engine/methods/registry.py: `echo`, `ngram`,
`strict`, `strict-asserted`) or a policy name (a built-in
from policies/builtin.py or `package.module:Class`), optionally with options
`NAME:key=value,key=value`. `strict+echo` runs both methods; `oracle-jump` runs the
policy with no proposal method; `strict+oracle-jump` adds strict fill to it.

Method lists spell out `none` where strict fill must stay off: the engine runs strict
fill by default (engine/strict/fill.py), so an `echo` arm without `none` would also carry
scaffold tokens and its figures would not be echo's alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jumpahead.engine.methods.registry import REGISTRY, STRICT, Method, MethodArm

if TYPE_CHECKING:
    from jumpahead.engine.interface import Engine


class ArmError(ValueError):
    """An arm name that names no method or policy."""


@dataclass
class ArmSpec:
    methods: list[str]  # GenerationRequest.methods ("none" keeps strict fill off)
    policies: list[str] | None = None  # policy specs ("name" or "name:key=value,...")
    asserted_strict: bool = False  # strict fill asserts its tokens instead of verifying them
    description: str = ""


BASELINE = "ordinary"
_BASELINE_SPEC = ArmSpec(["none"], description="one decode round per token: the baseline")


def method_arm_spec(method: Method, arm: MethodArm) -> ArmSpec:
    """A registered method's arm: the method alone (`none` keeps strict fill off),
    strict fill itself as `[strict]`."""
    methods = [method.name] if method.name == STRICT else [method.name, "none"]
    return ArmSpec(methods, asserted_strict=arm.asserted, description=arm.description)


class _Arms(Mapping[str, ArmSpec]):
    """The method arms, read from the method registry (engine/methods/registry.py) on each use,
    so a method registered later has its arms: `ordinary` first, then each method's."""

    def _all(self) -> dict[str, ArmSpec]:
        out = {BASELINE: _BASELINE_SPEC}
        for method in REGISTRY.values():
            for arm in method.arms:
                out.setdefault(arm.name, method_arm_spec(method, arm))
        return out

    def __getitem__(self, name: str) -> ArmSpec:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


ARMS: Mapping[str, ArmSpec] = _Arms()


@dataclass
class Arm:
    """A parsed arm: its name as given and what it runs."""

    name: str
    spec: ArmSpec
    policy_specs: list[str] = field(default_factory=list)
    hooks: list[Any] = field(default_factory=list)  # extra proxy hooks, besides the policies'

    @property
    def methods(self) -> list[str]:
        return list(self.spec.methods)


def _policy_names() -> set[str]:
    from jumpahead.policies.builtin import BUILTIN

    return set(BUILTIN)


def _policy_spec(part: str) -> Any | None:
    """The part as a policy spec (policies/registry.py), None when it names no policy
    shape; a policy shape with bad options is an ArmError."""
    from jumpahead.policies.registry import PolicyError, parse_spec

    head = part.split(":", 1)[0]
    if head not in _policy_names() and ":" not in part:
        return None
    try:
        spec = parse_spec(part)
        spec.build()  # imports the class and checks its options now, not mid-replay
    except PolicyError as exc:
        if head not in _policy_names() and "." not in head:
            return None
        raise ArmError(f"arm part {part!r}: {exc}") from None
    return spec


def split_arms(text: str) -> list[str]:
    """Comma-separated arm names; a piece with "=" and no ":" continues the previous
    policy's options (`jump:min=8,max=64,echo` is two arms)."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if out and "=" in piece and ":" not in piece and ":" in out[-1].split("+")[-1]:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def parse_arm(name: str) -> Arm:
    """The arm `name` ("strict+echo", "oracle-jump", "jump:min=8+echo", ...)."""
    if name in ARMS:
        return Arm(name, ARMS[name])
    methods: list[str] = []
    policies: list[str] = []
    asserted = False
    for part in name.split("+"):
        part = part.strip()
        if part in ARMS:
            spec = ARMS[part]
            methods += [m for m in spec.methods if m not in methods]
            asserted = asserted or spec.asserted_strict
        elif part and _policy_spec(part) is not None:
            policies.append(part)
        else:
            known = ", ".join([*ARMS, *sorted(_policy_names())])
            raise ArmError(f"unknown arm {part!r} in {name!r} (known: {known}; combine with '+', "
                           "a user policy as package.module:Class)")
    # A method named anywhere turns strict on unless every method part keeps it off.
    if "strict" in methods:
        methods = [m for m in methods if m != "none"]
    if not methods:
        methods = ["none"]  # a policy alone: no proposal method of its own
    return Arm(name, ArmSpec(methods, policies or None, asserted), policies)


def parse_arms(text: str | list[str]) -> list[Arm]:
    """Arms from a comma-separated list; the baseline (`ordinary`) is put first when
    missing, since every ratio, D and R is measured against it."""
    names = split_arms(text) if isinstance(text, str) else list(text)
    if not names:
        raise ArmError("no arms given")
    seen: set[str] = set()
    arms = []
    for n in names:
        if n in seen:
            raise ArmError(f"arm {n!r} is listed twice")
        seen.add(n)
        arms.append(parse_arm(n))
    if BASELINE not in seen:
        arms.insert(0, parse_arm(BASELINE))
    return arms


def policy_hooks(arm: Arm, engine: "Engine") -> list[Any]:
    """The proxy hooks (core/exchange.py) that run the arm's policies on `engine`:
    the policy runtime (policies/runtime.py PolicyHooks) with the arm's specs as the
    server's, exactly as `serve --policy` runs them, plus any hooks the arm carries
    (tests, custom studies). A replayed turn goes through prepare_turn's
    before_render / row_proposers / after_turn like a served one."""
    hooks = list(arm.hooks)
    if arm.policy_specs:
        from jumpahead.policies.runtime import PolicyHooks, engine_generator

        hooks.insert(0, PolicyHooks(arm.policy_specs, engine.tokenizer, engine.context_length,
                                    engine_generator(engine)))
    return hooks
