"""`jumpahead bench load`: N concurrent streaming clients on loopback against a real
server, mixed protocols (chat completions, Anthropic messages, Responses) and lengths.

Prints JSON: errors (must be 0), whether every stream ended with its terminal event,
throughput and latency percentiles (time to first token, total), and the server's RSS
over time against its configured cache budgets. The baseline, measured in the same run
just before the load, is one client alone on the same mix: throughput and latency are
also given as ratios to it (absolute figures on a shared machine are not stable).
Without `--url` it starts `jumpahead serve` itself, with a prefix cache of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .clients import PROTOCOLS, StreamResult, filler, percentiles, request_body, stream_request
from jumpahead.live.server_process import ServerProcess, ServeError, exit_on_sigterm, on_server, rss_of

# (name, prompt words, max_tokens): short chat turns, a medium read, a long context.
LENGTHS = (("short", 16, 32), ("medium", 120, 24), ("long", 400, 12))
SHARED_SYSTEM_WORDS = 160  # a system prompt several clients share, as one agent's sessions do


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jumpahead bench load", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=32, help="concurrent streaming clients (default 32)")
    p.add_argument("--seconds", type=float, default=120.0, help="how long clients start new requests (default 120)")
    p.add_argument("--baseline-seconds", type=float, default=20.0,
                   help="one client alone first, for the ratios (default 20; 0 skips)")
    p.add_argument("--url", default=None, help="target a running server instead of starting one")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, for RSS from /proc")
    p.add_argument("--max-batch", type=int, default=8, help="started server: rows decoded together (default 8)")
    p.add_argument("--prefix-cache-ram-gb", type=float, default=0.25,
                   help="started server: RAM budget of the prefix cache (default 0.25)")
    p.add_argument("--prefix-cache-ssd-gb", type=float, default=1.0,
                   help="started server: SSD cap of the prefix cache (default 1)")
    p.add_argument("--sample-every", type=float, default=1.0, help="seconds between memory samples (default 1)")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds one request may take (default 900)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="started server: its cache and log folder (default: a temp dir)")
    args = p.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.baseline_seconds < 0 or args.sample_every <= 0:
        p.error("--clients must be >= 1, --seconds and --sample-every > 0, --baseline-seconds >= 0")
    return args


def _turn(rng: random.Random, shared_system: str) -> tuple[str, dict[str, Any], str]:
    """A random (protocol, body, length class)."""
    protocol = rng.choice(PROTOCOLS)
    name, words, max_tokens = rng.choice(LENGTHS)
    system = shared_system if rng.random() < 0.5 else "You are a coding agent. " + filler(rng, 30)
    user = f"Task {rng.randrange(10**9)}: " + filler(rng, words) + "\nSummarize in one line."
    return protocol, request_body(protocol, system, user, max_tokens), name


async def _client(base_url: str, rng: random.Random, shared_system: str, until: float, timeout: float,
                  results: list[tuple[str, StreamResult]]) -> None:
    async with httpx.AsyncClient() as client:
        while time.perf_counter() < until:
            protocol, body, length = _turn(rng, shared_system)
            results.append((length, await stream_request(client, base_url, protocol, body, timeout=timeout)))


async def _sample(base_url: str, pid: int | None, every: float, stop: asyncio.Event, t0: float,
                  out: list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient() as client:
        while not stop.is_set():
            sample: dict[str, Any] = {"t": round(time.perf_counter() - t0, 2)}
            try:
                m = (await client.get(base_url + "/metrics.json", timeout=30)).json()["engine"]
                mem, pc = m.get("memory", {}), m.get("prefix_cache", {})
                sample.update(rss=mem.get("rss_bytes"), mlx_active=mem.get("mlx_active_bytes"),
                              mlx_cache=mem.get("mlx_cache_bytes"), prefix_ram=pc.get("ram_bytes"),
                              rows=mem.get("rows_running"), waiting=mem.get("rows_waiting"))
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                sample["error"] = f"{type(exc).__name__}: {exc}"
            if pid is not None:
                sample["rss"] = rss_of(pid) or sample.get("rss")
            out.append(sample)
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except asyncio.TimeoutError:
                pass


async def _phase(base_url: str, clients: int, seconds: float, seed: int, timeout: float,
                 pid: int | None = None, sample_every: float | None = None) -> dict[str, Any]:
    """Run `clients` clients for `seconds` (in-flight requests finish); summarise."""
    shared = "You are a coding agent working in a repository. " + filler(random.Random(seed), SHARED_SYSTEM_WORDS)
    results: list[tuple[str, StreamResult]] = []
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    sampler = asyncio.ensure_future(_sample(base_url, pid, sample_every, stop, t0, samples)) if sample_every else None
    await asyncio.gather(*(_client(base_url, random.Random(seed * 1000 + i), shared, t0 + seconds, timeout, results)
                           for i in range(clients)))
    wall = time.perf_counter() - t0
    stop.set()
    if sampler is not None:
        await sampler
    return {"summary": summarize(results, wall), "samples": samples}


def summarize(results: list[tuple[str, StreamResult]], wall: float) -> dict[str, Any]:
    ok = [r for _, r in results if r.ok]
    errors = [r for _, r in results if not r.ok]
    tokens = sum(r.output_tokens or 0 for r in ok)
    by_protocol = {}
    for protocol in PROTOCOLS:
        mine = [r for _, r in results if r.protocol == protocol]
        by_protocol[protocol] = {
            "requests": len(mine), "errors": sum(not r.ok for r in mine),
            "ttft_s": percentiles([r.ttft_s for r in mine if r.ok and r.ttft_s is not None]),
            "total_s": percentiles([r.total_s for r in mine if r.ok]),
        }
    by_length = {name: sum(1 for n, _ in results if n == name) for name, _, _ in LENGTHS}
    return {
        "requests": len(results),
        "errors": len(errors),
        "error_samples": sorted({r.error or "" for r in errors})[:5],
        "all_streams_terminated": all(r.terminated for _, r in results),
        "unterminated": sum(not r.terminated for _, r in results),
        "empty_answers": sum(1 for r in ok if r.ttft_s is None),
        "wall_s": round(wall, 2),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 3) if wall else None,
        "requests_per_min": round(60 * len(ok) / wall, 2) if wall else None,
        "ttft_s": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "total_s": percentiles([r.total_s for r in ok]),
        "by_protocol": by_protocol,
        "by_length": by_length,
    }


def memory_report(samples: list[dict[str, Any]], warm: dict[str, Any], budget_bytes: int | None,
                  kv_per_token: float | None, max_batch: int | None) -> dict[str, Any]:
    """RSS over the run against what the configuration allows.

    Allowed = RSS after warm-up + the prefix cache's RAM budget + the rows' KV at the
    longest context of the mix (batch buffer and one prefill cache, twice for the copies
    made while rows join or leave). `flat_second_half` compares the second half's peak
    with the first half's: a leak keeps climbing, a bounded cache levels off."""
    rss = [(s["t"], s["rss"]) for s in samples if s.get("rss")]
    mb = 1 << 20
    out: dict[str, Any] = {"samples": len(rss)}
    if not rss:
        return out
    values = [v for _, v in rss]
    half = len(values) // 2
    out.update(
        rss_warm_mb=round((warm.get("rss_bytes") or values[0]) / mb, 1),
        rss_start_mb=round(values[0] / mb, 1), rss_peak_mb=round(max(values) / mb, 1),
        rss_end_mb=round(values[-1] / mb, 1),
        rss_first_half_peak_mb=round(max(values[: max(half, 1)]) / mb, 1),
        rss_second_half_peak_mb=round(max(values[half:]) / mb, 1),
        prefix_ram_peak_mb=round(max((s.get("prefix_ram") or 0) for s in samples) / mb, 1),
        series=[[t, round(v / mb, 1)] for t, v in rss[:: max(1, len(rss) // 60)]],
    )
    if budget_bytes is not None:
        out["prefix_ram_budget_mb"] = round(budget_bytes / mb, 1)
        out["prefix_ram_within_budget"] = all((s.get("prefix_ram") or 0) <= budget_bytes for s in samples)
    if budget_bytes is not None and kv_per_token and max_batch:
        longest = max(w for _, w, _ in LENGTHS) + SHARED_SYSTEM_WORDS + 200
        rows_kv = 2 * (max_batch + 1) * (-(-longest // 256) * 256) * kv_per_token
        # freed buffers MLX may keep for reuse, up to its limit (engine/memory.py size_buffer_cache)
        buffers = max(0, (warm.get("mlx_cache_limit_bytes") or 0) - (warm.get("mlx_cache_bytes") or 0))
        allowed = (warm.get("rss_bytes") or values[0]) + budget_bytes + rows_kv + buffers
        out.update(kv_bytes_per_token=round(kv_per_token), rows_kv_allowance_mb=round(rows_kv / mb, 1),
                   mlx_buffer_cache_allowance_mb=round(buffers / mb, 1),
                   rss_allowed_mb=round(allowed / mb, 1), rss_bounded=max(values) <= allowed)
    return out


async def _warm(base_url: str) -> dict[str, Any]:
    """One request per protocol (lazy set-up out of the way), then the memory at rest."""
    async with httpx.AsyncClient() as client:
        for protocol in PROTOCOLS:
            body = request_body(protocol, "You are brief.", "Say hello.", 8)
            r = await stream_request(client, base_url, protocol, body)
            if not r.ok:
                raise ServeError(f"warm-up {protocol} request failed: {r.error}")
        m = (await client.get(base_url + "/metrics.json", params={"gc": "1"}, timeout=60)).json()["engine"]
    return m


async def run_load(url: str, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    metrics = await _warm(url)
    warm = metrics.get("memory", {})
    pc = metrics.get("prefix_cache", {})
    kv_per_token = pc["ram_bytes"] / pc["published_tokens"] if pc.get("published_tokens") else None
    report: dict[str, Any] = {"kind": "jumpahead.bench.load", "clients": args.clients, "seconds": args.seconds}
    baseline = None
    if args.baseline_seconds:
        baseline = (await _phase(url, 1, args.baseline_seconds, args.seed + 1, args.request_timeout))["summary"]
        report["baseline_one_client"] = baseline
    load = await _phase(url, args.clients, args.seconds, args.seed, args.request_timeout, pid, args.sample_every)
    summary = load["summary"]
    report["load"] = summary
    async with httpx.AsyncClient() as client:
        after = (await client.get(url + "/metrics.json", params={"gc": "1"}, timeout=60)).json()["engine"]
        health = (await client.get(url + "/health", timeout=30)).json()
    budget = pc.get("ram_budget_bytes")
    report["memory"] = memory_report(load["samples"], warm, budget, kv_per_token, health.get("max_batch"))
    report["after"] = {"rows_running": health.get("rows_running"), "rows_waiting": health.get("rows_waiting"),
                       "memory": after.get("memory")}
    if baseline and baseline["tokens_per_s"] and summary["tokens_per_s"] is not None:
        report["ratios_vs_one_client"] = {
            "tokens_per_s": round(summary["tokens_per_s"] / baseline["tokens_per_s"], 3),
            "ttft_p50": _ratio(summary["ttft_s"]["p50"], baseline["ttft_s"]["p50"]),
            "total_p50": _ratio(summary["total_s"]["p50"], baseline["total_s"]["p50"]),
        }
    mem = report["memory"]
    report["ok"] = (summary["errors"] == 0 and summary["all_streams_terminated"] and summary["requests"] > 0
                    and mem.get("rss_bounded", True) and mem.get("prefix_ram_within_budget", True)
                    and report["after"]["rows_running"] == 0)
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    if args.url:
        report = asyncio.run(run_load(args.url.rstrip("/"), args, args.pid))
        report["server"] = {"url": args.url}
    else:
        work = Path(args.work_dir or tempfile.mkdtemp(prefix="jumpahead-load-"))
        work.mkdir(parents=True, exist_ok=True)
        serve_args = ["--max-batch", str(args.max_batch), "--prefix-cache-dir", str(work / "prompt-cache"),
                      "--prefix-cache-ram-gb", str(args.prefix_cache_ram_gb),
                      "--prefix-cache-ssd-gb", str(args.prefix_cache_ssd_gb), "--log-level", "warning"]

        def body(server: ServerProcess) -> dict[str, Any]:
            report = asyncio.run(run_load(server.url, args, server.pid))
            report["server"] = {"args": serve_args, "start_s": round(server.start_s, 1), "log": str(work / "serve.log")}
            return report

        report = on_server("load", serve_args, work / "serve.log", body)
        if report is None:
            return 2
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1
