"""Forced replay: re-drive recorded assistant turns through the engine under paired arms.

For each selected assistant turn of a session, the prompt is the session's history
before it, rendered with the serving model's chat template (Session.turn -> the proxy
runner, exactly as a served request), and the output is forced to the recorded
assistant message (reasoning, text, tool calls) rendered in the model's own format
(core/script.py render_turn + turn_tokens, ending with EOS). `ForcedOutput`
(traces/forcing.py) makes each plain round emit the recorded token, so the `ordinary`
arm spends one decode round per token as the model would, and verified proposals are
accepted exactly where they match the record. Every arm runs the same turns on its
own Engine over the same loaded weights (its own RAM prefix cache, so arms never warm
each other's), interleaved per turn (every arm on turn i, then turn i+1) so machine
noise hits them alike; the order of the arms rotates by one each turn, so no arm is
always first (after the previous turn's arm) or last.

Measured per arm per turn: the engine's prefill and decode time, cached prompt
tokens, tokens by provenance, rounds, verified proposed / accepted, proposer time, and
whether the emitted tokens equal the record (from the token lists, every turn). Each
run of supplied tokens is an intervention with D (decode avoided: its tokens x the
ordinary arm's decode time per token on the same turn), P (what the rounds that
carried it took beyond a plain round and their proposer time) and H (proposer time in
those rounds). A wrong asserted intervention diverges the turn: the row ends there,
and the rest of the record is charged at the ordinary arm's decode time per token
(`rest_s`, in model_s), so the arm's time covers the whole turn as the ordinary arm's
does. That is not a recovery cost: forced replay cannot observe recovery (R) at all,
because rolling a row back is a pointer move and the record, not the model, decides
what comes next. Live runs (live/) measure R.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jumpahead.engine.interface import Engine
from jumpahead.engine.types import ServedModel
from jumpahead.core.exchange import Exchange
from jumpahead.core.options import RequestOptions
from jumpahead.core.prompt import prompt_opens_reasoning
from jumpahead.core.turn_runner import complete_turn, prepare_turn
from jumpahead.core.script import ScriptedCall, ScriptTurn, render_turn, turn_tokens

from jumpahead.core.turn import Message

from .accounting import correct_tokens, price
from .arms import BASELINE, Arm, policy_hooks
from .recorded import recorded_output
from .session import Session
from .window import Window, WindowTooSmall, fit

# Defaults sized so `jumpahead replay --arms ordinary,strict,echo` on a public session
# takes a few minutes on this project's 2-core CPU: decode costs ~60-70 ms a token,
# and each arm prefills its first window cold (~3 s at 1k tokens, ~9 s at 2k, ~26 s at
# 4k on a quiet machine; BENCHMARKS.md). The brief's default window (the model's 8k
# minus the longest output) would cost each arm minutes of cold prefill per re-anchor,
# so the default window is 2k tokens; --max-context 0 asks for the brief's.
DEFAULT_TURNS = 6
DEFAULT_MAX_OUTPUT = 256
DEFAULT_MAX_CONTEXT = 2048
RAM_CACHE_BYTES = 1 << 30  # each arm's prefix cache (an 8k-token prefix is ~380 MB here)


@dataclass
class ReplayOptions:
    arms: list[Arm]
    turns: int | None = DEFAULT_TURNS  # the last N eligible assistant turns; None: all
    max_context: int | None = DEFAULT_MAX_CONTEXT  # prompt tokens; None or 0: window - longest output
    max_output_tokens: int | None = DEFAULT_MAX_OUTPUT  # longer recorded outputs are skipped
    max_proposal: int = 16
    cost_aware: bool = True
    objective: str = "throughput"
    # the drafter folder for arms that run method "drafter" (None: the one shipped for
    # the default model); arms without it never load one
    drafter: str | None = None
    # each arm's turn entry also carries "prompt_digest" (a hash of the prompt's token
    # ids after the arm's policies), so two arms' prompts can be compared exactly
    # (traces/repeats.py: an arm's first context edit); off, the JSON is as before
    prompt_digests: bool = False


@dataclass
class PlannedTurn:
    index: int  # the assistant message's index in the session
    turn: Any  # the proxy Turn (windowed)
    prompt: list[int]
    text: str  # the recorded output in the model's format (without EOS)
    tokens: list[int]  # its tokens, ending with EOS
    window: dict[str, Any] | None


def script_turn(message: Message) -> ScriptTurn:
    """A recorded assistant message as a script turn (core/script.py)."""
    return ScriptTurn(text=message.content or "", reasoning=message.reasoning or "",
                      tool_calls=[ScriptedCall(c.name, _arguments(c.arguments)) for c in message.tool_calls])


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        import orjson

        try:
            return orjson.loads(value) if value.strip() else {}
        except orjson.JSONDecodeError:
            return value  # raw text arguments stay text
    return value


def forced_output(tokenizer: Any, message: Message, tools: list | None, in_reasoning: bool) -> tuple[str, list[int]]:
    recorded = recorded_output(tokenizer, message)  # our own traces: the ids the model emitted (traces/recorded.py)
    if recorded is not None:
        return recorded
    text = render_turn(tokenizer, script_turn(message), in_reasoning=in_reasoning, tools=tools, prefer_template=True)
    return text, turn_tokens(tokenizer, text)


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"), (type(None), "null"))


def inferred_tools(session: Session) -> list[dict[str, Any]]:
    """OpenAI function tools read off the session's own calls, for sessions whose format
    does not record the tools offered (the agent did offer them: the prompt should
    carry their definitions and strict fill should know their names and keys). Each
    argument key gets the JSON types seen; keys in every call are required."""
    seen: dict[str, list[Any]] = {}
    for m in session.messages:
        for c in m.tool_calls:
            seen.setdefault(c.name, []).append(_arguments(c.arguments))
    tools = []
    for name, calls in seen.items():
        objects = [a for a in calls if isinstance(a, dict)]
        props: dict[str, Any] = {}
        for a in objects:
            for key, value in a.items():
                kind = next(t for cls, t in _JSON_TYPES if isinstance(value, cls))
                types = props.setdefault(key, [])
                if kind not in types:
                    types.append(kind)
        required = [k for k in props if objects and all(k in a for a in objects)]
        schema = {"type": "object", "properties": {k: {"type": t[0] if len(t) == 1 else t} for k, t in props.items()},
                  "required": required}
        tools.append({"type": "function", "function": {"name": name, "description": "", "parameters": schema}})
    return tools


def with_tools(session: Session) -> tuple[Session, bool]:
    """The session with its tools, inferred from its calls where the format has none."""
    if session.tools or not session.tool_call_count:
        return session, False
    import dataclasses

    return dataclasses.replace(session, tools=inferred_tools(session)), True


def plan_session(session: Session, tokenizer: Any, context_length: int,
                 options: ReplayOptions) -> tuple[list[PlannedTurn], list[dict[str, Any]], Window | None]:
    """The turns to replay (oldest first), the ones skipped and why, and the window."""
    session = with_tools(session)[0]
    tools = session.turn(session.assistant_indices()[0]).tools if session.turns else []
    chosen: list[tuple[int, str, list[int]]] = []
    skipped: list[dict[str, Any]] = []
    for i in reversed(session.assistant_indices()):
        if options.turns is not None and len(chosen) >= options.turns:
            break
        text, tokens = forced_output(tokenizer, session.messages[i], tools or None, False)
        if options.max_output_tokens is not None and len(tokens) > options.max_output_tokens:
            skipped.append({"index": i, "reason": f"output is {len(tokens)} tokens (> --max-output-tokens "
                                                  f"{options.max_output_tokens})", "output_tokens": len(tokens)})
            continue
        chosen.append((i, text, tokens))
    chosen.reverse()
    skipped.reverse()
    if not chosen:
        return [], skipped, None
    longest = max(len(t) for _, _, t in chosen)
    limit = options.max_context or context_length - longest - 1
    limit = min(limit, context_length - longest - 1)
    window = Window(limit)
    planned = []
    for i, text, tokens in chosen:
        try:
            turn, prompt, dropped = fit(session, i, window, tokenizer)
        except WindowTooSmall as exc:
            skipped.append({"index": i, "reason": str(exc)})
            continue
        if prompt_opens_reasoning(tokenizer, prompt):  # the template opened the think block
            text, tokens = forced_output(tokenizer, session.messages[i], turn.tools or None, True)
        planned.append(PlannedTurn(i, turn, prompt, text, tokens, dropped))
    skipped.sort(key=lambda s: s["index"])
    used = window.anchor is not None or window.system_cut is not None
    return planned, skipped, window if used else None


# --- measuring one arm on one turn -------------------------------------------------------


@dataclass
class ArmTurn:
    """What one arm did on one turn (the JSON's turns[].arms[ARM], plus raw data)."""

    prefill_s: float
    decode_s: float
    cached_tokens: int
    prompt_tokens: int
    tokens_by_kind: dict[str, int]
    rounds: int
    verified: dict[str, int]
    propose_s: float
    policy_s: float
    identical: bool
    diverged: bool
    output: list[int]
    kinds: list[str]
    round_sizes: list[int]  # tokens per round (the first is the prefill's first token)
    round_s: list[float]  # per round: seconds since the previous round (0.0 for the first)
    round_propose_s: list[float]
    diverged_at: int | None = None
    wrong_tokens: int = 0
    policy_notes: list[dict[str, Any]] = field(default_factory=list)
    prompt_digest: str = ""

    @property
    def measured_s(self) -> float:
        return self.prefill_s + self.decode_s

    def plain_round_s(self) -> float | None:
        """Decode seconds per round (the ordinary arm: per token)."""
        return self.decode_s / self.rounds if self.rounds else None


def _rounds(sizes: list[int], stamps: list[float], calls: list[Any]) -> tuple[list[float], list[float]]:
    """Per round: seconds since the previous round's first committed token, and the
    proposer seconds spent before it (each propose call belongs to the next round)."""
    starts, at = [], 0
    for n in sizes:
        starts.append(stamps[at] if at < len(stamps) else (starts[-1] if starts else 0.0))
        at += n
    round_s = [0.0] + [b - a for a, b in zip(starts, starts[1:])]
    propose = [0.0] * len(starts)
    j = 0
    for call in sorted(calls, key=lambda c: c.at):
        while j < len(starts) and starts[j] < call.at:
            j += 1
        if j < len(starts):
            propose[j] += call.seconds
    return round_s, propose


async def run_arm_turn(engine: Engine, arm: Arm, hooks: list[Any], plan: PlannedTurn, session_id: str) -> ArmTurn:
    turn = copy.deepcopy(plan.turn)
    turn.max_tokens = len(plan.tokens)
    # the recorded answer is the agreed interface of oracle-jump (policies/jump.py)
    oracle = plan.text if arm.policy_specs or arm.hooks else None
    turn.options = RequestOptions(methods=tuple(arm.methods), oracle_output=oracle)
    exchange = Exchange(protocol="chat", session_id=f"replay:{session_id}:{arm.name}")
    prepared = await asyncio.to_thread(prepare_turn, engine, turn, exchange, hooks)
    probe = engine.probe(prepared.request.request_id, plan.tokens)
    out = await complete_turn(engine, prepared)
    if out.finish_reason == "error":
        raise RuntimeError(f"arm {arm.name}: turn {plan.index} failed: {out.error}")
    forced = probe.forced
    output = list(prepared.output_tokens)
    sizes = [n for _, n, _ in prepared.chunk_times]
    round_s, round_propose = _rounds(sizes, forced.stamps, probe.calls)
    fill = out.usage.fill or {}
    timings = prepared.timings
    policies = exchange.notes.get("policies") or {}
    return ArmTurn(
        prefill_s=timings.prefill_s, decode_s=timings.decode_s, cached_tokens=out.usage.cached_tokens,
        prompt_tokens=len(prepared.request.prompt), tokens_by_kind=dict(fill.get("tokens", {})),
        rounds=int(fill.get("rounds", timings.rounds)), verified=dict(fill.get("verified", {})),
        propose_s=float(fill.get("propose_ms", 0.0)) / 1000, policy_s=float(policies.get("h_ms", 0.0)) / 1000,
        identical=output == plan.tokens, diverged=forced.diverged, output=output,
        kinds=list(prepared.output_kinds), round_sizes=sizes, round_s=round_s, round_propose_s=round_propose,
        diverged_at=forced.diverged_at, wrong_tokens=len(forced.wrong),
        policy_notes=list(exchange.notes.get("interventions", [])),
        prompt_digest=prompt_digest(prepared.request.prompt),
    )


def prompt_digest(tokens: list[int]) -> str:
    """A short hash of a prompt's token ids (equal prompts, equal digests)."""
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def arm_order(arms: list[Arm], turn: int) -> list[Arm]:
    """The arms in the order they run on the `turn`-th replayed turn: rotated by one
    per turn, so each arm runs first (and last) equally often over len(arms) turns."""
    k = turn % len(arms) if arms else 0
    return [*arms[k:], *arms[:k]]


def interventions(arm: ArmTurn, plain_s: float) -> list[dict[str, Any]]:
    """Each run of supplied tokens with its D, P and H (see the module doc), and last,
    where proposers ran in rounds that carried no supplied token (rejected or empty
    proposals), what those rounds cost: an `unaccepted` item with D = 0."""
    out: list[dict[str, Any]] = []
    carrying: set[int] = set()
    round_of: list[int] = []
    for r, n in enumerate(arm.round_sizes):
        round_of += [r] * n
    pos = 0
    kinds = arm.kinds
    while pos < len(kinds):
        kind = kinds[pos]
        end = pos
        while end < len(kinds) and kinds[end] == kind:
            end += 1
        if kind != "sampled":
            rounds = sorted({round_of[p] for p in range(pos, end) if p < len(round_of)})
            good = correct_tokens(end - pos, None if arm.diverged_at is None else arm.diverged_at - pos)
            carried = [r for r in rounds if r > 0]  # round 0 is the prefill: no plain round to compare
            carrying.update(carried)
            cost = price(good, [arm.round_s[r] for r in carried], [arm.round_propose_s[r] for r in carried], plain_s)
            item: dict[str, Any] = {"kind": kind, "at": pos, "tokens": end - pos, "rounds": len(rounds),
                                    "D_s": round(cost.D_s, 6), "P_s": round(cost.P_s, 6), "H_s": round(cost.H_s, 6)}
            if arm.diverged_at is not None and pos <= arm.diverged_at < end:
                item["wrong"] = True
                item["wasted_tokens"] = end - arm.diverged_at
            out.append(item)
        pos = end
    idle = [r for r in range(1, len(arm.round_s)) if r not in carrying and arm.round_propose_s[r] > 0]
    if idle:
        cost = price(0, [arm.round_s[r] for r in idle], [arm.round_propose_s[r] for r in idle], plain_s)
        out.append({"kind": "unaccepted", "at": None, "tokens": 0, "rounds": len(idle),
                    "D_s": 0.0, "P_s": round(cost.P_s, 6), "H_s": round(cost.H_s, 6)})
    return out


def arm_json(arm: ArmTurn, plain_s: float, record_len: int) -> dict[str, Any]:
    rest_s = 0.0
    if arm.diverged:
        # The record after the point of divergence, at the ordinary decode rate: the
        # ordinary arm decodes it too (the module doc: this is not R).
        rest_s = (record_len - (arm.diverged_at or 0)) * plain_s
    model_s = arm.measured_s + rest_s
    out: dict[str, Any] = {
        "prefill_s": round(arm.prefill_s, 6), "decode_s": round(arm.decode_s, 6), "model_s": round(model_s, 6),
        "cached_tokens": arm.cached_tokens, "prompt_tokens": arm.prompt_tokens,
        "tokens_by_kind": arm.tokens_by_kind, "rounds": arm.rounds,
        "verified": {"proposed": arm.verified.get("proposed", 0), "accepted": arm.verified.get("accepted", 0)},
        "propose_s": round(arm.propose_s, 6), "identical": arm.identical, "diverged": arm.diverged,
        "interventions": interventions(arm, plain_s),
    }
    if arm.policy_s:
        out["policy_H_s"] = round(arm.policy_s, 6)
    if arm.policy_notes:
        out["policy_interventions"] = arm.policy_notes
    if arm.diverged:
        out.update(diverged_at=arm.diverged_at, wrong_tokens=arm.wrong_tokens, rest_s=round(rest_s, 6),
                   measured_model_s=round(arm.measured_s, 6))
    return out


# --- aggregation ---------------------------------------------------------------------------


def prefilled_tokens(entry: Mapping[str, Any]) -> int:
    """The one definition: prompt tokens the engine computed (not served from the cache)."""
    return entry["prompt_tokens"] - entry["cached_tokens"]


def cache_hit_rate(entry: Mapping[str, Any], digits: int = 4) -> float:
    """Cached share of the prompt tokens (0 for an empty prompt)."""
    return round(entry["cached_tokens"] / entry["prompt_tokens"], digits) if entry["prompt_tokens"] else 0.0


def _add_totals(totals: dict[str, Any], entry: dict[str, Any]) -> None:
    for key in ("prefill_s", "decode_s", "model_s"):
        totals[key] = round(totals.get(key, 0.0) + entry[key], 6)
    kinds = totals.setdefault("tokens_by_kind", {})
    for kind, n in entry["tokens_by_kind"].items():
        kinds[kind] = kinds.get(kind, 0) + n
    for item in entry.get("interventions", []):
        for key in ("D_s", "P_s", "H_s"):
            totals[key] = round(totals.get(key, 0.0) + item[key], 6)
    if "rest_s" in entry:
        totals["rest_s"] = round(totals.get("rest_s", 0.0) + entry["rest_s"], 6)
    # Prompt tokens after policies and the cache: a context rewrite (compaction,
    # masking) trades fewer prompt tokens for cache misses after its edit point.
    for key in ("prompt_tokens", "cached_tokens"):
        totals[key] = totals.get(key, 0) + entry[key]
    totals["prefilled_tokens"] = prefilled_tokens(totals)
    totals["cache_hit_rate"] = cache_hit_rate(totals)
    totals["turns"] = totals.get("turns", 0) + 1
    totals["identical_turns"] = totals.get("identical_turns", 0) + int(entry["identical"])
    totals["diverged_turns"] = totals.get("diverged_turns", 0) + int(entry["diverged"])


def ratios(totals: dict[str, dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """ordinary model_s / arm model_s, and 1 - arm / ordinary, per arm."""
    base = totals.get(BASELINE, {}).get("model_s", 0.0)
    ratio, saved = {}, {}
    for name, t in totals.items():
        m = t.get("model_s", 0.0)
        if base > 0 and m > 0:
            ratio[name] = round(base / m, 4)
            saved[name] = round(1 - m / base, 4)
    return ratio, saved


# --- the run -------------------------------------------------------------------------------


@dataclass
class Replayer:
    """Arms' engines over one loaded model; replays sessions turn by turn."""

    model: Any
    tokenizer: Any
    info: ServedModel
    options: ReplayOptions
    progress: Any = None  # traces/progress.py Progress (begin / advance)
    warn: Callable[[str], None] | None = None
    engines: dict[str, Any] = field(default_factory=dict)
    hooks: dict[str, list[Any]] = field(default_factory=dict)
    _plain: list[float] = field(default_factory=list)  # ordinary decode s/token seen so far

    def start(self) -> None:
        from jumpahead.engine.engine import EngineConfig

        from .forcing import ReplayEngine

        for arm in self.options.arms:
            config = EngineConfig(max_batch=1, prefix_cache=True, prefix_cache_ssd=False,
                                  prefix_cache_ram_bytes=RAM_CACHE_BYTES, max_proposal=self.options.max_proposal,
                                  cost_aware=self.options.cost_aware, objective=self.options.objective,
                                  method_specs={"drafter": self._drafter_for(arm)})
            engine = ReplayEngine(self.model, self.tokenizer, self.info, config)
            if arm.spec.asserted_strict:
                engine.strict.asserted = True
            self.engines[arm.name] = engine
            self.hooks[arm.name] = policy_hooks(arm, engine)

    def _drafter_for(self, arm: Arm) -> str | None:
        """The drafter an arm's engine loads: only arms that run method "drafter" pay
        for one (a drafter that is not the model's raises DrafterError when loaded)."""
        if "drafter" not in arm.spec.methods:
            return None
        from jumpahead.engine.methods.drafter import default_drafter_path

        return self.options.drafter or str(default_drafter_path())

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()

    def __enter__(self) -> "Replayer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def context_length(self) -> int:
        return next(iter(self.engines.values())).context_length

    def plan(self, session: Session) -> tuple[list[PlannedTurn], list[dict[str, Any]], Window | None]:
        return plan_session(session, self.tokenizer, self.context_length, self.options)

    async def replay_session(self, session: Session, planned: list[PlannedTurn], skipped: list[dict[str, Any]],
                             window: Window | None) -> dict[str, Any]:
        arms = self.options.arms
        session, tools_inferred = with_tools(session)
        turns_out = []
        totals: dict[str, dict[str, Any]] = {a.name: {} for a in arms}
        for t, plan in enumerate(planned):
            measured: dict[str, ArmTurn] = {}
            order = arm_order(arms, t)
            for k, arm in enumerate(order):  # interleaved: every arm on this turn before the next turn
                if self.progress:
                    self.progress.begin(f"{session.id[:24]} turn {plan.index} arm {arm.name}")
                measured[arm.name] = await run_arm_turn(self.engines[arm.name], arm, self.hooks[arm.name], plan,
                                                        session.id)
                if self.progress:
                    self.progress.advance(work(plan), step_done=k == len(arms) - 1)
            plain_s = self._plain_s(measured[BASELINE])
            entry: dict[str, Any] = {"index": plan.index, "prompt_tokens": len(plan.prompt),
                                     "output_tokens": len(plan.tokens), "order": [a.name for a in order], "arms": {}}
            if plan.window is not None:
                entry["window"] = plan.window
            for arm in arms:
                m = measured[arm.name]
                entry["arms"][arm.name] = arm_json(m, plain_s, len(plan.tokens))
                if self.options.prompt_digests:
                    entry["arms"][arm.name]["prompt_digest"] = m.prompt_digest
                _add_totals(totals[arm.name], entry["arms"][arm.name])
                if not m.identical and not m.diverged:
                    self._loud(f"session {session.id} turn {plan.index}: arm {arm.name} emitted tokens that differ "
                               f"from the record at token {_first_difference(m.output, plan.tokens)} "
                               f"({len(m.output)} emitted, {len(plan.tokens)} recorded)")
            turns_out.append(entry)
        ratio, saved = ratios(totals)
        return {
            "id": session.id, "source": session.source, "format": session.format,
            "turns_total": session.turns, "turns_replayed": len(turns_out),
            "window": None if window is None else window.describe(),
            "tools": "inferred from the session's calls" if tools_inferred else "recorded" if session.tools else "none",
            "skipped": skipped, "turns": turns_out, "totals": totals, "ratios": ratio, "saved_share": saved,
        }

    def _plain_s(self, ordinary: ArmTurn) -> float:
        """The ordinary arm's decode seconds per token on this turn (the median of the
        turns so far where this turn has no decode round)."""
        s = ordinary.plain_round_s()
        if s is not None:
            self._plain.append(s)
            return s
        return statistics.median(self._plain) if self._plain else 0.0

    def _loud(self, message: str) -> None:
        if self.warn:
            self.warn(message)


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


NOTES = [
    "forced replay: each turn's output is the recorded assistant message in the model's format; "
    "plain rounds emit the recorded token, verified proposals are accepted where they match it",
    "model_s = engine prefill_s + decode_s per turn; ratio = ordinary model_s / arm model_s",
    "D = supplied tokens x the ordinary arm's decode s/token on the same turn; P = the rounds that carried "
    "them beyond a plain round, less their proposer time; H = proposer time in those rounds; rounds where "
    "proposers ran but nothing was accepted are one `unaccepted` item per turn (D = 0) with their P and H "
    "(traces/accounting.py defines all three)",
    "a diverged turn (a wrong asserted intervention) is ended there; the rest of the record is charged as "
    "rest_s = its tokens x the ordinary arm's decode s/token, included in model_s (the ordinary arm decodes "
    "it too: this is not a recovery cost)",
    "R (recovery) is not observable in forced replay: a rollback is a pointer move and the record, not the "
    "model, decides what follows a wrong intervention; live runs (jumpahead live) measure it",
    "the arms' order rotates by one each turn (turns[].order)",
    "prompt_tokens are counted after the arm's policies (context rewrites); totals' cache_hit_rate = "
    "cached_tokens / prompt_tokens, prefilled_tokens = prompt_tokens - cached_tokens",
]


def summarize(sessions: list[dict[str, Any]], arms: list[Arm]) -> dict[str, Any]:
    totals: dict[str, dict[str, Any]] = {a.name: {} for a in arms}
    for s in sessions:
        for turn in s["turns"]:
            for name, entry in turn["arms"].items():
                _add_totals(totals[name], entry)
    ratio, saved = ratios(totals)
    return {"totals": totals, "ratios": ratio, "saved_share": saved}


def work(plan: PlannedTurn) -> float:
    """A turn's expected cost in decode-token units (for progress and ETA): its output
    plus its prompt at ~1/50 of a decode step per token (the first turn of a window is
    prefilled cold; later ones mostly hit the cache, so this overstates them)."""
    return len(plan.tokens) + len(plan.prompt) / 50


def replay(sessions: list[Session], options: ReplayOptions, loaded: tuple[Any, Any, Any],
           progress: Callable[[float, int], Any] | None = None,
           warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Replay `sessions` under `options.arms` on the loaded (model, tokenizer, info);
    the `jumpahead.replay` JSON document. `progress(total_units, turns)` makes a
    progress reporter (traces/progress.py Progress) once the turns are planned."""
    model, tokenizer, info = loaded
    warnings: list[str] = []

    def loud(message: str) -> None:
        warnings.append(message)
        if warn:
            warn(message)

    started = time.perf_counter()
    with Replayer(model, tokenizer, info, options, warn=loud) as replayer:
        plans = [(s, *replayer.plan(s)) for s in sessions]
        if progress is not None:
            turns = [p for _, planned, _, _ in plans for p in planned]
            replayer.progress = progress(sum(work(p) for p in turns) * len(options.arms), len(turns))
        try:
            reports = [asyncio.run(replayer.replay_session(s, p, sk, w)) for s, p, sk, w in plans]
        finally:
            if replayer.progress is not None:
                replayer.progress.close()
    doc = {
        "kind": "jumpahead.replay", "version": 1, "model": info.name,
        "arms": [a.name for a in options.arms],
        "options": {"turns": options.turns, "max_context": options.max_context,
                    "max_output_tokens": options.max_output_tokens, "objective": options.objective,
                    "cost_aware": options.cost_aware, "max_proposal": options.max_proposal},
        "notes": NOTES, "sessions": reports, "summary": summarize(reports, options.arms),
        "warnings": warnings, "wall_s": round(time.perf_counter() - started, 3),
    }
    return doc
