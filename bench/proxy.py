"""`jumpahead bench proxy`: what upstream mode costs and what affinity buys.

1. Added latency of the pass-through: the same chat request straight to an upstream and
   through a front in upstream mode (`jumpahead serve --upstream`, its own process),
   interleaved pair by pair, streaming and not; time
   to the first byte of the answer (streams: the first content event) and total. The
   figure is the median of the paired differences (front - direct). Twice: against the
   model upstream, and against a null upstream (bench/null_upstream.py: answers at once,
   no model) that isolates the front's own cost from the cores a model upstream on the
   same machine takes from it (`--skip-null` leaves that arm out).
2. Prefix-cache hit rate of multi-turn sessions replayed through a front over two
   replicas, with affinity vs round-robin routing (each arm on its own sessions, so one
   arm's cache entries never serve the other): cached / prompt tokens as the upstreams
   report them, over the turns after each session's first.

Upstreams: two `jumpahead serve` processes started here (default model), or
`--upstream URL` twice for running ones. Prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx

from jumpahead.live.server_process import ServerProcess, cpu_s_of


def _wait(url: str, timeout: float) -> None:
    """Until a running upstream answers /health."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the upstream at {url} did not come up")


@contextlib.contextmanager
def _upstreams(urls: list[str], max_batch: int) -> Iterator[list[str]]:
    if urls:
        for u in urls:
            _wait(u.removesuffix("/v1"), 30)
        yield urls
        return
    with tempfile.TemporaryDirectory(prefix="jumpahead-bench-proxy-") as tmp:
        servers: list[ServerProcess] = []
        try:
            for k in range(2):
                servers.append(ServerProcess(
                    ["--max-batch", str(max_batch), "--no-ssd-cache", "--prefix-cache-dir",
                     os.path.join(tmp, f"cache{k}"), "--log-level", "warning"],
                    os.path.join(tmp, f"upstream{k}.log"), start_timeout=600, wait=False))
            for server in servers:
                server.wait_healthy(600)
            yield [server.url for server in servers]
        finally:
            for server in servers:
                server.stop()


@contextlib.contextmanager
def _null_upstream() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="jumpahead-bench-null-") as tmp:
        server = ServerProcess([], os.path.join(tmp, "null.log"), start_timeout=120,
                               command=[sys.executable, "-m", "jumpahead.bench.null_upstream"])
        try:
            yield server.url
        finally:
            server.stop()


@contextlib.contextmanager
def _front(urls: list[str], routing: str) -> Iterator[ServerProcess]:
    """A front as users run it: `jumpahead serve --upstream URL ...` in its own process
    (in the bench's process it would share the GIL with the timing client and be
    charged for the client's work)."""
    with tempfile.TemporaryDirectory(prefix="jumpahead-bench-front-") as tmp:
        args = [a for u in urls for a in ("--upstream", u)]
        front = ServerProcess([*args, "--upstream-routing", routing, "--log-level", "warning"],
                              os.path.join(tmp, "front.log"), start_timeout=600)
        try:
            yield front
        finally:
            front.stop()


def _timed(client: httpx.Client, base: str, body: dict[str, Any]) -> tuple[float, float]:
    """(seconds to the first byte of the answer, total); a stream's first byte is its
    first content delta."""
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base} answered {r.status_code}: {r.read()[:300]!r}")
        if body.get("stream"):
            for line in r.iter_lines():
                if first is None and line.startswith("data:") and '"content"' in line:
                    first = time.perf_counter()
        else:
            for _ in r.iter_bytes():
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - t0, end - t0


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def latency(direct: str, front_server: ServerProcess, repeats: int, max_tokens: int) -> dict[str, Any]:
    """Paired latencies, and the front's CPU per request (user + system seconds of its
    process over the measured requests: what the pass-through costs, which load from
    other processes on the machine does not inflate the way it does wall time)."""
    out: dict[str, Any] = {}
    front = front_server.url
    messages = [{"role": "user", "content": "Say hi."}]
    with httpx.Client(timeout=600) as client:
        for stream in (False, True):
            body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
            _timed(client, direct, body), _timed(client, front, body)  # warm: prefix cache, connections
            rows: dict[str, list[float]] = {k: [] for k in ("direct_ttfb", "front_ttfb", "direct_total", "front_total")}
            cpu0 = cpu_s_of(front_server.pid)
            for i in range(repeats):
                order = [("direct", direct), ("front", front)] if i % 2 == 0 else [("front", front), ("direct", direct)]
                for name, base in order:
                    ttfb, total = _timed(client, base, body)
                    rows[f"{name}_ttfb"].append(ttfb)
                    rows[f"{name}_total"].append(total)
            cpu1 = cpu_s_of(front_server.pid)
            key = "stream" if stream else "non_stream"
            out[key] = {
                "front_cpu_ms_per_request": round((cpu1 - cpu0) * 1000 / repeats, 3)
                if cpu0 is not None and cpu1 is not None else None,
                **{f"{k}_median_ms": _median_ms(v) for k, v in rows.items()},
                "added_ttfb_median_ms": _median_ms([f - d for f, d in zip(rows["front_ttfb"], rows["direct_ttfb"])]),
                "added_total_median_ms": _median_ms([f - d for f, d in zip(rows["front_total"], rows["direct_total"])]),
                "ratio_total": round(statistics.median(rows["front_total"]) / statistics.median(rows["direct_total"]), 4),
                "pairs": repeats,
            }
    return out


def _session_turns(tag: str, turns: int) -> list[list[dict[str, Any]]]:
    """A growing agent-like conversation: each turn adds a tool call and its result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a coding agent ({tag}). Work step by step."},
        {"role": "user", "content": f"Session {tag}: find why tests/test_schema.py fails."}]
    out = []
    for k in range(turns):
        out.append([dict(m) for m in messages])
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps(
                {"command": f"sed -n {k * 40},{k * 40 + 40}p src/schema.py"})}}]})
        lines = "\n".join(f"{k * 40 + i}: value_{tag}_{k}_{i} = compute({i}, {k})" for i in range(40))
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": lines})
    return out


def affinity(upstreams: list[str], sessions: int, turns: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    stamp = str(time.time_ns())
    for routing in ("affinity", "round-robin"):
        prompt = cached = 0
        with _front(upstreams, routing) as front_server, httpx.Client(timeout=600) as client:
            front = front_server.url
            convs = {f"{routing}-{stamp}-{s}": _session_turns(f"{routing}-{stamp}-{s}", turns) for s in range(sessions)}
            for k in range(turns):  # sessions interleaved turn by turn, as concurrent agents would be
                for sid, conv in convs.items():
                    r = client.post(f"{front}/v1/chat/completions", headers={"x-session-id": sid}, json={
                        "model": "m", "messages": conv[k], "tools": tools, "max_tokens": 1, "temperature": 0})
                    if r.status_code != 200:
                        raise RuntimeError(f"front answered {r.status_code}: {r.text[:300]}")
                    if k == 0:
                        continue  # a session's first turn is cold under any routing
                    usage = r.json()["usage"]
                    prompt += usage["prompt_tokens"]
                    cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            replicas = client.get(f"{front}/metrics.json").json()["engine"]["upstream"]["replicas"]
        out[routing] = {"prompt_tokens": prompt, "cached_tokens": cached,
                        "hit_rate": round(cached / prompt, 4) if prompt else None,
                        "requests_by_replica": [r["requests"] for r in replicas]}
    a, rr = out["affinity"]["hit_rate"], out["round-robin"]["hit_rate"]
    out["hit_rate_ratio"] = round(a / rr, 3) if a and rr else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jumpahead bench proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", action="append", default=[], metavar="URL",
                        help="a running upstream (twice for the affinity arm); default: start two jumpahead serve")
    parser.add_argument("--repeats", type=int, default=30, help="latency pairs per mode (default: 30)")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens per latency request (default: 4)")
    parser.add_argument("--sessions", type=int, default=3,
                        help="sessions in the affinity arm, interleaved turn by turn (default: 3; an odd number, "
                             "else round-robin over two replicas pins each session by accident)")
    parser.add_argument("--turns", type=int, default=5, help="turns per session (default: 5)")
    parser.add_argument("--max-batch", type=int, default=4, help="--max-batch of the started upstreams")
    parser.add_argument("--skip-affinity", action="store_true", help="only the latency arm")
    parser.add_argument("--skip-null", action="store_true", help="no latency arm against the null upstream")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the JSON here")
    args = parser.parse_args(argv)
    if len(args.upstream) == 1 and not args.skip_affinity:
        print("jumpahead bench proxy: the affinity arm needs two --upstream (or none, or --skip-affinity)",
              file=sys.stderr)
        return 2

    result: dict[str, Any] = {"bench": "proxy"}
    try:
        with _upstreams([u.removesuffix("/").removesuffix("/v1") for u in args.upstream], args.max_batch) as ups:
            result["upstreams"] = ups
            with _front(ups[:1], "affinity") as front:
                result["latency"] = latency(ups[0], front, args.repeats, args.max_tokens)
            print(json.dumps({"latency": result["latency"]}), file=sys.stderr)  # a partial result, in case
            if not args.skip_null:
                with _null_upstream() as null, _front([null], "affinity") as front:
                    result["latency_null_upstream"] = latency(null, front, args.repeats, args.max_tokens)
                print(json.dumps({"latency_null_upstream": result["latency_null_upstream"]}), file=sys.stderr)
            if not args.skip_affinity:
                result["prefix_cache"] = affinity(ups[:2], args.sessions, args.turns)
    except RuntimeError as exc:  # an upstream that is not there, or answers errors
        print(f"jumpahead bench proxy: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
