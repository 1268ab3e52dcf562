"""Hardening: sustained load, clients that vanish, SIGKILL during cache and trace writes.

The fast tests run the load clients, a vanishing client and the memory audit against
the in-process server on the session's engine, and the trace recorder's resume after
a half-written line. The slow group runs the real bench commands (`jumpahead bench
load | disconnect | crash`, each starting real `jumpahead serve` subprocesses) at test
size and prints their figures; the full-size runs (32 clients for 2 minutes, 20 kills
per target) are the same commands with their defaults (README, Reliability).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from jumpahead.bench.clients import PROTOCOLS, filler, percentiles, request_body, stream_request, vanish
from jumpahead.traces.trace_file import read_trace
from tests.serving import serve

REPO = Path(__file__).resolve().parents[1]
SLOW = 1800.0  # seconds a request or a retirement may take on a machine shared by many test runs


async def _stream_all(url: str) -> list:
    async with httpx.AsyncClient() as client:
        return [await stream_request(client, url, p, request_body(p, "You are brief.", "Say hello.", 12), timeout=SLOW)
                for p in PROTOCOLS]


def _memory(url: str) -> dict:
    return httpx.get(url + "/metrics.json", params={"gc": "1"}, timeout=SLOW).json()["engine"]["memory"]


def _wait_idle(url: str, seconds: float = SLOW) -> dict:
    import time

    deadline = time.monotonic() + seconds
    while True:
        health = httpx.get(url + "/health", timeout=SLOW).json()
        if health["rows_running"] == 0 and health["rows_waiting"] == 0:
            return health
        assert time.monotonic() < deadline, f"rows never retired: {health}"
        time.sleep(0.1)


# --- fast: the pieces, on the session's engine ------------------------------------------


def test_stream_clients_see_terminal_events_tokens_and_usage(engine):
    with serve(engine) as url:
        results = asyncio.run(_stream_all(url))
    for r in results:
        assert r.ok and r.terminated and r.error is None, (r.protocol, r.error)
        assert r.output_tokens and r.output_tokens > 0 and r.text
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.total_s


def test_stream_client_reports_an_http_error(engine):
    with serve(engine) as url:
        async def bad() -> object:
            async with httpx.AsyncClient() as client:
                body = request_body("messages", "s", "u", 4)
                body["messages"] = "not a list"  # a 400 in Anthropic's shape, not a stream
                return await stream_request(client, url, "messages", body, timeout=SLOW)

        r = asyncio.run(bad())
    assert not r.ok and r.status == 400 and "HTTP 400" in r.error


def test_vanished_clients_leave_no_rows_slots_or_cache_accounting_behind(engine):
    with serve(engine) as url:
        before = _memory(url)
        prompt = filler(__import__("random").Random(1), 600)

        async def storm() -> list:
            jobs = []
            for i, protocol in enumerate(PROTOCOLS):
                long_body = request_body(protocol, "s", f"{i} " + prompt, 32)
                short_body = request_body(protocol, "s", f"{i} tell a long story", 300, temperature=0.8)
                jobs += [vanish(url, protocol, long_body, after_s=0.05),
                         vanish(url, protocol, short_body, after_tokens=2, timeout=SLOW)]
            return await asyncio.gather(*jobs)

        gone = asyncio.run(storm())
        assert any(v.tokens_seen == 0 for v in gone) and any(v.tokens_seen >= 2 for v in gone)
        _wait_idle(url)
        after = _memory(url)
        assert after["rows_alive"] == 0 and after["group_rows"] == 0 and after["group_kv_bytes"] == 0, after
        pc = after["prefix_cache"]
        assert pc["consistent"] and pc["ram_bytes"] == pc["ram_bytes_recounted"] <= pc["ram_budget_bytes"]
        assert before["rows_alive"] == 0
        # the next request is served normally in every protocol
        assert all(r.ok for r in asyncio.run(_stream_all(url)))


def test_memory_audit_counts_a_row_that_is_still_running(engine):
    """The audit is not a constant: a row in flight shows up, and goes when it ends."""
    with serve(engine) as url:
        async def during() -> tuple[dict, object]:
            async with httpx.AsyncClient() as client:
                task = asyncio.ensure_future(stream_request(
                    client, url, "chat", request_body("chat", "s", "Count to fifty.", 40, temperature=0.8), timeout=SLOW))
                while True:
                    m = (await client.get(url + "/metrics.json", timeout=SLOW)).json()["engine"]["memory"]
                    if m["rows_running"] or task.done():
                        break
                    await asyncio.sleep(0.02)
                return m, await task

        seen, result = asyncio.run(during())
        assert result.ok
        assert seen["rows_alive"] >= 1 and seen["group_rows"] >= 1 and seen["group_kv_bytes"] > 0, seen
        assert _memory(url)["rows_alive"] == 0


def test_percentiles_nearest_rank():
    p = percentiles([float(i) for i in range(1, 101)])
    assert (p["p50"], p["p90"], p["p99"], p["max"], p["n"]) == (50.0, 90.0, 99.0, 100.0, 100)
    assert percentiles([])["p50"] is None


def test_recorder_resumes_after_a_half_written_line(engine, tmp_path):
    from jumpahead.traces.recorder import TraceRecorder

    directory = tmp_path / "traces"
    headers = {"x-session-id": "resume-1"}
    body = {"model": "m", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    with serve(engine, hooks=[TraceRecorder.for_engine(directory, engine)]) as url:
        first = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=SLOW).json()
    path = directory / "resume-1.jsonl"
    with path.open("ab") as fh:  # what a kill inside a write() leaves
        fh.write(b'{"type": "turn", "index": 1, "response": {"content": "half')
    # a restarted server (a new recorder) continues the same file
    with serve(engine, hooks=[TraceRecorder.for_engine(directory, engine)]) as url:
        second = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=SLOW).json()
    header, turns, warnings = read_trace(path)
    contents = [t["response"]["content"] for t in turns]
    assert contents == [first["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]]
    assert header["resumed"][0]["resumed"] is True, "the restart's header stays a line of its own"
    assert len(warnings) == 1 and "half-written" not in warnings[0] and "corrupt line" in warnings[0]


# --- slow: the bench commands on real `jumpahead serve` subprocesses ---------------------


def _bench(kind: str, *args: str, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "bench", kind, *args],
                         capture_output=True, text=True, timeout=timeout, cwd=str(REPO), env=env)
    assert out.stdout.strip(), f"bench {kind} printed nothing (exit {out.returncode}): {out.stderr[-3000:]}"
    report = json.loads(out.stdout)
    print(f"\nbench {kind} {' '.join(args)}:\n" + json.dumps(_figures(report), indent=1))
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return report


def _figures(report: dict) -> dict:
    """The report without its long per-kill and per-sample lists."""
    drop = {"per_kill", "series", "memory_after", "probe", "cold_answers"}
    if isinstance(report, dict):
        return {k: _figures(v) for k, v in report.items() if k not in drop}
    return report


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_load_mixed_protocols_no_errors_every_stream_terminated_memory_bounded(tmp_path):
    r = _bench("load", "--clients", "8", "--seconds", "40", "--baseline-seconds", "10",
               "--work-dir", str(tmp_path), timeout=1500)
    load = r["load"]
    assert load["requests"] >= 8 and load["errors"] == 0, load["error_samples"]
    assert load["all_streams_terminated"] and load["unterminated"] == 0
    assert all(load["by_protocol"][p]["requests"] > 0 for p in PROTOCOLS)
    assert load["ttft_s"]["n"] > 0 and load["total_s"]["p50"] > 0
    mem = r["memory"]
    assert mem["samples"] > 5 and mem["prefix_ram_within_budget"] and mem["rss_bounded"], mem
    assert r["after"]["rows_running"] == 0 and r["after"]["memory"]["rows_alive"] == 0
    assert r["ok"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_hundred_clients_vanish_mid_prefill_and_mid_stream(tmp_path):
    r = _bench("disconnect", "--count", "100", "--concurrency", "12", "--work-dir", str(tmp_path), timeout=1500)
    assert r["clients"] == 100
    assert r["left_before_first_token"] >= 20 and r["left_mid_stream"] >= 20, r
    assert r["server_saw"]["rows_cancelled"] >= 40 and r["server_saw"]["http_5xx"] == 0
    assert r["rows_retired"] and r["rows_running"] == 0 and r["rows_waiting"] == 0
    assert r["leaks"] == {"rows_alive": 0, "group_rows": 0, "group_kv_bytes": 0,
                          "prefix_cache_consistent": True, "prefix_cache_within_budget": True}
    assert r["next_request_ok"] and r["next_request_same_answer"], r["probe"]
    assert r["ok"]


def _crash(target: str, tmp_path) -> tuple[str, dict]:
    """The crash bench's `target` part, killing the server JUMPAHEAD_CRASH_KILLS (5) times: the kills, the report."""
    kills = os.environ.get("JUMPAHEAD_CRASH_KILLS", "5")
    r = _bench("crash", "--target", target, "--kills", kills, "--tear-every", "2", "--work-dir", str(tmp_path),
               timeout=2400)[target]
    return kills, r


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_sigkill_during_ssd_cache_writes(tmp_path):
    kills, r = _crash("ssd", tmp_path)
    assert r["kills"] == int(kills) and r["restarts"] == int(kills) + 1
    assert r["kills_after_a_write_started"] >= 1 and r["kills_mid_write"] >= 1, r["per_kill"]
    assert r["unfinished_writes_left_after_start"] == 0
    assert r["unfinished_writes_removed_at_start"] >= r["kills_mid_write"]
    assert r["torn_files_injected"] >= 1 and r["bad_files_dropped"] >= r["torn_files_injected"]
    assert r["probe_mismatches"] == 0, r["mismatch_samples"]
    assert r["probe_ssd_hit_tokens"] > 0, "the probes never read what an earlier run wrote"
    assert r["ok"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_sigkill_during_trace_writes(tmp_path):
    kills, r = _crash("trace", tmp_path)
    assert r["kills"] == int(kills) and r["completed_turns"] > 0
    assert r["completed_turns_missing"] == 0, r["missing_samples"]
    assert r["import_errors"] == [] and r["other_warnings"] == []
    assert r["lines_skipped_with_warning"] >= r["torn_lines_injected"] >= 1
    assert r["ok"]
