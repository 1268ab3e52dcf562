"""Forced replay of every public session (../shared/traces/public) on the real model.

One turn of each session (every file, every session in it: Claude Code's file holds a
sub-agent's too) under ordinary, strict and echo, tail-windowed to 1024 prompt
tokens (3072 where the last turn's own context needs it). The oracle is the record: every arm must emit exactly the recorded output's
ids on every replayed turn (replay compares the token lists), with ordinary one
sampled token per decode round, the same tokens counted by kind in each arm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.traces.arms import parse_arms
from jumpahead.traces.formats import load_sessions
from jumpahead.traces.replay import ReplayOptions, replay

from .conftest import shared_path

WINDOW = 1024  # prompt tokens of each session's tail window
MAX_OUTPUT = 200  # turns with longer recorded outputs are skipped (OpenHands' shorter one is 164)
# A window never starts at a tool result. OpenHands' last turn follows a 1.2k-token
# answer and its 1.2k-token result: 1024 cannot hold them.
WIDER = {"openhands/basic.json": 3072}
# The last turn of Claude Code's sub-agent follows a 9k-token tool result, more than
# this model's whole 8k window: it is skipped with that reason, and the turn before it
# is replayed instead.
SUBAGENT = "258c7280-ae70-4798-800f-63464d01a85d/agent-a881341"


@pytest.mark.slow  # six sessions x three arms, each arm's first window prefilled cold (~5 min quiet)
@pytest.mark.timeout(2700)  # a busy shared machine takes 20+ min (BENCHMARKS.md, issue 10)
def test_one_turn_of_every_public_session_replays_identically(loaded_model):
    root = shared_path("traces", "public")
    files = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file() and p.name != "SOURCES.md")
    assert len(files) >= 5, files
    plans = [(s, WIDER.get(f, WINDOW), 2 if s.id == SUBAGENT else 1) for f in files for s in load_sessions(root / f)]
    assert len(plans) > len(files) and SUBAGENT in [s.id for s, _, _ in plans]  # Claude Code's file holds two
    arms = parse_arms("ordinary,strict,echo")
    reports = {}
    for key in sorted({(limit, turns) for _, limit, turns in plans}):  # one replay per window size and turn count
        group = [s for s, limit, turns in plans if (limit, turns) == key]
        options = ReplayOptions(arms, turns=key[1], max_context=key[0], max_output_tokens=MAX_OUTPUT)
        warnings: list[str] = []
        doc = replay(group, options, loaded_model, warn=warnings.append)
        assert warnings == [] and doc["warnings"] == []
        assert [s["id"] for s in doc["sessions"]] == [s.id for s in group]
        reports.update((s["id"], s) for s in doc["sessions"])
    for session, limit, turns in plans:
        out = reports[session.id]
        assert out["turns_total"] == session.turns
        assert out["turns_replayed"] == 1, (session.id, out["skipped"][-3:])
        if turns == 2:
            (skipped,) = out["skipped"]
            assert skipped["index"] > out["turns"][0]["index"] and "does not fit" in skipped["reason"]
        (turn,) = out["turns"]
        assert session.messages[turn["index"]].role == "assistant"
        assert turn["prompt_tokens"] <= limit
        n = turn["output_tokens"]
        for name, arm in turn["arms"].items():
            assert arm["identical"] and not arm["diverged"], (session.id, turn["index"], name)
            assert sum(arm["tokens_by_kind"].values()) == n, (session.id, name)
        assert turn["arms"]["ordinary"]["tokens_by_kind"] == {"sampled": n}
        assert turn["arms"]["ordinary"]["rounds"] == n - 1
        assert set(turn["arms"]["echo"]["tokens_by_kind"]) <= {"sampled", "echo"}
        assert set(turn["arms"]["strict"]["tokens_by_kind"]) <= {"sampled", "strict"}
    # strict fill supplies the template's call scaffold somewhere
    assert sum(s["totals"]["strict"]["tokens_by_kind"].get("strict", 0) for s in reports.values()) > 0
