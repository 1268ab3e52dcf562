"""`jumpahead bench drafter`: the learned drafter vs ordinary decoding, side by side.

Arms run interleaved (order alternating per repeat) in one process on one loaded model;
each ratio is the median of per-pair ratios (pairs ran back to back), by wall clock and
by process CPU time. Outputs are compared token for token on every run: any arm whose
tokens differ from ordinary decoding's fails the benchmark (exit 1), whatever the speed.

1. turns with nothing to copy (held-out prompts: reasoning, new code, prose; none is
   in the drafter's training data): drafter vs ordinary at B=1 (goal >= 1.5x) and as
   one batch of 4 (goal >= 1.1x, never below 0.98); tokens per round and accepted
   draft length (mean and histogram).
2. copy-heavy turns (bench/echo.py's): echo vs echo + drafter (goal: at least echo alone),
   and echo + drafter without composition (`SchedulerConfig.compose_copies` off: the
   drafter drafts even where the row's echo copy outranks it).
3. a mixed batch of 4 (two copy-heavy, two plain): echo vs echo + drafter (with and
   without composition) vs ordinary.
4. the two-model draft (`--draft-model`, default `truncated:8`: the default model's first
   8 blocks; `none` skips it) on the same held-out turns, vs ordinary at B=1 and as one
   batch of 4 (both objectives), with the draft group's forward counts: every row's
   draft runs in one batched forward per step (`forwards`) where drafting row by row
   would have run `row_forwards`.

5. (`--adapter NAME|DIR`) agent turns of the adapted model with its own drafter
   (`agent_turns`): ordinary, drafter, default and default + drafter at B=1 and B=4.

`jumpahead bench drafter [--drafter PATH] [--draft-model SPEC|none] [--tokens N] [--repeats R] [--model M]
[--adapter NAME|DIR [--agent-only]]`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx

from jumpahead.bench.output import emit
from jumpahead.bench.echo import COPY_TASKS, _rows, _summary, chat_prompt
from jumpahead.engine.methods.registry import MethodError
from jumpahead.engine.methods.drafter import default_drafter_path, read_meta
from jumpahead.engine.engine import Engine, EngineConfig
# Held out: written for this benchmark, never part of the drafter's training prompts
# (training/train_drafter.py keeps every training source clear of their subjects).
from jumpahead.training.train_drafter import NOTHING_TO_COPY

DEFAULT_DRAFT_MODEL = "truncated:8"
UNCOMPOSED = "echo+drafter/uncomposed"  # the composition's ablation arm
_GROUP_COUNTS = ("forwards", "row_forwards", "chains", "rows_drafted", "fed_tokens")  # DraftModelGroup.stats


def _method_stats(rows: list[dict[str, Any]], method: str) -> dict[str, Any]:
    """Proposals, accepted draft length (mean, histogram) and tokens per round, summed over rows."""
    hist: list[int] = []
    proposals = accepted = drafted = rounds = tokens = sat_out = 0
    propose_ms = 0.0
    for r in rows:
        fill = r["fill"] or {}
        m = (fill.get("methods") or {}).get(method) or {}
        proposals += m.get("proposals", 0)
        accepted += m.get("accepted", 0)
        drafted += m.get("proposed", 0)
        propose_ms += m.get("propose_ms", 0.0)
        sat_out += m.get("sat_out", 0)
        for i, n in enumerate(m.get("accepted_histogram", [])):
            hist += [0] * (i + 1 - len(hist))
            hist[i] += n
        rounds += fill.get("rounds", 0)
        tokens += len(r["tokens"])
    return {"proposals": proposals, "drafted": drafted, "accepted": accepted,
            "mean_accepted_length": round(accepted / proposals, 3) if proposals else 0.0,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
            "accepted_histogram": hist, "propose_ms_per_proposal": round(propose_ms / proposals, 3) if proposals
            else 0.0, "tokens_per_round": round(tokens / rounds, 3) if rounds else 0.0,
            "sat_out": sat_out}


def _progress(line: str) -> None:
    """A progress line on stderr (the bench runs for minutes; stdout carries the JSON)."""
    print(f"bench drafter: {line}", file=sys.stderr, flush=True)


def run(drafter: str | None, model: str | None = None, tokens: int = 96, repeats: int = 3,
        draft_model: str | None = DEFAULT_DRAFT_MODEL) -> dict[str, Any]:
    path = str(drafter or default_drafter_path())
    engine = Engine.load(model, EngineConfig(prefix_cache_ssd=False,
                                             method_specs={"drafter": path, "draft": draft_model}),
                         progress=lambda s: None)
    tok = engine.tokenizer
    plain = [chat_prompt(tok, t) for t in NOTHING_TO_COPY]
    copy = [chat_prompt(tok, t) for t in COPY_TASKS]
    mixed = [copy[0], plain[0], copy[1], plain[2]]
    _rows(engine, plain[:1], [["drafter"]], 8)  # warm-up
    _rows(engine, plain[:1], [[]], 8)

    results: dict[str, list[Any]] = {}
    mismatches: list[str] = []

    def check(label: str, got: dict[str, Any], reference: str) -> None:
        want = [r["tokens"] for r in got[reference]["rows"]]
        for arm, res in got.items():
            if [r["tokens"] for r in res["rows"]] != want:
                mismatches.append(f"{label}: arm {arm} differs from {reference}")

    def alone(prompts: list[list[int]], arms: dict[str, list[str]], key: str, label: str, flip: bool,
              r: int) -> None:
        """Each prompt alone (B=1) under every arm, back to back; outputs checked."""
        for i, p in enumerate(prompts):
            got = {}
            for arm in (reversed(list(arms)) if flip else arms):
                got[arm] = _rows(engine, [p], [arms[arm]], tokens)
                results.setdefault(f"{key}_{arm}", []).append(got[arm]["rows"][0])
            check(f"{label} prompt {i} repeat {r}", got, "ordinary")

    arms_b1 = {"ordinary": [], "drafter": ["drafter"]}
    arms_two = {"ordinary": [], "draft": ["draft"]} if draft_model else {}
    draft_counts: dict[str, list[dict[str, int]]] = {}
    both = ["echo", "drafter"]
    arms_copy = {"echo": ["echo"], "echo+drafter": both, UNCOMPOSED: both}
    arms_mixed = {"ordinary": [], "echo": ["echo"], "echo+drafter": both, UNCOMPOSED: both}

    def composed(arm: str, prompts: list[list[int]], methods: list[list[str]]) -> dict[str, Any]:
        """The arm's rows, with composition off for the UNCOMPOSED arm only."""
        config = engine.scheduler.config
        config.compose_copies = arm != UNCOMPOSED
        try:
            return _rows(engine, prompts, methods, tokens)
        finally:
            config.compose_copies = True
    for r in range(repeats):
        _progress(f"repeat {r + 1}/{repeats}")
        flip = r % 2 == 1
        alone(plain, arms_b1, "b1", "B=1", flip, r)
        got = {}
        config = engine.scheduler.config
        for arm in (("drafter_latency", *reversed(list(arms_b1))) if flip else (*arms_b1, "drafter_latency")):
            if arm == "drafter_latency":  # every row drafts for its own speed (SchedulerConfig.objective)
                default, config.objective = config.objective, "latency"
                got[arm] = _rows(engine, plain, [["drafter"]] * 4, tokens)
                config.objective = default
            else:
                got[arm] = _rows(engine, plain, [arms_b1[arm]] * 4, tokens)
            results.setdefault(f"b4_{arm}", []).append(got[arm])
        check(f"B=4 repeat {r}", got, "ordinary")
        for i, p in enumerate(copy):
            got = {}
            for arm in (reversed(list(arms_copy)) if flip else arms_copy):
                got[arm] = composed(arm, [p], [arms_copy[arm]])
                results.setdefault(f"copy_{arm}", []).append(got[arm]["rows"][0])
            check(f"copy-heavy prompt {i} repeat {r}", got, "echo")
        got = {}
        for arm in (reversed(list(arms_mixed)) if flip else arms_mixed):
            got[arm] = composed(arm, mixed, [arms_mixed[arm]] * 4)
            results.setdefault(f"mixed_{arm}", []).append(got[arm])
        check(f"mixed batch repeat {r}", got, "ordinary")
        if not arms_two:
            continue
        alone(plain, arms_two, "two_b1", "two-model B=1", flip, r)
        got = {}
        for arm in (("draft_latency", *reversed(list(arms_two))) if flip else (*arms_two, "draft_latency")):
            before = engine.method_state("draft").group.stats()
            if arm == "draft_latency":
                default, config.objective = config.objective, "latency"
                got[arm] = _rows(engine, plain, [["draft"]] * 4, tokens)
                config.objective = default
            else:
                got[arm] = _rows(engine, plain, [arms_two[arm]] * 4, tokens)
            if arm != "ordinary":
                after = engine.method_state("draft").group.stats()
                draft_counts.setdefault(arm, []).append({k: after[k] - before[k] for k in _GROUP_COUNTS})
            results.setdefault(f"two_b4_{arm}", []).append(got[arm])
        check(f"two-model B=4 repeat {r}", got, "ordinary")

    engine.close()
    b4_rows = [row for res in results["b4_drafter"] for row in res["rows"]]
    return {
        "bench": "draft",
        "model": engine.info.name,
        "drafter": path,
        "drafter_training": read_meta(path).get("training", {}),
        "device": str(mx.default_device()),
        "tokens_per_row": tokens,
        "repeats": repeats,
        "identical_outputs": not mismatches,
        "mismatches": mismatches,
        "nothing_to_copy_b1": {
            "drafter_vs_ordinary": _summary(results["b1_drafter"], results["b1_ordinary"], "tps"),
            "target": "ratio >= 1.5",
            "drafter": _method_stats(results["b1_drafter"], "drafter"),
        },
        "nothing_to_copy_b4": {
            "drafter_vs_ordinary": _summary(results["b4_drafter"], results["b4_ordinary"], "agg_tps"),
            "target": "ratio >= 1.1, never below 0.98",
            "per_pair_ratios_wall": [round(a["agg_tps"] / b["agg_tps"], 3)
                                     for a, b in zip(results["b4_drafter"], results["b4_ordinary"])],
            "drafter": _method_stats(b4_rows, "drafter"),
            "objective": "throughput (the server's default: a row verifies in a shared batch only while "
                         "requests wait or when the batch waits on it last)",
            "latency_objective_vs_ordinary": _summary(results["b4_drafter_latency"], results["b4_ordinary"],
                                                      "agg_tps"),
            "latency_objective_drafter": _method_stats(
                [row for res in results["b4_drafter_latency"] for row in res["rows"]], "drafter"),
        },
        "copy_heavy_b1": {
            "echo_and_drafter_vs_echo": _summary(results["copy_echo+drafter"], results["copy_echo"], "tps"),
            "target": "ratio >= 1.0",
            "drafter": _method_stats(results["copy_echo+drafter"], "drafter"),
            "echo": _method_stats(results["copy_echo+drafter"], "echo"),
            "composition": {  # the same arm with compose_copies off, side by side
                "echo_and_drafter_vs_uncomposed": _summary(results["copy_echo+drafter"],
                                                           results[f"copy_{UNCOMPOSED}"], "tps"),
                "uncomposed_vs_echo": _summary(results[f"copy_{UNCOMPOSED}"], results["copy_echo"], "tps"),
                "uncomposed_drafter": _method_stats(results[f"copy_{UNCOMPOSED}"], "drafter"),
            },
        },
        "mixed_batch_4": {
            "echo_and_drafter_vs_echo": _summary(results["mixed_echo+drafter"], results["mixed_echo"], "agg_tps"),
            "echo_and_drafter_vs_ordinary": _summary(results["mixed_echo+drafter"], results["mixed_ordinary"],
                                                     "agg_tps"),
            "echo_vs_ordinary": _summary(results["mixed_echo"], results["mixed_ordinary"], "agg_tps"),
            "echo_and_drafter_vs_uncomposed": _summary(results["mixed_echo+drafter"],
                                                       results[f"mixed_{UNCOMPOSED}"], "agg_tps"),
        },
        "two_model": _two_model(results, draft_model, draft_counts) if arms_two else None,
    }


def _two_model(results: dict[str, list[Any]], spec: str | None,
               counts: dict[str, list[dict[str, int]]]) -> dict[str, Any]:
    """The two-model draft's section: speed against ordinary, acceptance, and how its
    group shared the draft model's forwards at B=4 (summed over repeats), under the
    server's throughput objective (a row drafts in a shared batch only where it pays:
    few rows draft together) and the latency objective (every row drafts each round)."""
    out: dict[str, Any] = {
        "draft_model": spec,
        "b1_vs_ordinary": _summary(results["two_b1_draft"], results["two_b1_ordinary"], "tps"),
        "b1_draft": _method_stats(results["two_b1_draft"], "draft"),
    }
    for arm, label in (("draft", "b4"), ("draft_latency", "b4_latency_objective")):
        shared = {k: sum(c[k] for c in counts[arm]) for k in _GROUP_COUNTS}
        out[label] = {
            "vs_ordinary": _summary(results[f"two_b4_{arm}"], results["two_b4_ordinary"], "agg_tps"),
            "per_pair_ratios_wall": [round(a["agg_tps"] / b["agg_tps"], 3)
                                     for a, b in zip(results[f"two_b4_{arm}"], results["two_b4_ordinary"])],
            "draft": _method_stats([row for res in results[f"two_b4_{arm}"] for row in res["rows"]], "draft"),
            "group_forwards": shared,
            "row_forwards_per_group_forward": round(shared["row_forwards"] / shared["forwards"], 3)
            if shared["forwards"] else None,
        }
    return out


AGENT_ARMS = {"ordinary": [], "drafter": ["drafter"], "default": ["echo"], "default+drafter": ["echo", "drafter"]}


def agent_turns(adapter: str, model: str | None = None, tokens: int = 96, repeats: int = 3,
                prompts: int = 8) -> dict[str, Any]:
    """5. agent turns of the adapted model (`--adapter`): its own drafter (the adapter's
    drafter/ folder) on held-out task-world turns (each the whole history before an
    assistant turn), alone (B=1) and as batches of 4: ordinary, drafter, default (echo +
    checked strict fill) and default + drafter, outputs checked against ordinary. Every
    prompt is decoded once first, so each arm finds it in the prefix cache (agents resend
    the history: the speeds are of decoding the turn)."""
    from jumpahead.engine.methods.drafter import adapter_drafter_path
    from jumpahead.engine.model.lora import resolve_adapter
    from jumpahead.training.train_drafter import world_turns

    folder = resolve_adapter(adapter)
    path = adapter_drafter_path(folder)
    engine = Engine.load(model, EngineConfig(prefix_cache_ssd=False, method_specs={"drafter": str(path)}),
                         progress=lambda s: None, adapter=str(folder))
    tasks = [t for t in world_turns(engine.tokenizer, 2 * prompts, "heldout") if t]
    turns = [t[i % len(t)] for i, t in enumerate(tasks)][:prompts]  # first, second, ... turns in turn
    for p in turns:
        _rows(engine, [p], [[]], tokens)  # warm: every arm finds the history in the prefix cache
    results: dict[str, list[Any]] = {}
    mismatches: list[str] = []
    batches = [turns[i:i + 4] for i in range(0, len(turns) - 3, 4)]
    for r in range(repeats):
        _progress(f"agent turns, repeat {r + 1}/{repeats}")
        order = list(AGENT_ARMS)[::-1] if r % 2 else list(AGENT_ARMS)
        for i, p in enumerate(turns):
            got = {arm: _rows(engine, [p], [AGENT_ARMS[arm]], tokens)["rows"][0] for arm in order}
            for arm in order:
                results.setdefault(f"b1_{arm}", []).append(got[arm])
                if got[arm]["tokens"] != got["ordinary"]["tokens"]:
                    mismatches.append(f"agent turn {i} repeat {r}: arm {arm} differs from ordinary")
        for j, batch in enumerate(batches):
            got = {arm: _rows(engine, batch, [AGENT_ARMS[arm]] * len(batch), tokens) for arm in order}
            for arm in order:
                results.setdefault(f"b4_{arm}", []).append(got[arm])
                if [x["tokens"] for x in got[arm]["rows"]] != [x["tokens"] for x in got["ordinary"]["rows"]]:
                    mismatches.append(f"agent batch {j} repeat {r}: arm {arm} differs from ordinary")
    engine.close()
    b1 = {arm: results[f"b1_{arm}"] for arm in AGENT_ARMS}
    b4 = {arm: results[f"b4_{arm}"] for arm in AGENT_ARMS}
    rows4 = {arm: [row for res in b4[arm] for row in res["rows"]] for arm in AGENT_ARMS}
    return {
        "adapter": str(folder), "drafter": str(path), "turns": len(turns), "batches_of_4": len(batches),
        "tokens_per_turn": round(sum(len(x["tokens"]) for x in b1["ordinary"]) / len(b1["ordinary"]), 1),
        "mismatches": mismatches,
        "b1": {"drafter_vs_ordinary": _summary(b1["drafter"], b1["ordinary"], "tps"),
               "default_vs_ordinary": _summary(b1["default"], b1["ordinary"], "tps"),
               "default_and_drafter_vs_default": _summary(b1["default+drafter"], b1["default"], "tps"),
               "drafter": _method_stats(b1["drafter"], "drafter"),
               "default_and_drafter": {m: _method_stats(b1["default+drafter"], m) for m in ("drafter", "echo")}},
        "b4": {"drafter_vs_ordinary": _summary(b4["drafter"], b4["ordinary"], "agg_tps"),
               "default_vs_ordinary": _summary(b4["default"], b4["ordinary"], "agg_tps"),
               "default_and_drafter_vs_default": _summary(b4["default+drafter"], b4["default"], "agg_tps"),
               "drafter": _method_stats(rows4["drafter"], "drafter"),
               "default_and_drafter": {m: _method_stats(rows4["default+drafter"], m) for m in ("drafter", "echo")}},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jumpahead bench drafter", description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default=None, metavar="PATH",
                        help="drafter folder (default: the one shipped for the default model)")
    parser.add_argument("--model", default=None, metavar="PATH", help="target model (default: the embedded one)")
    parser.add_argument("--draft-model", default=DEFAULT_DRAFT_MODEL, metavar="PATH|truncated:N|none",
                        help=f"the two-model draft's model (default: {DEFAULT_DRAFT_MODEL}; none skips that part)")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per row (default: 96)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--adapter", default=None, metavar="NAME|DIR",
                        help="also run part 5: agent turns of the model with this LoRA adapter and its own drafter")
    parser.add_argument("--agent-only", action="store_true", help="with --adapter: run part 5 alone")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the JSON here")
    args = parser.parse_args(argv)
    spec = None if args.draft_model in ("none", "off", "") else args.draft_model
    if args.agent_only and not args.adapter:
        print("jumpahead bench drafter: --agent-only needs --adapter", file=sys.stderr)
        return 2
    if args.adapter:
        from jumpahead.engine.methods.drafter import adapter_drafter_path
        from jumpahead.engine.model.lora import resolve_adapter

        try:
            folder = resolve_adapter(args.adapter)
        except FileNotFoundError as exc:
            print(f"jumpahead bench drafter: {exc}", file=sys.stderr)
            return 2
        if not adapter_drafter_path(folder).is_dir():
            print(f"jumpahead bench drafter: {folder} has no drafter/ folder "
                  f"(jumpahead train-drafter --adapter {args.adapter})", file=sys.stderr)
            return 2
    try:
        out = {"bench": "draft", "identical_outputs": True, "mismatches": []} if args.agent_only \
            else run(args.drafter, args.model, args.tokens, args.repeats, spec)
    except MethodError as exc:  # a bad truncated:N, a draft of another tokenizer family, a drafter not for the model
        print(f"jumpahead bench drafter: {exc}", file=sys.stderr)
        return 2
    if args.adapter:
        out["agent_turns"] = agent_turns(args.adapter, args.model, args.tokens, args.repeats)
        out["mismatches"] = out["mismatches"] + out["agent_turns"]["mismatches"]
        out["identical_outputs"] = not out["mismatches"]
    if out["mismatches"]:
        print("jumpahead bench drafter: " + "; ".join(out["mismatches"]), file=sys.stderr)
    return emit(out, args.out)  # exit 1, BENCH FAILED, where identical_outputs is false

if __name__ == "__main__":
    raise SystemExit(main())
