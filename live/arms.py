"""Live arms: each a `jumpahead serve` configuration plus a per-request `jumpahead` field.

Names follow replay's arms (traces/arms.py): a method arm (`ordinary`, `strict`, `echo`,
`ngram`: the registered methods' arms, engine/methods/registry.py) or a policy (`jump`, `early-jump`, `oracle-jump`, `mistaken-jump:rate=0.3`, `compaction`,
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
`default`. Policies are started with the server (`--policy SPEC`, in order).

Two live oracles (live/oracle.py). `hindsight-jump` runs `LiveHindsightJump`: the
ordinary arm's recorded output of the same turn of the same seed, supplied only where its
content existed before the jump point; its requests carry that recording, so the runner
runs the ordinary arm of a seed first. `steering-jump` (old name `oracle-jump`) runs
`LiveOracleJump` on the task's ideal calls, sent in each request: it can steer the model
to the answer, so it is a labelled comparison, never the upper bound.
`mistaken-jump:rate=R,base=hindsight|steering` perturbs either (`base=oracle` is steering).

Every arm runs on its own server (its own prefix cache, RAM only), so arms never warm
each other's caches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jumpahead.engine.methods.registry import OFF, SERVER_DEFAULT, STRICT
from jumpahead.traces.arms import BASELINE, ArmError, parse_arm, split_arms

DEFAULT = "default"
LIVE_ORACLE = "jumpahead.live.oracle:LiveOracleJump"
LIVE_HINDSIGHT = "jumpahead.live.oracle:LiveHindsightJump"
LIVE_MISTAKEN = "jumpahead.live.oracle:LiveMistakenJump"
HINDSIGHT, STEERING = "hindsight-jump", "steering-jump"
# The arms of the full run (`jumpahead live --arms all`).
ALL_ARMS = ("ordinary", "strict", "echo", "default", "jump", "early-jump", "echo+jump", HINDSIGHT, STEERING,
            "mistaken-jump:rate=0.1,base=hindsight", "mistaken-jump:rate=0.3,base=hindsight",
            "compaction", "default+jump", f"default+{HINDSIGHT}")


@dataclass(frozen=True)
class LiveArm:
    name: str
    methods: list[str] | None  # per-request methods; None: the server's default
    policies: list[str] = field(default_factory=list)  # `serve --policy` specs, in order
    oracle: bool = False  # requests carry the task's ideal calls (steering)
    hindsight: bool = False  # requests carry the ordinary arm's recorded output of the turn

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


_BASE = re.compile(r"(^|,)\s*base\s*=\s*([\w-]+)\s*(?=,|$)")


def _for_replay(part: str) -> tuple[str, str | None]:
    """A live arm part as replay's parser knows it, and which live oracle it names
    (`steering`, `hindsight` or None): both oracles are replay's `oracle-jump`."""
    head, colon, rest = part.partition(":")
    if head in (HINDSIGHT, STEERING, "oracle-jump"):
        return f"oracle-jump{colon}{rest}", "hindsight" if head == HINDSIGHT else "steering"
    base = _BASE.search(rest)
    if head == "mistaken-jump" and base and base.group(2) in ("oracle", "oracle-jump", "steering", "hindsight"):
        oracle = "hindsight" if base.group(2) == "hindsight" else "steering"
        return f"{head}:{_BASE.sub(lambda m: f'{m.group(1)}base=oracle', rest)}", oracle
    return part, None


def _live_policy(spec: str, oracle: str | None) -> str:
    """The `serve --policy` spec of a replay policy spec whose live oracle is `oracle`."""
    head, _, rest = spec.partition(":")
    if oracle is None:
        return spec
    if head == "oracle-jump":
        cls = LIVE_HINDSIGHT if oracle == "hindsight" else LIVE_ORACLE
        return f"{cls}:{rest}" if rest else cls
    if oracle == "hindsight":
        rest = _BASE.sub(lambda m: f"{m.group(1)}base=hindsight", rest)
    return f"{LIVE_MISTAKEN}:{rest}"


def parse_live_arm(name: str) -> LiveArm:
    """The live arm `name`; ArmError names what is unknown."""
    parts = [p.strip() for p in name.split("+")]
    default = DEFAULT in parts
    rest = [p for p in parts if p != DEFAULT]
    if not rest:
        return LiveArm(name, None)
    translated = [_for_replay(p) for p in rest]
    oracles = dict(translated)
    try:
        arm = parse_arm("+".join(t for t, _ in translated))
    except ArmError as exc:
        raise ArmError(f"{exc}; live also knows '{DEFAULT}' (the server's default methods), "
                       f"'{HINDSIGHT}' and '{STEERING}'") from None
    if arm.spec.asserted_strict:
        raise ArmError(f"arm {name!r}: asserted strict fill is a replay arm only (no server option runs it)")
    policies = [_live_policy(spec, oracles.get(spec)) for spec in arm.policy_specs]
    used = {oracles.get(spec) for spec in arm.policy_specs}
    methods = None if default else arm.methods
    added = [m for m in arm.methods if m not in OFF]
    if default and added:
        # `default+drafter`: the server's default methods plus the arm's (strict fill stays on)
        clash = [m for m in added if m in SERVER_DEFAULT or m == STRICT]
        if clash:
            raise ArmError(f"arm {name!r}: '{DEFAULT}' already runs {', '.join(clash)}")
        methods = [*SERVER_DEFAULT, *added]
    return LiveArm(name, methods, policies, oracle="steering" in used, hindsight="hindsight" in used)


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
