"""`jumpahead bench disconnect`: clients that vanish mid-prefill and mid-stream.

Each client sends a streaming request (any of the three protocols) on a raw socket
and aborts the connection at a random point: long prompts at a random time before
their first token (queued or prefilling), others after a random number of streamed
tokens. Afterwards the server must have retired every row (/health rows running and
waiting 0), hold nothing for them (/metrics?gc=1 memory: no row objects alive, no
batch slots, prefix-cache RAM recounted from its tree equal to its counter and within
budget), not have grown (RSS against the same probe run before the storm), and
answer the next request normally (the same greedy answer as before the storm).
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

from .clients import PROTOCOLS, Vanished, filler, request_body, stream_request, vanish
from jumpahead.live.server_process import exit_on_sigterm, on_server

PROBE = ("You are a careful assistant.", "Name three prime numbers and say why they are prime.")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jumpahead bench disconnect", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100, help="clients that vanish (default 100)")
    p.add_argument("--concurrency", type=int, default=12, help="of them at once (default 12)")
    p.add_argument("--prefill-share", type=float, default=0.5, help="share that leave before their first token")
    p.add_argument("--url", default=None, help="target a running server instead of starting one")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--prefix-cache-ram-gb", type=float, default=0.25)
    p.add_argument("--idle-timeout", type=float, default=600.0, help="seconds the rows may take to retire")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None)
    args = p.parse_args(argv)
    if args.count < 1 or args.concurrency < 1 or not 0 <= args.prefill_share <= 1:
        p.error("--count and --concurrency must be >= 1, --prefill-share in [0, 1]")
    return args


async def _probe(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The same greedy request in each protocol: answers must not change."""
    out = {}
    for protocol in PROTOCOLS:
        r = await stream_request(client, url, protocol, request_body(protocol, *PROBE, max_tokens=16))
        out[protocol] = {"ok": r.ok, "text": r.text, "error": r.error}
    return out


async def _memory(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    return (await client.get(url + "/metrics.json", params={"gc": "1"}, timeout=120)).json()["engine"]["memory"]


async def _idle(client: httpx.AsyncClient, url: str, timeout: float) -> tuple[bool, float, dict[str, Any]]:
    """Wait until no row runs or waits; (idle, seconds waited, last /health)."""
    t0 = time.perf_counter()
    while True:
        health = (await client.get(url + "/health", timeout=60)).json()
        if health.get("rows_running") == 0 and health.get("rows_waiting") == 0:
            return True, time.perf_counter() - t0, health
        if time.perf_counter() - t0 > timeout:
            return False, time.perf_counter() - t0, health
        await asyncio.sleep(0.2)


async def _storm(url: str, args: argparse.Namespace) -> list[Vanished]:
    rng = random.Random(args.seed)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i: int) -> Vanished:
        protocol = PROTOCOLS[i % len(PROTOCOLS)]
        async with gate:
            if rng.random() < args.prefill_share:  # a long prompt, gone before its first token
                body = request_body(protocol, "You read code. " + filler(rng, 120),
                                    f"Client {i}: " + filler(rng, 500), max_tokens=64)
                return await vanish(url, protocol, body, after_s=rng.uniform(0.05, 3.0))
            body = request_body(protocol, "You are brief.", f"Client {i}: " + filler(rng, 30) + " Tell a story.",
                                max_tokens=400, temperature=0.8)
            return await vanish(url, protocol, body, after_tokens=rng.randint(1, 24))

    return list(await asyncio.gather(*(one(i) for i in range(args.count))))


async def run_disconnect(url: str, args: argparse.Namespace, rss: Any = None) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=30)) as client:
        await _probe(client, url)
        before = await _probe(client, url)  # the second time: from the prefix cache, as after the storm
        mem_before = await _memory(client, url)
        rss_before = rss() if rss else mem_before.get("rss_bytes")
        counters_before = (await client.get(url + "/metrics.json", timeout=60)).json()
        t0 = time.perf_counter()
        gone = await _storm(url, args)
        storm_s = time.perf_counter() - t0
        idle, waited, health = await _idle(client, url, args.idle_timeout)
        mem_after = await _memory(client, url)
        counters_after = (await client.get(url + "/metrics.json", timeout=60)).json()
        after = await _probe(client, url)
        mem_final = await _memory(client, url)
        rss_after = rss() if rss else mem_final.get("rss_bytes")
    eng0, eng1 = counters_before["engine"], counters_after["engine"]
    srv0, srv1 = counters_before["server"], counters_after["server"]
    pc = mem_after.get("prefix_cache") or {}
    mb = 1 << 20
    report: dict[str, Any] = {
        "kind": "jumpahead.bench.disconnect",
        "clients": len(gone),
        "left_before_first_token": sum(1 for v in gone if v.tokens_seen == 0 and not v.finished_first),
        "left_mid_stream": sum(1 for v in gone if v.tokens_seen > 0 and not v.finished_first),
        "finished_before_leaving": sum(1 for v in gone if v.finished_first),
        "by_protocol": {p: sum(1 for v in gone if v.protocol == p) for p in PROTOCOLS},
        "storm_s": round(storm_s, 1),
        "server_saw": {"client_disconnects": srv1.get("client_disconnects", 0) - srv0.get("client_disconnects", 0),
                       "rows_cancelled": eng1.get("cancelled", 0) - eng0.get("cancelled", 0),
                       "stream_errors": srv1.get("stream_errors", 0) - srv0.get("stream_errors", 0),
                       "http_5xx": sum(v for k, v in srv1.items() if k.startswith("http_5"))
                       - sum(v for k, v in srv0.items() if k.startswith("http_5"))},
        "rows_retired": idle,
        "retire_wait_s": round(waited, 1),
        "rows_running": health.get("rows_running"),
        "rows_waiting": health.get("rows_waiting"),
        "memory_after": mem_after,
        "leaks": {
            "rows_alive": mem_after.get("rows_alive"),
            "group_rows": mem_after.get("group_rows"),
            "group_kv_bytes": mem_after.get("group_kv_bytes"),
            "prefix_cache_consistent": pc.get("consistent", True),
            "prefix_cache_within_budget": pc.get("ram_bytes", 0) <= pc.get("ram_budget_bytes", 1 << 62),
        },
        "rss_before_mb": round(rss_before / mb, 1) if rss_before else None,
        "rss_after_mb": round(rss_after / mb, 1) if rss_after else None,
        "mlx_active_before_mb": round(mem_before["mlx_active_bytes"] / mb, 1),
        "mlx_active_after_mb": round(mem_final["mlx_active_bytes"] / mb, 1),
        "next_request_ok": all(a["ok"] for a in after.values()),
        "next_request_same_answer": all(after[p]["text"] == before[p]["text"] for p in PROTOCOLS),
        "probe": {p: {"before": before[p]["text"], "after": after[p]["text"], "error": after[p]["error"]}
                  for p in PROTOCOLS},
    }
    leaks = report["leaks"]
    report["ok"] = (idle and leaks["rows_alive"] == 0 and leaks["group_rows"] == 0 and leaks["group_kv_bytes"] == 0
                    and leaks["prefix_cache_consistent"] and leaks["prefix_cache_within_budget"]
                    and report["next_request_ok"] and report["next_request_same_answer"]
                    and report["server_saw"]["http_5xx"] == 0)
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    if args.url:
        report = asyncio.run(run_disconnect(args.url.rstrip("/"), args))
    else:
        work = Path(args.work_dir or tempfile.mkdtemp(prefix="jumpahead-disconnect-"))
        work.mkdir(parents=True, exist_ok=True)
        serve_args = ["--max-batch", str(args.max_batch), "--prefix-cache-dir", str(work / "prompt-cache"),
                      "--prefix-cache-ram-gb", str(args.prefix_cache_ram_gb), "--log-level", "warning"]
        report = on_server("disconnect", serve_args, work / "serve.log",
                           lambda server: asyncio.run(run_disconnect(server.url, args, server.rss)))
        if report is None:
            return 2
        report["server"] = {"args": serve_args, "log": str(work / "serve.log")}
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1
