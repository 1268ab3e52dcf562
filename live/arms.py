"""Live arms: each a `jumpahead serve` configuration plus a per-request `jumpahead` field.

Names follow replay's arms (traces/arms.py): a method arm (`ordinary`, `strict`, `echo`,
`ngram`: the registered methods' arms, engine/methods.py) or a policy (`jump`, `early-jump`, `oracle-jump`, `mistaken-jump:rate=0.3`, `compaction`,
`package.module:Class[:k=v,...]`), joined with "+" for combinations (`echo+jump`). One
name is live only: `default`, the server's default methods (echo plus checked strict
fill, what `jumpahead serve` runs when a request names none), served without a learned
drafter (`--drafter none`: serve adds one to its defaults where the drafter's own
measurement says it pays, and that measurement is `default+drafter` against `default`);
`default+drafter` adds a method to them (the request names the defaults and the method).
Only an arm that runs method "drafter" loads a drafter.

Methods go in every request (`"jumpahead": {"methods": [...]}`, exactly the lists replay
gives the engine; `none` keeps strict fill off) and the arm's server is started with
`--methods none` (nothing runs that the arm does not name), or with no `--methods` for
`default`. Policies are started with the server (`--policy SPEC`, in order). Oracle
jumps live on the task's ideal calls (live/oracle.py): `oracle-jump` runs
`LiveOracleJump` and `mistaken-jump:...,base=oracle` runs `LiveMistakenJump`; such arms
send the ideal calls in each request.

Every arm runs on its own server (its own prefix cache, RAM only), so arms never warm
each other's caches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jumpahead.engine.methods import OFF, SERVER_DEFAULT, STRICT
from jumpahead.traces.arms import BASELINE, ArmError, parse_arm, split_arms

DEFAULT = "default"
LIVE_ORACLE = "jumpahead.live.oracle:LiveOracleJump"
LIVE_MISTAKEN = "jumpahead.live.oracle:LiveMistakenJump"
# The arms of the full run (`jumpahead live --arms all`).
ALL_ARMS = ("ordinary", "strict", "echo", "default", "jump", "early-jump", "oracle-jump",
            "mistaken-jump:rate=0.1,base=oracle", "mistaken-jump:rate=0.3,base=oracle",
            "compaction", "default+jump", "default+oracle-jump")


@dataclass(frozen=True)
class LiveArm:
    name: str
    methods: list[str] | None  # per-request methods; None: the server's default
    policies: list[str] = field(default_factory=list)  # `serve --policy` specs, in order
    oracle: bool = False  # requests carry the task's ideal calls

    def serve_args(self) -> list[str]:
        args = [] if self.methods is None else ["--methods", "none"]
        if "drafter" not in (self.methods or []):
            # a server loads a learned drafter only for an arm that runs it: `default` stays
            # echo + checked strict where `serve` would add a drafter that pays
            args += ["--drafter", "none"]
        for spec in self.policies:
            args += ["--policy", spec]
        return args

    def request_field(self) -> dict[str, Any]:
        """The `jumpahead` object of each request (without session and oracle calls)."""
        return {} if self.methods is None else {"methods": list(self.methods)}

    @property
    def slug(self) -> str:
        """The name as a file-name-safe stem."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.name).strip("_") or "arm"


def _live_policy(spec: str) -> tuple[str, bool]:
    """A replay policy spec as the live server runs it; whether it needs the oracle."""
    head, _, rest = spec.partition(":")
    if head == "oracle-jump":
        return (f"{LIVE_ORACLE}:{rest}" if rest else LIVE_ORACLE), True
    if head == "mistaken-jump" and re.search(r"(^|,)\s*base\s*=\s*oracle(-jump)?\s*(,|$)", rest):
        return f"{LIVE_MISTAKEN}:{rest}", True
    return spec, False


def parse_live_arm(name: str) -> LiveArm:
    """The live arm `name`; ArmError names what is unknown."""
    parts = [p.strip() for p in name.split("+")]
    default = DEFAULT in parts
    rest = [p for p in parts if p != DEFAULT]
    if not rest:
        return LiveArm(name, None)
    try:
        arm = parse_arm("+".join(rest))
    except ArmError as exc:
        raise ArmError(f"{exc}; live also knows '{DEFAULT}' (the server's default methods)") from None
    if arm.spec.asserted_strict:
        raise ArmError(f"arm {name!r}: asserted strict fill is a replay arm only (no server option runs it)")
    policies, oracle = [], False
    for spec in arm.policy_specs:
        live, needs = _live_policy(spec)
        policies.append(live)
        oracle = oracle or needs
    methods = None if default else arm.methods
    added = [m for m in arm.methods if m not in OFF]
    if default and added:
        # `default+drafter`: the server's default methods plus the arm's (strict fill stays on)
        clash = [m for m in added if m in SERVER_DEFAULT or m == STRICT]
        if clash:
            raise ArmError(f"arm {name!r}: '{DEFAULT}' already runs {', '.join(clash)}")
        methods = [*SERVER_DEFAULT, *added]
    return LiveArm(name, methods, policies, oracle)


def parse_live_arms(text: str | list[str]) -> list[LiveArm]:
    """Arms from a comma-separated list (`all`: ALL_ARMS); `ordinary` is put first when
    missing: D, R and every paired difference are measured against it."""
    names = split_arms(text) if isinstance(text, str) else list(text)
    if names == ["all"]:
        names = list(ALL_ARMS)
    if not names:
        raise ArmError("no arms given")
    if len(set(names)) != len(names):
        raise ArmError(f"an arm is listed twice in {', '.join(names)}")
    arms = [parse_live_arm(n) for n in names]
    if BASELINE not in names:
        arms.insert(0, parse_live_arm(BASELINE))
    return arms
