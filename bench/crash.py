"""`jumpahead bench crash`: SIGKILL a real `jumpahead serve` during SSD prefix-cache
writes and during trace writes, restart it, and check what survived.

SSD cache (`--target ssd`): a cold reference first (a server with the cache off answers
greedy probe requests), then per kill: start a server over the same cache directory,
check its start-up dropped unfinished writes, ask the probes (they hit segments earlier
runs wrote) and compare with the cold answers, send concurrent long prompts that
publish new segments, and SIGKILL the server a random moment after a segment's temp
file appears (counted as mid-write when a temp file is still there after the kill).
Every `--tear-every`-th kill also truncates the newest segment file, as a torn
non-atomic write would leave it: the next start must detect and drop it.

Traces (`--target trace`): per kill, a script-mode server with `--trace-dir` answers
concurrent clients in the three protocols, each agent session in its own file kept
across restarts, until a SIGKILL at a random time. A kill that leaves a file without
its final newline landed mid-write; every `--tear-every`-th kill also appends half a
line, as a kill inside a write would. At the end every turn a client saw completed
must be in the files, the reader must skip only the half-written lines (with a
warning), and the traces importer must read every file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .clients import PROTOCOLS, filler, request_body, stream_request
from jumpahead.live.server_process import ServerProcess, ServeError, exit_on_sigterm

TMP_SUFFIX = ".tmp"  # engine/prefix/ssd_cache.py writes a segment to a temp name, then renames it


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jumpahead bench crash", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=("ssd", "trace", "both"), default="both")
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per target (default 20)")
    p.add_argument("--tear-every", type=int, default=5,
                   help="also tear a file after every Nth kill (0: never; default 5)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients while waiting to kill (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="cache, trace and log folders (default: a temp dir)")
    args = p.parse_args(argv)
    if args.kills < 1 or args.clients < 1 or args.tear_every < 0:
        p.error("--kills and --clients must be >= 1, --tear-every >= 0")
    return args


# --- SSD prefix cache -------------------------------------------------------------------


def _docs(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"You maintain repository {k}. Its notes: " + filler(rng, 220) for k in range(2)]


def _probe_bodies(docs: list[str]) -> list[dict[str, Any]]:
    return [request_body("chat", doc, f"Probe {k}: what is this repository about?", max_tokens=8)
            for k, doc in enumerate(docs)]


async def _ask(url: str, bodies: list[dict[str, Any]]) -> list[str | None]:
    """Each probe's answer (None when the request failed)."""
    async with httpx.AsyncClient() as client:
        out = []
        for body in bodies:
            r = await stream_request(client, url, "chat", body)
            out.append(r.text if r.ok else None)
        return out


def _tmp_files(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.name.endswith(TMP_SUFFIX)]
    except FileNotFoundError:
        return []


def _segments(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.suffix == ".safetensors"]
    except FileNotFoundError:
        return []


async def _load_until_write(url: str, directory: Path, docs: list[str], rng: random.Random, clients: int,
                            kill: Any, tag: str, timeout: float = 600.0) -> dict[str, Any]:
    """Long prompts that publish new segments; `kill()` a random moment after a temp
    file appears (or when the requests are done without one)."""
    before = {p.name for p in _tmp_files(directory)}

    async def one(k: int) -> None:
        body = request_body("chat", rng.choice(docs), f"{tag} request {k}: " + filler(rng, 260), max_tokens=2)
        async with httpx.AsyncClient() as client:
            await stream_request(client, url, "chat", body, timeout=timeout)

    tasks = [asyncio.ensure_future(one(k)) for k in range(clients)]
    t0 = time.perf_counter()
    seen_write = False
    while time.perf_counter() - t0 < timeout:
        if any(p.name not in before for p in _tmp_files(directory)):
            seen_write = True
            await asyncio.sleep(rng.uniform(0.0, 0.02))
            break
        if all(t.done() for t in tasks):
            break
        await asyncio.sleep(0.001)
    kill()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    left = _tmp_files(directory)
    return {"saw_write": seen_write, "mid_write": bool(left), "tmp_left": len(left)}


def _tear_newest(directory: Path) -> str | None:
    """Truncate the newest segment file to half its size; its name."""
    files = sorted(_segments(directory), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    victim = files[-1]
    size = victim.stat().st_size
    with victim.open("r+b") as fh:
        fh.truncate(size // 2)
    return victim.name


def _cache_stats(url: str) -> dict[str, Any]:
    return httpx.get(url + "/metrics.json", timeout=60).json()["engine"].get("prefix_cache", {})


def run_ssd(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    directory = work / "prompt-cache"
    log = work / "serve-ssd.log"
    docs = _docs(args.seed)
    probes = _probe_bodies(docs)
    rng = random.Random(args.seed)
    with ServerProcess(["--no-prefix-cache", "--log-level", "warning"], log) as cold_server:
        cold = asyncio.run(_ask(cold_server.url, probes))
    if any(a is None for a in cold):
        raise ServeError("the cold reference probes failed")
    common = ["--prefix-cache-dir", str(directory), "--prefix-cache-ram-gb", "0.25", "--log-level", "warning"]
    kills: list[dict[str, Any]] = []
    torn: list[str] = []
    mismatches: list[dict[str, Any]] = []
    starts: list[float] = []
    for i in range(args.kills + 1):
        tmp_before = len(_tmp_files(directory))
        server = ServerProcess(common, log)
        starts.append(server.start_s)
        try:
            tmp_after = len(_tmp_files(directory))
            start_stats = _cache_stats(server.url)
            answers = asyncio.run(_ask(server.url, probes))
            stats = _cache_stats(server.url)
            for k, (got, want) in enumerate(zip(answers, cold)):
                if got != want:
                    mismatches.append({"start": i, "probe": k, "got": got, "cold": want})
            row: dict[str, Any] = {
                "start": i, "tmp_before": tmp_before, "tmp_after_start": tmp_after,
                "files_at_start": start_stats.get("ssd_files"),
                "dropped_at_start": start_stats.get("ssd_skipped", 0) + start_stats.get("ssd_orphans", 0),
                "corrupt_on_load": stats.get("ssd_corrupt", 0),
                "probe_ssd_hit_tokens": stats.get("ssd_hit_tokens", 0),
            }
            if i == args.kills:  # the last start only checks
                kills.append(row)
                break
            row.update(asyncio.run(_load_until_write(server.url, directory, docs, rng, args.clients,
                                                     server.kill, f"kill {i}")))
        finally:
            server.kill()
        if args.tear_every and (i + 1) % args.tear_every == 0:
            name = _tear_newest(directory)
            if name:
                torn.append(name)
                row["torn"] = name
        kills.append(row)
    done = kills[: args.kills]
    dropped = sum(r["dropped_at_start"] + r["corrupt_on_load"] for r in kills[1:])
    report = {
        "kills": len(done),
        "kills_after_a_write_started": sum(r["saw_write"] for r in done),
        "kills_mid_write": sum(r["mid_write"] for r in done),
        "unfinished_writes_removed_at_start": sum(r["tmp_before"] - r["tmp_after_start"] for r in kills),
        "unfinished_writes_left_after_start": sum(r["tmp_after_start"] for r in kills),
        "torn_files_injected": len(torn),
        "bad_files_dropped": dropped,
        "probe_answers": len(probes) * len(kills),
        "probe_mismatches": len(mismatches),
        "mismatch_samples": mismatches[:3],
        "probe_ssd_hit_tokens": sum(r["probe_ssd_hit_tokens"] for r in kills),
        "restarts": len(kills),
        "start_s_median": sorted(starts)[len(starts) // 2],
        "cold_answers": cold,
        "per_kill": kills,
    }
    report["ok"] = (report["probe_mismatches"] == 0 and report["unfinished_writes_left_after_start"] == 0
                    and dropped >= len(torn) and report["probe_ssd_hit_tokens"] > 0)
    return report


# --- traces -----------------------------------------------------------------------------


def _script(path: Path, tag: str, rng: random.Random, turns: int = 600) -> None:
    with path.open("w") as fh:
        for k in range(turns):
            fh.write(json.dumps({"text": f"{tag} turn {k}: " + filler(rng, 12)}) + "\n")


async def _sessions_until_kill(url: str, clients: int, rng: random.Random, kill: Any, tag: str,
                               completed: list[tuple[str, str]]) -> dict[str, Any]:
    """Clients in the three protocols, one session each; SIGKILL a random moment after
    the first answered turn. Appends (session, answer) for every completed turn."""
    in_flight = [0]
    first = asyncio.Event()

    async def client_loop(c: int) -> None:
        session = f"agent-{c}"
        crng = random.Random(rng.random())
        async with httpx.AsyncClient() as client:
            for k in range(10_000):
                protocol = PROTOCOLS[(c + k) % len(PROTOCOLS)]
                body = request_body(protocol, "You are a coding agent. " + filler(crng, 600),
                                    f"{tag} step {k}: " + filler(crng, 200), max_tokens=64)
                in_flight[0] += 1
                r = await stream_request(client, url, protocol, body, headers={"x-session-id": session}, timeout=120)
                in_flight[0] -= 1
                if not r.ok:
                    return
                completed.append((session, r.text))
                first.set()

    tasks = [asyncio.ensure_future(client_loop(c)) for c in range(clients)]
    try:
        await asyncio.wait_for(first.wait(), timeout=600)
    except asyncio.TimeoutError:
        pass
    await asyncio.sleep(rng.uniform(0.2, 3.0))
    flying = in_flight[0]
    kill()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"in_flight_at_kill": flying}


def _unterminated(directory: Path) -> list[Path]:
    out = []
    for p in directory.glob("*.jsonl"):
        with p.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell():
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    out.append(p)
    return out


def run_trace(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from jumpahead.traces.formats import load_session
    from jumpahead.traces.trace_file import read_trace

    directory = work / "traces"
    log = work / "serve-trace.log"
    rng = random.Random(args.seed + 1)
    completed: list[tuple[str, str]] = []
    kills: list[dict[str, Any]] = []
    torn = 0
    for i in range(args.kills):
        script = work / f"script-{i}.jsonl"
        _script(script, f"kill{i}", rng)
        torn_before = set(_unterminated(directory))  # (a line torn on purpose earlier is not this kill's)
        server = ServerProcess(["--script", str(script), "--script-prompt-limit", "64", "--trace-dir", str(directory),
                                "--no-prefix-cache", "--log-level", "warning"], log)
        try:
            row = asyncio.run(_sessions_until_kill(server.url, args.clients, rng, server.kill, f"kill{i}", completed))
        finally:
            server.kill()
        row["mid_write"] = bool(set(_unterminated(directory)) - torn_before)
        if args.tear_every and (i + 1) % args.tear_every == 0:
            # a file whose last line is already torn would merge two tears into one line
            files = [f for f in sorted(directory.glob("*.jsonl")) if f.read_bytes().endswith(b"\n")]
            if files:
                with rng.choice(files).open("ab") as fh:  # half a line, as a kill inside write() leaves
                    fh.write(b'{"type": "turn", "index": 99999, "response": {"content": "half a tu')
                torn += 1
        row["completed_so_far"] = len(completed)
        kills.append(row)
    # What survived: every turn a client saw completed, read back by the reader and the importer.
    recorded: dict[str, list[str]] = {}
    warnings: list[str] = []
    import_errors: list[str] = []
    for path in sorted(directory.glob("*.jsonl")):
        header, turns, warn = read_trace(path)
        warnings += warn
        recorded[header.get("session", path.stem)] = [str((t.get("response") or {}).get("content")) for t in turns]
        try:
            load_session(path)
        except Exception as exc:  # the importer must read what the reader reads
            import_errors.append(f"{path.name}: {type(exc).__name__}: {exc}")
    missing = [(s, text) for s, text in completed if text not in recorded.get(s, [])]
    half = [w for w in warnings if "half-written" in w or "corrupt line" in w]
    report = {
        "kills": len(kills),
        "kills_mid_write": sum(r["mid_write"] for r in kills),
        "kills_with_turns_in_flight": sum(1 for r in kills if r["in_flight_at_kill"]),
        "torn_lines_injected": torn,
        "completed_turns": len(completed),
        "recorded_turns": sum(len(v) for v in recorded.values()),
        "completed_turns_missing": len(missing),
        "missing_samples": missing[:3],
        "sessions": len(recorded),
        "lines_skipped_with_warning": len(half),
        "other_warnings": [w for w in warnings if w not in half][:5],
        "import_errors": import_errors,
        "per_kill": kills,
    }
    report["ok"] = (not missing and not import_errors and not report["other_warnings"]
                    and len(completed) > 0 and len(half) >= torn)
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="jumpahead-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"kind": "jumpahead.bench.crash", "work_dir": str(work)}
    try:
        if args.target in ("ssd", "both"):
            report["ssd"] = run_ssd(args, work)
        if args.target in ("trace", "both"):
            report["trace"] = run_trace(args, work)
    except ServeError as exc:
        print(f"jumpahead bench crash: {exc}", file=sys.stderr)
        return 2
    report["ok"] = all(report[k]["ok"] for k in ("ssd", "trace") if k in report)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1
