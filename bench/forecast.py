"""`jumpahead bench forecast`: the throughput objective's forecast of who finishes last,
measured on replayed real agent turns.

Turns of the public agent sessions (../shared/traces/public) are forced to their
recorded outputs (traces/forcing.py: each plain round emits the recorded token, a
verified copy is accepted exactly where it matches the record), so every row stops
at its recorded length, at EOS, long before its budget, as real turns do. Batches of
4 turns from different sessions run together on one ReplayEngine (max_batch 4), each
request with the budget an agent sends (`--budget`, capped by the window), through
the proxy's runner (prompt window of `--context` tokens, strict fill fields, the
session lengths read off the full history by core/turn_lengths.py). Arms, in
rotating order per repeat:

- `off`: methods none (ordinary decoding);
- `budget`: the server's default methods, the row the batch waits on judged by its
  remaining max_tokens (recent lengths withheld: the rule before forecasts);
- `forecast`: the same methods, judged by engine/schedule/forecast.py.

Each arm's emitted tokens must equal the record in every run (else the command
fails). Reported per batch and summed over batches: wall and process CPU time from
submit to the last row's end, and the ratios between arms; and how well each rule
foresaw which row of a batch ends last, and each turn's length.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from jumpahead.engine.interface import Engine

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PUBLIC = SHARED / "traces" / "public"
SESSIONS = (
    "mini-swe-agent/marshmallow-code__marshmallow-1343.traj.json",
    "claude-code/258c7280-ae70-4798-800f-63464d01a85d.jsonl",
    "pi/before-compaction.jsonl",
    "openhands/basic.json",
    "swe-agent/swe-agent__test-repo-i1.traj",
)
ARMS = ("off", "budget", "forecast")


def plan_turns(engine: "Engine", sessions: list[Any], per_session: int, context: int, max_output: int,
               progress: Callable[[str], None]) -> list[list[dict[str, Any]]]:
    """Per session, its last `per_session` eligible turns (oldest first), each with its
    prompt window, record and the recent lengths of its full history."""
    from jumpahead.core.turn_lengths import recent_turn_lengths

    from jumpahead.traces.replay import ReplayOptions, plan_session

    out = []
    for session in sessions:
        options = ReplayOptions(arms=[], turns=per_session, max_context=context, max_output_tokens=max_output)
        planned, _, _ = plan_session(session, engine.tokenizer, engine.context_length, options)
        turns = []
        for plan in planned:
            lengths = recent_turn_lengths(engine.tokenizer, session.turn(plan.index))
            if lengths:  # a first turn has no history to forecast from
                turns.append({"session": session.id, "plan": plan, "lengths": lengths})
        progress(f"{session.format} {session.id}: {len(turns)} turns planned")
        if turns:
            out.append(turns)
    return out


def batches_of(per_session: list[list[dict[str, Any]]], size: int, count: int) -> list[list[dict[str, Any]]]:
    """`count` batches, each of `size` turns from different sessions (newest turns first)."""
    pools = [list(reversed(t)) for t in per_session]
    out = []
    for b in range(count):
        batch = []
        for k in range(len(pools)):
            pool = pools[(b + k) % len(pools)]
            if pool and len(batch) < size:
                batch.append(pool.pop(0))
        if len(batch) == size:
            out.append(batch)
    return out


async def _run_batch(engine: "Engine", batch: list[dict[str, Any]], arm: str, budget: int) -> dict[str, Any]:
    from jumpahead.engine.methods.registry import SERVER_DEFAULT
    from jumpahead.core.exchange import Exchange
    from jumpahead.core.options import RequestOptions
    from jumpahead.core.turn_runner import complete_turn, prepare_turn

    prepared = []
    for item in batch:
        plan = item["plan"]
        turn = copy.deepcopy(plan.turn)
        turn.max_tokens = min(budget, engine.context_length - len(plan.prompt) - 1)
        turn.options = RequestOptions(methods=("none",) if arm == "off" else tuple(SERVER_DEFAULT))
        p = await asyncio.to_thread(prepare_turn, engine, turn, None, Exchange(protocol="chat"), [])
        # the agent's request carries its whole history: the lengths come from it
        p.request.recent_lengths = list(item["lengths"]) if arm == "forecast" else []
        item["probe"] = engine.probe(p.request.request_id, plan.tokens)
        prepared.append(p)
    ends: list[float] = [0.0] * len(batch)

    async def one(i: int) -> Any:
        out = await complete_turn(engine, prepared[i])
        ends[i] = time.perf_counter()
        return out

    w0, c0 = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*[one(i) for i in range(len(batch))])
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    for i, out in enumerate(outs):
        if out.finish_reason == "error":
            raise RuntimeError(f"arm {arm}: a turn failed: {out.error}")
    fills = [o.usage.fill or {} for o in outs]
    return {
        "wall_s": wall, "cpu_s": cpu,
        "identical": [p.output_tokens == item["plan"].tokens for p, item in zip(prepared, batch)],
        "last": max(range(len(batch)), key=lambda i: ends[i]),
        "tokens": sum(len(p.output_tokens) for p in prepared),
        "copied": sum(f.get("verified", {}).get("accepted", 0) for f in fills),
        "proposed": sum(f.get("verified", {}).get("proposed", 0) for f in fills),
    }


def run(model: str | None = None, batches: int = 3, repeats: int = 2, context: int = 1536, max_output: int = 320,
        budget: int = 4096, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
    import jumpahead.traces.importers  # noqa: F401  (registers the formats)
    from jumpahead.engine.engine import EngineConfig
    from jumpahead.engine.schedule.forecast import from_lengths
    from jumpahead.engine.model.loader import load_model

    from jumpahead.traces.formats import load_session
    from jumpahead.traces.forcing import ReplayEngine

    paths = [PUBLIC / s for s in SESSIONS if (PUBLIC / s).exists()]
    if not paths:
        return {"skipped": f"no public sessions under {PUBLIC} (the bench replays them)"}
    m, tok, info = load_model(model, progress=progress)
    engine = ReplayEngine(m, tok, info, EngineConfig(max_batch=4, prefix_cache_ssd=False))
    try:
        sessions = [load_session(p) for p in paths]
        per_session = plan_turns(engine, sessions, batches + 2, context, max_output, progress)
        chosen = batches_of(per_session, 4, batches)
        if not chosen:
            return {"skipped": "fewer than 4 sessions with eligible turns"}
        samples: list[dict[str, list[dict[str, Any]]]] = [{a: [] for a in ARMS} for _ in chosen]
        for b, batch in enumerate(chosen):  # warm-up: every prompt enters the RAM prefix cache
            asyncio.run(_run_batch(engine, batch, "off", budget))
            progress(f"batch {b}: warm ({[len(x['plan'].tokens) for x in batch]} recorded tokens)")
        for r in range(repeats):
            for b, batch in enumerate(chosen):
                order = ARMS[r % 3:] + ARMS[: r % 3]
                for arm in order:
                    res = asyncio.run(_run_batch(engine, batch, arm, budget))
                    samples[b][arm].append(res)
                    progress(f"repeat {r} batch {b} {arm:>8}: wall {res['wall_s']:.1f}s cpu {res['cpu_s']:.1f}s "
                             f"copied {res['copied']}/{res['proposed']}")
    finally:
        engine.close()

    def med(b: int, arm: str, key: str) -> float:
        return statistics.median(x[key] for x in samples[b][arm])

    out_batches = []
    for b, batch in enumerate(chosen):
        lengths = [len(x["plan"].tokens) for x in batch]
        row: dict[str, Any] = {
            "turns": [{"session": x["session"], "message": x["plan"].index, "recorded_tokens": len(x["plan"].tokens),
                       "recent_lengths": x["lengths"], "forecast_at_start": from_lengths(x["lengths"], 0)}
                      for x in batch],
            "longest_row": max(range(4), key=lambda i: lengths[i]),
            "forecast_picks": max(range(4), key=lambda i: from_lengths(batch[i]["lengths"], 0)),
        }
        for arm in ARMS:
            row[arm] = {"wall_s": round(med(b, arm, "wall_s"), 2), "cpu_s": round(med(b, arm, "cpu_s"), 2),
                        "copied": samples[b][arm][0]["copied"], "proposed": samples[b][arm][0]["proposed"]}
        row["identical_outputs"] = all(all(x["identical"]) for arm in ARMS for x in samples[b][arm])
        for a, base in (("forecast", "off"), ("budget", "off"), ("forecast", "budget")):
            row[f"{a}_vs_{base}"] = {clock: round(statistics.median(
                y[key] / x[key] for x, y in zip(samples[b][a], samples[b][base])), 3)
                for clock, key in (("speedup_wall", "wall_s"), ("speedup_cpu", "cpu_s"))}
        out_batches.append(row)

    def total(arm: str, key: str, r: int) -> float:
        return sum(samples[b][arm][r][key] for b in range(len(chosen)))

    summary = {}
    for a, base in (("forecast", "off"), ("budget", "off"), ("forecast", "budget")):
        summary[f"{a}_vs_{base}"] = {
            clock: round(statistics.median(total(base, key, r) / total(a, key, r) for r in range(repeats)), 3)
            for clock, key in (("speedup_wall", "wall_s"), ("speedup_cpu", "cpu_s"))}
    all_turns = [t for turns in per_session for t in turns]
    err_forecast = [abs(from_lengths(t["lengths"], 0) - len(t["plan"].tokens)) for t in all_turns]
    err_budget = [abs(budget - len(t["plan"].tokens)) for t in all_turns]
    return {
        "bench": "forecast",
        "model": info.name,
        "batches": len(chosen), "repeats": repeats, "context": context, "budget": budget,
        "max_output_tokens": max_output,
        "speedup_over_batches": summary,
        "identical_outputs": all(row["identical_outputs"] for row in out_batches),
        "last_row_foreseen": {"forecast": sum(r["forecast_picks"] == r["longest_row"] for r in out_batches),
                              "budget": "never (all rows have the same budget)", "of": len(out_batches)},
        "length_error_tokens_median": {"forecast": statistics.median(err_forecast),
                                       "budget": statistics.median(err_budget), "turns": len(all_turns)},
        "per_batch": out_batches,
        "speedup": "time of the second arm over the first (> 1: the first is faster)",
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    from jumpahead.bench.output import emit

    p = argparse.ArgumentParser(prog="jumpahead bench forecast", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--batches", type=int, default=3, help="batches of 4 turns (default 3)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each arm per batch (default 2)")
    p.add_argument("--context", type=int, default=1536, help="prompt window in tokens (default 1536)")
    p.add_argument("--max-output", type=int, default=320, help="skip turns with longer records (default 320)")
    p.add_argument("--budget", type=int, default=4096, help="max_tokens each request asks for (default 4096)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if min(a.batches, a.repeats, a.context, a.max_output, a.budget) < 1:
        p.error("every count must be at least 1")
    result = run(a.model, a.batches, a.repeats, a.context, a.max_output, a.budget,
                 progress=lambda s: print(s, file=sys.stderr, flush=True))
    return emit(result, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
