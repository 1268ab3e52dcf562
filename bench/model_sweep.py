"""`jumpahead bench models`: every model type mlx-lm ships, served as `jumpahead serve`
serves it by default, checked against mlx-lm token for token (issue 41: every model
mlx-lm can run is served exactly in the batch, or one row at a time, or refused at
load with the reason).

For each type (bench/model_zoo.py builds its tiny random-weight folder), a child
process (a crash or a hang in one type does not stop the sweep; --timeout per type)
loads the folder through serve's own path (app/serve.py engine_config, whose method
specs the Engine attaches; serve's default arguments: app/model_sweep.py) and runs the family
tests' oracles (tests/test_families.py):

- alone: each of 4 prompts, greedy, equals mlx-lm's `stream_generate` (or differs
  only at a proven near-tie, tests/oracle.py's rule);
- batch: the same 4 requests together, joining 50 ms apart, odd rows carrying partly
  wrong verified proposals, each equal to alone;
- prefix: an agent's second turn (first prompt, its answer, a tool result) hits the
  prefix cache and equals mlx-lm cold;
- kv8: with --kv-bits 8 where the engine accepts it, the batch equals alone (near
  ties judged on the engine's own quantized cache, as tests/test_kv_quant.py does).

Outcome of a type: `batch` (served exactly in the batch), `one-row` (served exactly,
the engine chose one row at a time: runner.describe()'s one_row_per_forward),
`refused` (UnsupportedModel at load, with its reason), or a failure: `wrong` (tokens
differ beyond a near-tie), `error` (a request failed or raised), `crash` (load died
with an internal error, not a clean refusal; or the child died or hung), `skipped`
(the tiny model cannot be built or mlx-lm itself cannot run it here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

OUTCOMES = ("batch", "one-row", "refused", "wrong", "error", "crash", "skipped")
FAILURES = ("wrong", "error", "crash")
INTERNAL = ("AttributeError", "TypeError", "KeyError", "IndexError", "NameError")
CHILD = "jumpahead.app.model_sweep"  # the child process's module: serve's loading path (app/)
TEXTS = [
    "Hello there, write a function that adds two numbers please",
    "List the files in the current folder",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n# explain this code in detail",
    "What is the capital of France? Answer in one word, then explain why it is the capital.",
]
TOKENS = 12
NEAR_TIE = 1e-2  # tests/oracle.py
KV_TIE = 1.0  # tests/test_kv_quant.py QUANT_TIE[8]


class Wrong(AssertionError):
    pass


class RequestError(RuntimeError):
    pass


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:300]


# ---------------------------------------------------------------- oracles (child)

def near_tie(logits_of: Callable[[list[int]], Any], prompt: list[int], got: list[int], want: list[int],
             tol: float, what: str) -> str:
    """tests/oracle.py assert_same_or_near_tie: equal, or the first divergence is a
    near-tie of the reference's top two logits; else Wrong naming it."""
    import mlx.core as mx

    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if i is None:
        if len(got) == len(want):
            return "identical"
        raise Wrong(f"{what}: lengths differ without a token difference ({len(got)} vs {len(want)})")
    logits = logits_of(prompt + want[:i])
    a, b = float(logits[got[i]]), float(logits[want[i]])
    top2 = mx.argsort(-logits)[:2].tolist()
    if abs(a - b) <= tol and {got[i], want[i]} == set(top2):
        return f"near-tie at {i}"
    raise Wrong(f"{what}: divergence at output position {i} is not a near-tie: tokens {got[i]} vs {want[i]}, "
                f"logits {a:.4f} vs {b:.4f}, top2 {top2}")


class _ScriptedVerified:
    """tests/test_families.py ScriptedVerified "partial": proposals of the row's own
    continuation, wrong from their 3rd token."""

    name = "echo"

    def __init__(self, continuation: list[int], span: int) -> None:
        self.continuation, self.span = continuation, span

    def propose(self, view, max_len):
        from jumpahead.engine.methods.proposal import Proposal

        done = len(view.tokens) - view.prompt_len
        nxt = list(self.continuation[done: done + min(self.span, max_len)])
        if not nxt:
            return None
        for j in range(2, len(nxt)):
            nxt[j] = (nxt[j] + 7 + j) % 40000 + 100
        return Proposal(nxt, "echo")

    def feedback(self, proposal, accepted):
        pass


def _tokens(chunks, what: str) -> list[int]:
    last = chunks[-1] if chunks else None
    if last is None or last.finish_reason == "error":
        raise RequestError(f"{what}: {getattr(last, 'error', None) or 'no chunks'}")
    return [t for c in chunks for t in c.tokens]


def _alone(engine, prompts: list[list[int]], n: int, what: str) -> list[list[int]]:
    from jumpahead.engine.types import GenerationRequest

    return [_tokens(engine.generate_sync(GenerationRequest(prompt=p, max_tokens=n)), f"{what} prompt {i}")
            for i, p in enumerate(prompts)]


def _staggered(engine, prompts: list[list[int]], alone: list[list[int]], n: int) -> list[list[int]]:
    from jumpahead.engine.types import GenerationRequest

    async def one(i: int) -> list[int]:
        await asyncio.sleep(0.05 * i)
        r = GenerationRequest(prompt=prompts[i], max_tokens=n)
        if i % 2:
            r.proposers = [_ScriptedVerified(alone[i], span=2 + i)]
        chunks = []
        async for c in engine.stream(r):
            chunks.append(c)
        return _tokens(chunks, f"batch row {i}")

    async def together():
        return await asyncio.gather(*[one(i) for i in range(len(prompts))])

    return asyncio.run(together())


def _engine_logits(engine):
    """Reference logits over the engine's own (quantized) cache, one fresh forward."""
    return engine.runner.fresh_logits


def _classify_load_error(exc: BaseException) -> tuple[str, str]:
    from jumpahead.engine.kv.cache_layout import UnsupportedModel

    if isinstance(exc, UnsupportedModel):
        return "refused", f"{type(exc).__name__}: {exc}"
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return "crash", f"{type(exc).__name__}: {exc}{where}"


def check_type(model_type: str, root: Path, open_engine: Callable[[str, list[str]], Any], tokens: int = TOKENS,
               kv: bool = True) -> dict[str, Any]:
    """One type's record: outcome, reason, layer kinds, the checks' notes, kv8 outcome.
    `open_engine(folder, extra serve arguments)` loads it as `jumpahead serve` would."""
    import mlx.core as mx
    from mlx_lm import stream_generate

    from jumpahead.bench import model_zoo
    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.types import GenerationRequest

    rec: dict[str, Any] = {"type": model_type, "outcome": None, "reason": None}
    t0 = time.time()
    try:
        folder = model_zoo.build(model_type, root, ensure_default_model(progress=lambda s: None))
    except KeyError as exc:
        return {**rec, "outcome": "skipped", "reason": str(exc.args[0])}
    except BaseException as exc:  # noqa: BLE001  (mlx-lm's classes refuse the config, or exit)
        return {**rec, "outcome": "skipped", "reason": f"cannot build: {type(exc).__name__}: {_first_line(str(exc))}"}
    # mlx-lm itself, on this machine: the reference
    try:
        from mlx_lm.utils import load as mlx_lm_load

        model, tokenizer = mlx_lm_load(str(folder))
        probe = model(mx.array([[1, 2, 3]], dtype=mx.int32))
        mx.eval(probe)
    except BaseException as exc:  # noqa: BLE001
        return {**rec, "outcome": "skipped",
                "reason": f"mlx-lm itself cannot run it here: {type(exc).__name__}: {_first_line(str(exc))}"}
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
               for t in TEXTS]
    want = [[r.token for r in stream_generate(model, tokenizer, p, max_tokens=tokens)] for p in prompts]

    def ref_logits(seq: list[int]):
        out = model(mx.array([seq], dtype=mx.int32))[0, -1].astype(mx.float32)
        mx.eval(out)
        return out

    pcdir = tempfile.mkdtemp(prefix="sweep-pc-", dir=str(root))
    try:
        engine = open_engine(str(folder), ["--prefix-cache-dir", pcdir])
    except BaseException as exc:  # noqa: BLE001
        outcome, reason = _classify_load_error(exc)
        return {**rec, "outcome": outcome, "reason": reason, "s": round(time.time() - t0, 1)}
    notes: dict[str, str] = {}
    try:
        layers = engine.runner.describe()
        rec["layers"] = {k: layers.get(k) for k in ("kinds", "layers", "serving", "one_row_per_forward", "verifies",
                                                      "padded_rows", "limits", "ragged", "split_head") if k in layers}
        rec["methods"] = list(engine.config.default_methods)
        alone = _alone(engine, prompts, tokens, "alone")
        for i in range(4):
            notes[f"alone{i}"] = near_tie(ref_logits, prompts[i], alone[i], want[i], NEAR_TIE,
                                          f"alone vs mlx-lm, prompt {i}")
        batch = _staggered(engine, prompts, alone, tokens)
        for i in range(4):
            notes[f"batch{i}"] = near_tie(ref_logits, prompts[i], batch[i], alone[i], NEAR_TIE,
                                          f"batch of four vs alone, row {i}")
        # an agent's second turn: the first turn's prompt, its answer and a tool result
        answer = [t for t in alone[0] if t not in getattr(tokenizer, "eos_token_ids", ())]
        second = tokenizer.apply_chat_template(
            [{"role": "user", "content": TEXTS[0]}, {"role": "assistant", "content": tokenizer.decode(answer)},
             {"role": "user", "content": "The tool printed: 42 files, 3 folders."}], add_generation_prompt=True)
        cold = [r.token for r in stream_generate(model, tokenizer, second, max_tokens=tokens)]
        chunks = engine.generate_sync(GenerationRequest(prompt=second, max_tokens=tokens))
        warm = _tokens(chunks, "prefix-cache second turn")
        rec["prefix_cached_tokens"] = chunks[-1].cached_tokens
        rec["prefix_hit"] = chunks[-1].cached_tokens >= len(prompts[0])
        notes["prefix"] = near_tie(ref_logits, second, warm, cold, NEAR_TIE, "prefix-cache second turn vs mlx-lm cold")
        serving = engine.runner.describe()
        one_row = bool(serving.get("one_row_per_forward")) or engine.config.max_batch == 1
        rec["outcome"] = "one-row" if one_row else "batch"
        if one_row:
            rec["reason"] = "; ".join(serving.get("limits") or []) or serving.get("serving") or "one row per forward"
    except Wrong as exc:
        rec["outcome"], rec["reason"] = "wrong", str(exc)
    except RequestError as exc:
        rec["outcome"], rec["reason"] = "error", str(exc)
    except BaseException as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
        rec["outcome"], rec["reason"] = "error", f"{type(exc).__name__}: {_first_line(str(exc))}{where}"
    finally:
        engine.close()
    rec["notes"] = notes
    if kv:
        rec["kv8"] = _check_kv8(folder, root, open_engine, prompts, tokens)
    rec["s"] = round(time.time() - t0, 1)
    return rec


def _check_kv8(folder: Path, root: Path, open_engine, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """--kv-bits 8: loads (or the reason it is refused), and the batch equals alone."""
    pcdir = tempfile.mkdtemp(prefix="sweep-pc-kv-", dir=str(root))
    try:
        engine = open_engine(str(folder), ["--kv-bits", "8", "--kv-group-size", "32", "--prefix-cache-dir", pcdir])
    except BaseException as exc:  # noqa: BLE001
        outcome, reason = _classify_load_error(exc)
        if outcome == "crash" and isinstance(exc, ValueError):
            outcome = "refused"  # the KV format's own checks (head widths vs the group size)
        return {"outcome": outcome, "reason": _first_line(reason)}
    try:
        alone = _alone(engine, prompts, tokens, "kv8 alone")
        batch = _staggered(engine, prompts, alone, tokens)
        for i in range(4):
            near_tie(_engine_logits(engine), prompts[i], batch[i], alone[i], KV_TIE, f"kv8 batch vs alone, row {i}")
        one_row = bool(engine.runner.describe().get("one_row_per_forward")) or engine.config.max_batch == 1
        return {"outcome": "one-row" if one_row else "batch"}
    except Wrong as exc:
        return {"outcome": "wrong", "reason": str(exc)}
    except BaseException as exc:  # noqa: BLE001
        return {"outcome": "error", "reason": f"{type(exc).__name__}: {_first_line(str(exc))}"}
    finally:
        engine.close()


def child_main(argv: list[str], open_engine: Callable[[str, list[str]], Any]) -> int:
    """In the child: check one type, print its record as the last JSON line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("type")
    ap.add_argument("--root", required=True)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--jobs", type=int, default=1, help="types checked at the same time (default: 1)")
    ap.add_argument("--no-kv", action="store_true")
    a = ap.parse_args(argv)
    rec = check_type(a.type, Path(a.root), open_engine, a.tokens, kv=not a.no_kv)
    sys.stdout.flush()
    print("\n" + json.dumps(rec), flush=True)
    return 0


# ---------------------------------------------------------------- the sweep (parent)

def run_child(model_type: str, root: Path, timeout: float, tokens: int = TOKENS, kv: bool = True) -> dict[str, Any]:
    cmd = [sys.executable, "-m", CHILD, model_type, "--root", str(root), "--tokens", str(tokens)]
    if not kv:
        cmd.append("--no-kv")
    t0 = time.time()
    try:
        # one BLAS thread a child unless told otherwise: children run side by side
        # (--jobs), and OpenBLAS threads on an oversubscribed CPU wait on each other
        # (a 23-token forward of the default model took 21 s instead of 0.4 at load 8)
        env = {"JUMPAHEAD_BLAS_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"type": model_type, "outcome": "crash", "reason": f"hung: no result in {timeout:.0f} s",
                "s": round(time.time() - t0, 1)}
    for line in reversed(out.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    tail = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    why = tail[-1] if tail else ""
    return {"type": model_type, "outcome": "crash",
            "reason": f"child died (exit {out.returncode}){': ' + why[:300] if why else ''}",
            "s": round(time.time() - t0, 1)}


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    counts = {o: sum(r["outcome"] == o for r in records) for o in OUTCOMES}
    kv = {}
    for r in records:
        if r.get("kv8"):
            kv[r["kv8"]["outcome"]] = kv.get(r["kv8"]["outcome"], 0) + 1
    # refusals whose reason is an internal error the load-time check caught (the model
    # calls what the engine's cache does not have), not a limit the engine names
    internal = [r["type"] for r in records if r["outcome"] == "refused"
                and any(f"{e}:" in (r.get("reason") or "") for e in INTERNAL)]
    return {"types": len(records), "counts": counts, "kv8_counts": kv,
            "failures": {o: [r["type"] for r in records if r["outcome"] == o] for o in FAILURES},
            "refused_on_internal_error": internal}


def write_docs(path: Path, records: list[dict[str, Any]], command: str) -> None:
    import mlx_lm

    s = summary(records)
    limited = sum(1 for r in records if r["outcome"] == "batch" and (r.get("layers") or {}).get("limits"))
    lines = ["# Models: every model type mlx-lm ships, as jumpahead serves it", "",
             f"Generated by `{command}` (bench/model_sweep.py) with mlx-lm {mlx_lm.__version__}, "
             f"{time.strftime('%Y-%m-%d')}: each type's tiny random-weight model (bench/model_zoo.py) loaded as "
             "`jumpahead serve` loads it by default and checked against mlx-lm token for token (alone, a batch of "
             "four joining at different times, a prefix-cache second turn; `--kv-bits 8` where accepted). "
             "Do not edit by hand.", "",
             "Outcomes: **batch** served exactly in the batch (where the reason column names a limit, rows share "
             "rounds of one token each and proposals are not verified); **one-row** served exactly, one row per forward; "
             "**refused** at load, with the reason; failures: **wrong** (tokens differ beyond a near-tie), "
             "**error** (a request failed), **crash** (an internal error at load, or the process died or hung); "
             "**skipped** (the tiny model cannot be built or run by mlx-lm here).", "",
             "The kv-bits column runs `--kv-bits 8 --kv-group-size 32`; tiny models whose attention heads are "
             "16 wide cannot group by 32, so there it records the engine refusing that format at load "
             "(tests/test_kv_quant.py checks quantized KV on models with 64-wide heads).", "",
             "Counts: " + ", ".join(f"{o} {n}" for o, n in s["counts"].items() if n) + f" ({limited} of the batch "
             "types at one token a row per round).", "",
             "| type | layer kinds | outcome | reason | kv-bits 8 |", "|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: r["type"]):
        kinds = (r.get("layers") or {}).get("kinds") or (r.get("layers") or {}).get("layers") or ""
        if isinstance(kinds, dict):
            kinds = ", ".join(f"{k} {v}" for k, v in kinds.items())
        elif isinstance(kinds, list):
            kinds = ", ".join(map(str, kinds))
        kv = r.get("kv8") or {}
        kvtext = kv.get("outcome", "") + (f": {kv['reason']}" if kv.get("reason") else "")
        cell = lambda t: str(t or "").replace("|", "\\|").replace("\n", " ")[:200]  # noqa: E731
        # a batch served with limits (one token a row per round) says which, from /health
        why = r.get("reason") or "; ".join((r.get("layers") or {}).get("limits") or [])
        lines.append(f"| {r['type']} | {cell(kinds)} | {r['outcome']} | {cell(why)} | {cell(kvtext)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def sweep(types: list[str], root: Path, timeout: float, tokens: int = TOKENS, kv: bool = True,
          out: Callable[[dict], None] = lambda r: None, jobs: int = 1) -> list[dict[str, Any]]:
    """Each type in its own child process, `jobs` at a time; records in `types`' order."""
    from concurrent.futures import ThreadPoolExecutor

    root.mkdir(parents=True, exist_ok=True)
    if jobs <= 1:
        records = []
        for t in types:
            records.append(run_child(t, root, timeout, tokens, kv))
            out(records[-1])
        return records
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_child, t, root, timeout, tokens, kv) for t in types]
        for f in futures:
            out(f.result())
        return [f.result() for f in futures]


def main(argv: list[str] | None = None) -> int:
    """`jumpahead bench models [--types a,b] [--root DIR] [--timeout S] [--jsonl FILE] [--write-docs [PATH]]`."""
    from jumpahead.bench import model_zoo
    from jumpahead.engine.model.default_model import ensure_default_model

    ap = argparse.ArgumentParser(prog="jumpahead bench models", description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=None, help="comma-separated model types (default: every one mlx-lm ships)")
    ap.add_argument("--root", default=None, help="folder of the tiny models (default: the jumpahead cache's "
                    "model-zoo/)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per type (default: 600)")
    ap.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens generated per request (default: {TOKENS})")
    ap.add_argument("--jobs", type=int, default=1, help="types checked at the same time (default: 1)")
    ap.add_argument("--no-kv", action="store_true", help="skip the --kv-bits 8 check")
    ap.add_argument("--jsonl", default=None, help="also append each type's record to this file")
    ap.add_argument("--write-docs", nargs="?", const="docs/models.md", default=None, metavar="PATH",
                    help="write the generated table (default path: docs/models.md)")
    a = ap.parse_args(argv)
    all_types = model_zoo.model_types()
    types = a.types.split(",") if a.types else all_types
    unknown = [t for t in types if t not in all_types]
    if unknown:
        ap.error(f"unknown model types: {', '.join(unknown)}")
    root = Path(a.root) if a.root else ensure_default_model(progress=lambda s: None).parent.parent / "model-zoo"

    def out(rec: dict) -> None:
        print(json.dumps(rec), flush=True)
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(rec) + "\n")

    records = sweep(types, root, a.timeout, a.tokens, not a.no_kv, out, a.jobs)
    s = summary(records)
    print(json.dumps({"summary": s}, indent=1), flush=True)
    if a.write_docs:
        write_docs(Path(a.write_docs), records, "jumpahead bench models " + " ".join(argv or sys.argv[1:]))
    return 1 if any(s["failures"].values()) else 0
