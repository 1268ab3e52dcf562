"""Echo benchmark: verified copies from the context vs ordinary decoding.

Arms run interleaved (order alternating per repeat) in one process on one loaded
model, so machine noise hits them alike; each ratio is the median of per-pair ratios
(pairs ran back to back), by wall clock and by process CPU time (on a shared machine
the CPU clock is less disturbed by other processes).

1. copy-heavy turns (the answer repeats spans of the prompt: edit a file it
   contains): echo vs ordinary generation tokens/s (first to last token), outputs
   compared token for token. Target >= 1.5x.
2. turns with nothing to copy: echo on vs off. Target <= 3% slower.
3. a batch of 4 mixed rows (two copy-heavy, two plain; all with echo, so some
   propose and some do not) vs the same rows without proposals: aggregate tokens/s
   over the whole batch (submit to last token). Target: not lower. Also with the
   cost-aware width policy off (every proposal carried whole), to show its share.
   Echo runs under the default objective "throughput" (a row verifies only where
   the batch gains: while requests wait for a slot, or when the batch waits on it
   last) and under "latency" (every row's proposals sized for its own speed).
4. a queue of 12 such rows (6 copy-heavy, 6 plain, alternating) through max_batch 4,
   as a server sees them: a row that finishes early frees its slot for the next, so
   what proposals save shows up as throughput. Echo vs ordinary, aggregate tokens/s
   over the whole run and under load (until the last request is admitted; the drain
   at the end, where the last plain rows run alone, is the same in both arms).
5. what limits the figures: the cost of one forward at width 1, 9 and 17 (a row
   carrying 0, 8 or 16 proposal tokens) at B=1 and B=4, relative to width 1; and
   the ragged forward when one of the 4 rows carries the proposal; and a proposer
   that never proposes (the general round's cost over plain decoding).

`python -m jumpahead.bench.echo [--tokens N] [--repeats R] [--only mixed] [--out F]`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Sequence

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx

from jumpahead.engine.engine import Engine, EngineConfig
from jumpahead.engine.methods.registry import SERVER_DEFAULT, parse_methods
from jumpahead.engine.types import GenerationRequest

PY_FILE = '''import json
import os
from dataclasses import dataclass


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    debug: bool = False
    workers: int = 4


def load_settings(path: str) -> Settings:
    """Read settings from a JSON file; missing keys keep their defaults."""
    if not os.path.exists(path):
        return Settings()
    with open(path) as f:
        data = json.load(f)
    return Settings(**{k: v for k, v in data.items() if k in Settings.__annotations__})


def save_settings(settings: Settings, path: str) -> None:
    with open(path, "w") as f:
        json.dump(settings.__dict__, f, indent=2)
'''

CONFIG = '''server:
  host: 127.0.0.1
  port: 8080
  workers: 4
  timeout_seconds: 30
database:
  url: postgres://localhost:5432/app
  pool_size: 10
  echo_queries: false
logging:
  level: info
  format: "%(asctime)s %(levelname)s %(message)s"
  file: /var/log/app.log
'''

COPY_TASKS = [
    f"Here is settings.py:\n```python\n{PY_FILE}```\nChange the default port to 9090. Show the whole updated file.",
    f"Here is config.yaml:\n```yaml\n{CONFIG}```\nSet the logging level to debug. Show the whole updated file.",
]
QUEUE = 12  # requests in the queue arm (half copy-heavy, half plain, alternating)
PLAIN_TASKS = [
    "Write a long, detailed essay about the history of the printing press.",
    "Explain step by step how a compiler turns source code into machine code.",
]


def chat_prompt(tokenizer, text: str) -> list[int]:
    """One user message as a prompt (the model's chat template, generation prompt added)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


async def _one(engine: Engine, req: GenerationRequest) -> dict[str, Any]:
    t0 = time.perf_counter()
    stamps: list[tuple[float, float]] = []  # (wall, process cpu) at each chunk with tokens
    counts: list[int] = []  # tokens in each of those chunks
    tokens: list[int] = []
    first = 0  # tokens in the first chunk (they come with the prefill)
    fill = None
    async for chunk in engine.stream(req):
        if chunk.tokens:
            stamps.append((time.perf_counter(), time.process_time()))
            counts.append(len(chunk.tokens))
            tokens += chunk.tokens
            first = first or len(chunk.tokens)
        if chunk.finish_reason is not None:
            fill = chunk.fill
    # generation speed: tokens after the first chunk over first -> last chunk, by the
    # wall clock and by the process's CPU time (this machine is shared: CPU time is
    # far less disturbed by other processes than the wall clock)
    n = len(tokens) - first
    wall = stamps[-1][0] - stamps[0][0] if len(stamps) > 1 else 0.0
    cpu = stamps[-1][1] - stamps[0][1] if len(stamps) > 1 else 0.0
    return {"tokens": tokens, "tps": n / wall if wall > 0 else 0.0, "tps_cpu": n / cpu if cpu > 0 else 0.0,
            "start": t0, "end": stamps[-1][0] if stamps else t0, "fill": fill,
            "emitted": [(w, k) for (w, _), k in zip(stamps, counts)]}


class NoProposals:
    """A proposer that never proposes: what a row pays just for having a proposer
    (it leaves the pipelined plain-greedy path for the general round)."""

    name = "none"

    def propose(self, view, max_len):
        return None

    def feedback(self, proposal, accepted):
        pass


def _request(prompt: list[int], methods: list[str], n: int) -> GenerationRequest:
    if methods == ["noop"]:
        return GenerationRequest(prompt=prompt, max_tokens=n, methods=["off"], proposers=[NoProposals()])
    return GenerationRequest(prompt=prompt, max_tokens=n, methods=list(methods) or ["off"])


def _rows(engine: Engine, prompts: list[list[int]], methods: list[list[str]], n: int) -> dict[str, Any]:
    """Run rows together; per-row results plus the batch's aggregate tokens/s
    (submit to last token) by wall clock and by process CPU time."""
    async def go():
        return await asyncio.gather(*[_one(engine, _request(p, m, n)) for p, m in zip(prompts, methods)])

    w0, c0 = time.perf_counter(), time.process_time()
    rows = asyncio.run(go())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    total = sum(len(r["tokens"]) for r in rows)
    # Under load: tokens/s from the first token until the last row got its first token
    # (every slot busy while requests wait), leaving out the drain at the end, when
    # fewer rows run than the batch holds.
    start = min(r["emitted"][0][0] for r in rows if r["emitted"])
    admitted = max(r["emitted"][0][0] for r in rows if r["emitted"])
    busy = sum(k for r in rows for w, k in r["emitted"][1:] if w <= admitted)
    busy_tps = busy / (admitted - start) if admitted > start else 0.0
    return {"rows": rows, "agg_tps": total / wall, "agg_tps_cpu": total / cpu, "busy_tps": busy_tps}


def width_costs(engine: Engine, context: int = 256, widths=(1, 9, 17), batches=(1, 4), reps: int = 8) -> dict[str, Any]:
    """Median ms (wall and process CPU) of one forward of width W over B rows with
    ~`context` tokens cached, widths interleaved. The B=4 rows have unequal ends (the
    per-row mask path a mixed batch takes). Logits at every position when W > 1, as
    a verifying round needs."""
    runner = engine.runner
    out: dict[str, Any] = {}
    prompt = [(i * 7919) % 30000 + 100 for i in range(context)]
    # the engine thread is idle here; run on our own stream
    with mx.stream(mx.new_stream(mx.default_device())):
        for b in batches:
            cache = runner.new_cache()
            cache.ends = [0] * b
            runner.forward([prompt] * b, cache, None)
            cache.advance([context - 4 * i for i in range(b)])
            mx.eval(cache.arrays())
            wall: dict[int, list[float]] = {w: [] for w in widths}
            cpu: dict[int, list[float]] = {w: [] for w in widths}
            ragged: dict[int, list[float]] = {w: [] for w in widths}
            for rep in range(reps + 1):
                for w in widths:
                    t0, c0 = time.perf_counter(), time.process_time()
                    logits = runner.forward([[5] * w] * b, cache, slice(None) if w > 1 else slice(-1, None))
                    mx.eval(mx.argmax(logits, axis=-1))
                    if rep:  # not advanced: each rep rewrites the same slots
                        wall[w].append(time.perf_counter() - t0)
                        cpu[w].append(time.process_time() - c0)
                    if b > 1:  # one row carries w-1 proposal tokens, the others none
                        t0 = time.perf_counter()
                        rows = [[5] * w] + [[5]] * (b - 1)
                        logits, _ = runner.forward_ragged(rows, cache, [w] + [1] * (b - 1))
                        mx.eval(mx.argmax(logits, axis=-1))
                        if rep:
                            ragged[w].append(time.perf_counter() - t0)
            row: dict[str, float] = {}
            for w in widths:
                row[f"w{w}_ms"] = round(statistics.median(wall[w]) * 1000, 2)
                row[f"w{w}_cpu_ms"] = round(statistics.median(cpu[w]) * 1000, 2)
                if ragged[w]:  # the ragged forward a mixed round takes (engine/kv/ragged.py)
                    row[f"one_row_w{w}_ragged_ms"] = round(statistics.median(ragged[w]) * 1000, 2)
            for w in widths[1:]:
                row[f"w{w}_over_w1"] = round(row[f"w{w}_ms"] / row[f"w{widths[0]}_ms"], 3)
                row[f"w{w}_over_w1_cpu"] = round(row[f"w{w}_cpu_ms"] / row[f"w{widths[0]}_cpu_ms"], 3)
            out[f"B{b}"] = row
    return out


def _summary(a: list[dict[str, float]], b: list[dict[str, float]], key: str, cpu: bool = True) -> dict[str, Any]:
    """Arm a vs arm b: medians and the median of per-pair ratios (pairs ran back to back)."""
    out: dict[str, Any] = {}
    for clock, k in (("wall", key), ("cpu", key + "_cpu"))[: 2 if cpu else 1]:
        ra = [x[k] for x in a]
        rb = [x[k] for x in b]
        out[clock] = {
            "tok_s": round(statistics.median(ra), 2),
            "baseline_tok_s": round(statistics.median(rb), 2),
            "ratio": round(statistics.median([x / y for x, y in zip(ra, rb) if y > 0]), 3),
        }
    return out


def run(model_name: str | None = None, tokens: int = 96, repeats: int = 3, only: str | None = None,
        methods: Sequence[str] = SERVER_DEFAULT) -> dict[str, Any]:
    """All arms, or only the mixed batch of 4 (`only="mixed"`: its ratio moves a few
    percent from run to run, so it gets its own longer run). The "echo" arms run
    `methods` (default: the server's default methods, engine/methods/registry.py); the
    baseline runs methods off."""
    under = list(methods)
    # no SSD tier: its writes would add noise, and the RAM tier gives all arms the same state
    engine = Engine.load(model_name, EngineConfig(prefix_cache_ssd=False), progress=lambda s: None)
    tok = engine.tokenizer
    copy_prompts = [chat_prompt(tok, t) for t in COPY_TASKS]
    plain_prompts = [chat_prompt(tok, t) for t in PLAIN_TASKS]
    mixed = [copy_prompts[0], plain_prompts[0], copy_prompts[1], plain_prompts[1]]
    _rows(engine, copy_prompts[:1], [under], 8)  # warm-up
    _rows(engine, copy_prompts[:1], [[]], 8)

    arms: dict[str, list[dict[str, float]]] = {}
    identical: dict[str, list[bool]] = {"copy": [], "plain": [], "mixed": [], "queue": []}
    telemetry: list[dict] = []
    arm_methods = {"base": [], "echo": under, "noop": ["noop"]}
    for r in range(repeats):
        order = ("base", "echo", "noop") if r % 2 == 0 else ("noop", "echo", "base")
        for group, prompts in (("copy", copy_prompts), ("plain", plain_prompts)) if only != "mixed" else ():
            for p in prompts:
                got = {}
                for arm in order:
                    if arm == "noop" and group == "copy":
                        continue
                    row = _rows(engine, [p], [arm_methods[arm]], tokens)["rows"][0]
                    arms.setdefault(f"{group}_{arm}", []).append(row)
                    got[arm] = row
                identical[group].append(got["base"]["tokens"] == got["echo"]["tokens"])
                if r == 0:
                    telemetry.append({"group": group, **got["echo"]["fill"]})
        if only == "copy":
            continue
        got = {}
        for arm in order + ("echo_uncapped", "echo_latency"):
            if arm == "noop":
                continue
            config = engine.scheduler.config
            if arm == "echo_uncapped":  # the same rows without the cost-aware width policy
                config.cost_aware = False
                res = _rows(engine, mixed, [under] * 4, tokens)
                config.cost_aware = True
            elif arm == "echo_latency":  # the same rows under the latency objective
                default, config.objective = config.objective, "latency"
                res = _rows(engine, mixed, [under] * 4, tokens)
                config.objective = default
            else:
                res = _rows(engine, mixed, [arm_methods[arm]] * 4, tokens)
            arms.setdefault(f"mixed_{arm}", []).append(res)
            got[arm] = [x["tokens"] for x in res["rows"]]
            if r == 0 and arm == "echo":
                telemetry += [{"group": "mixed", **x["fill"]} for x in res["rows"]]
        identical["mixed"].append(got["base"] == got["echo"] == got["echo_uncapped"] == got["echo_latency"])
        if only is not None:
            continue
        queue = [copy_prompts[(i // 2) % 2] if i % 2 == 0 else plain_prompts[(i // 2) % 2] for i in range(QUEUE)]
        cap, engine.scheduler.config.max_batch = engine.scheduler.config.max_batch, 4
        got = {}
        for arm in ("base", "echo") if r % 2 == 0 else ("echo", "base"):
            res = _rows(engine, queue, [arm_methods[arm]] * len(queue), tokens)
            arms.setdefault(f"queue_{arm}", []).append(res)
            got[arm] = [x["tokens"] for x in res["rows"]]
        engine.scheduler.config.max_batch = cap
        identical["queue"].append(got["base"] == got["echo"])

    widths = width_costs(engine) if only is None else {}
    engine.close()
    if only == "copy":
        return {"bench": "echo", "model": engine.info.name, "methods": under, "tokens_per_row": tokens,
                "repeats": repeats, "layers": engine.runner.describe(),
                "copy_heavy": {"echo_vs_ordinary": _summary(arms["copy_echo"], arms["copy_base"], "tps"),
                               "identical_outputs": all(identical["copy"])},
                "nothing_to_copy": {"echo_vs_ordinary": _summary(arms["plain_echo"], arms["plain_base"], "tps"),
                                    "identical_outputs": all(identical["plain"])},
                "replays": engine.scheduler.counters.get("replays", 0),
                "echo_telemetry_first_repeat": telemetry}
    mixed_batch = {
        "echo_vs_ordinary": _summary(arms["mixed_echo"], arms["mixed_base"], "agg_tps"),
        "target": "ratio >= 1.0",
        # proposals carried whole (up to max_proposal), not sized by the width policy
        "echo_uncapped_vs_ordinary": _summary(arms["mixed_echo_uncapped"], arms["mixed_base"], "agg_tps"),
        # objective "latency": every row's proposals sized for its own speed (engine/schedule/scheduler.py)
        "echo_latency_objective_vs_ordinary": _summary(arms["mixed_echo_latency"], arms["mixed_base"], "agg_tps"),
        "objective": engine.scheduler.config.objective,  # of the "echo" arm
        "per_pair_ratios_wall": {
            arm: [round(a["agg_tps"] / b["agg_tps"], 3) for a, b in zip(arms[f"mixed_{arm}"], arms["mixed_base"])]
            for arm in ("echo", "echo_uncapped", "echo_latency")
        },
        "width_policy": engine.scheduler.width_policy.as_dict(),
        "identical_outputs": all(identical["mixed"]),
    }
    if only is not None:
        return {"bench": "echo", "model": engine.info.name, "methods": under, "tokens_per_row": tokens, "repeats": repeats,
                "mixed_batch_4": mixed_batch}
    return {
        "bench": "echo",
        "model": engine.info.name,
        "methods": under,  # the "echo" arms; the baseline runs methods off
        "dtype": engine.info.dtype,
        "device": str(mx.default_device()),
        "tokens_per_row": tokens,
        "repeats": repeats,
        "copy_heavy": {
            "echo_vs_ordinary": _summary(arms["copy_echo"], arms["copy_base"], "tps"),
            "target": "ratio >= 1.5",
            "identical_outputs": all(identical["copy"]),
        },
        "nothing_to_copy": {
            "echo_vs_ordinary": _summary(arms["plain_echo"], arms["plain_base"], "tps"),
            "target": "ratio >= 0.97",
            "identical_outputs": all(identical["plain"]),
            # a proposer that never proposes: what leaving the pipelined greedy path costs
            "never_proposing_vs_ordinary": _summary(arms["plain_noop"], arms["plain_base"], "tps"),
        },
        "mixed_batch_4": mixed_batch,
        f"queue_of_{QUEUE}_through_4_slots": {
            # whole run, submit to last token (ends with the last rows draining alone)
            "echo_vs_ordinary": _summary(arms["queue_echo"], arms["queue_base"], "agg_tps"),
            # while requests wait and every slot is busy (wall clock only)
            "echo_vs_ordinary_under_load": _summary(arms["queue_echo"], arms["queue_base"], "busy_tps", cpu=False)["wall"],
            "identical_outputs": all(identical["queue"]),
        },
        "forward_cost_by_width": widths,
        "echo_telemetry_first_repeat": telemetry,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    from jumpahead.bench.output import emit

    p = argparse.ArgumentParser(prog="python -m jumpahead.bench.echo", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=("mixed", "copy"), default=None,
                   help="mixed: only the mixed batch of 4 arms; copy: only the single-row copy-heavy and "
                        "nothing-to-copy turns (e.g. for another model family)")
    p.add_argument("--methods", default=None, metavar="LIST",
                   help="methods of the measured arms (default: the server's, %s)" % ",".join(SERVER_DEFAULT))
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    try:
        methods = parse_methods(a.methods)
    except ValueError as exc:
        p.error(str(exc))
    return emit(run(a.model, a.tokens, a.repeats, a.only, methods), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
