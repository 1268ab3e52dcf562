"""What the bench commands claim: identical outputs are checked from the token lists
(a difference fails the command), and `bench cache`'s SSD arm is a real restart."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jumpahead.bench.output import emit, mismatches
from jumpahead.engine.model.lora import resolve_adapter

from .conftest import shared_path


def test_mismatches_finds_every_false_identity_flag() -> None:
    result = {
        "copy_heavy": {"identical_outputs": True},
        "mixed": {"identical_outputs": False, "ratio": 1.0},
        "same_tokens": {"ram_vs_cold": True, "ssd_vs_cold": False},
        "per_batch": [{"identical_outputs": True}, {"identical_outputs": False}],
        "strict_asserted_vs_constrained": {"identical_outputs": "3/7"},  # a count, not a claim
    }
    assert mismatches(result) == ["mixed.identical_outputs", "same_tokens.ssd_vs_cold",
                                  "per_batch[1].identical_outputs"]
    assert mismatches({"a": {"identical_outputs": True}, "same_tokens": {"x": True}}) == []


def test_emit_fails_loudly_on_a_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert emit({"identical_outputs": True}, str(out)) == 0
    assert json.loads(out.read_text()) == {"identical_outputs": True}
    assert emit({"arm": {"identical_outputs": False}}) == 1
    err = capsys.readouterr().err
    assert "BENCH FAILED" in err and "arm.identical_outputs" in err


@pytest.mark.slow  # three ~2k-token prefills and a second model load
def test_bench_cache_ssd_arm_is_a_new_process(tmp_path: Path) -> None:
    shared_path("traces", "public", "mini-swe-agent")
    out = tmp_path / "cache.json"
    run = subprocess.run([sys.executable, "-m", "jumpahead.bench.cache", "--context", "2100", "--gen", "4",
                          "--restarts", "2", "--out", str(out)], capture_output=True, text=True, timeout=3000,
                         env={**os.environ, "JUMPAHEAD_HOME": str(tmp_path / "home")})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    ssd = result["ssd_hit"]
    assert ssd["new_process"] and ssd["pid"] != result["pid"] and "after a restart" in run.stderr
    assert ssd["cached_tokens"] > 1000 and ssd["bytes_read"] > 0 and len(ssd["ttft_samples_s"]) == 2, ssd
    assert result["same_tokens"] == {"ram_vs_cold": True, "ssd_vs_cold": True}


@pytest.mark.slow  # two upstream servers and three fronts, each a model or tokenizer load
def test_bench_proxy_reports_costs_and_affinity(tmp_path: Path) -> None:
    """`bench proxy` end to end on a few requests: paired latencies and the front's CPU per
    request are reported, and one session's second turn finds its prefix cached on the
    replica affinity pins it to, where round-robin sends it to the cold one."""
    out = tmp_path / "proxy.json"
    run = subprocess.run([sys.executable, "-m", "jumpahead.bench.proxy", "--repeats", "3", "--max-tokens", "2",
                          "--sessions", "1", "--turns", "3", "--out", str(out)],
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    for mode, arm in ((m, a) for m in ("non_stream", "stream") for a in ("latency", "latency_null_upstream")):
        lat = result[arm][mode]
        assert lat["pairs"] == 3 and lat["front_total_median_ms"] > 0 and lat["direct_total_median_ms"] > 0
        assert lat["front_cpu_ms_per_request"] >= 0  # /proc ticks are 10 ms: a few requests may read 0
    cache = result["prefix_cache"]
    assert cache["affinity"]["hit_rate"] > 0.3, cache  # each turn adds ~1k new tokens of tool result
    assert cache["affinity"]["hit_rate"] > (cache["round-robin"]["hit_rate"] or 0), cache
    assert sorted(cache["affinity"]["requests_by_replica"]) == [0, 3], cache


@pytest.mark.slow
def test_bench_drafter_times_the_grouped_two_model_draft(tmp_path: Path) -> None:
    """`bench drafter` in a new process, short: every arm's tokens equal ordinary decoding's
    (the command checks them itself), and the two-model part reports its group sharing
    draft forwards across the batch of 4 (fewer batched forwards than row forwards, where
    every row drafts: the latency objective)."""
    out = tmp_path / "draft.json"
    proc = subprocess.run([sys.executable, "-m", "jumpahead.bench.drafter", "--tokens", "16", "--repeats", "1",
                           "--draft-model", "truncated:4", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["identical_outputs"] is True and doc["mismatches"] == []
    two = doc["two_model"]
    assert two["draft_model"] == "truncated:4" and two["b1_draft"]["proposals"] > 0
    # under the latency objective every row drafts each round: one forward serves several rows
    shared = two["b4_latency_objective"]["group_forwards"]
    assert 0 < shared["forwards"] < shared["row_forwards"]
    assert two["b4_latency_objective"]["draft"]["proposals"] > 0
    # the composition's ablation ran beside it: with it off no round sits out
    comp = doc["copy_heavy_b1"]["composition"]
    assert comp["uncomposed_drafter"]["sat_out"] == 0 and comp["echo_and_drafter_vs_uncomposed"]["wall"]["ratio"] > 0


def test_bench_drafter_refuses_a_bad_draft_model_spec() -> None:
    proc = subprocess.run([sys.executable, "-m", "jumpahead.bench.drafter", "--draft-model", "truncated:x"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "truncated:N needs a positive number" in proc.stderr


@pytest.mark.slow
def test_bench_drafter_agent_turns_with_the_adapters_drafter(tmp_path: Path) -> None:
    """`bench drafter --adapter smol-agent --agent-only` in a new process: held-out agent
    turns of the adapted model, every arm's tokens equal ordinary decoding's (checked by
    the command), and the adapter's own drafter is the one that drafted."""
    out = tmp_path / "agent.json"
    proc = subprocess.run([sys.executable, "-m", "jumpahead.bench.drafter", "--adapter", "smol-agent", "--agent-only",
                           "--tokens", "24", "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["identical_outputs"] is True and doc["mismatches"] == []
    agent = doc["agent_turns"]
    assert agent["drafter"].endswith("smol-agent/drafter") and agent["turns"] == 8 and agent["batches_of_4"] == 2
    assert agent["b1"]["drafter"]["proposals"] > 0 and agent["b4"]["drafter"]["accepted"] > 0
    assert agent["b1"]["default_and_drafter_vs_default"]["wall"]["ratio"] > 0


def test_bench_drafter_agent_turns_refuse_a_missing_adapter_or_drafter(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "jumpahead.bench.drafter", "--agent-only"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "--agent-only needs --adapter" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "jumpahead.bench.drafter", "--adapter", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "adapter_config.json" in proc.stderr
    bare = tmp_path / "bare"
    shutil.copytree(resolve_adapter("smol-agent"), bare, ignore=shutil.ignore_patterns("drafter"))
    proc = subprocess.run([sys.executable, "-m", "jumpahead.bench.drafter", "--adapter", str(bare), "--agent-only"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "has no drafter/ folder" in proc.stderr
