"""`jumpahead replay --repeats N` (traces/repeats.py): the repeats section's arithmetic
on hand-made per-repeat documents, the token check that fails on a doctored repeat,
and a real replay with two repeats on the tiny model (tests/test_replay.py's: the
output is forced, so the weights only set the timings) under the template that shows
earlier reasoning, where compaction edits the context before the last turn."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.turn import Message, ToolCall
from jumpahead.traces.arms import parse_arms
from jumpahead.traces.intervals import bootstrap_mean, sign_flip_p
from jumpahead.traces.repeats import RepeatMismatch, check_tokens, combine, replay_repeated, summarize
from jumpahead.traces.replay import ReplayOptions
from jumpahead.traces.session import Session

# --- hand-made documents -------------------------------------------------------------------------

# Per session: per turn index, per arm (prompt, cached, prefill_s, decode_s, digest).
# `edit` changes its prompt at turn 12 of s1 (first edit 12: later turn 14) and at
# turn 20 of s2 (later turn 22); `same` never does (its prompts are ordinary's).
S1 = {
    10: {"ordinary": (100, 0, 1.0, 2.0, "a"), "edit": (100, 0, 1.1, 2.1, "a"), "same": (100, 0, 1.2, 2.2, "a")},
    12: {"ordinary": (150, 100, 0.5, 3.0, "b"), "edit": (120, 50, 0.7, 2.9, "B"), "same": (150, 100, 0.6, 3.1, "b")},
    14: {"ordinary": (200, 150, 0.5, 4.0, "c"), "edit": (170, 120, 0.4, 3.5, "C"), "same": (200, 150, 0.5, 4.4, "c")},
}
S2 = {
    20: {"ordinary": (300, 0, 3.0, 1.0, "d"), "edit": (250, 0, 2.5, 1.0, "D"), "same": (300, 0, 3.3, 1.1, "d")},
    22: {"ordinary": (350, 300, 0.6, 1.5, "e"), "edit": (300, 200, 1.2, 1.3, "E"), "same": (350, 300, 0.6, 1.6, "e")},
}
SCALE = [1.0, 1.2, 0.9]  # repeat r's seconds are these times the table's


def _entry(prompt: int, cached: int, prefill: float, decode: float, digest: str, scale: float) -> dict[str, Any]:
    p, d = round(prefill * scale, 6), round(decode * scale, 6)
    return {"prompt_tokens": prompt, "cached_tokens": cached, "prefill_s": p, "decode_s": d,
            "model_s": round(p + d, 6), "tokens_by_kind": {"sampled": 5}, "identical": True, "diverged": False,
            "prompt_digest": digest}


def hand_doc(scale: float) -> dict[str, Any]:
    sessions = []
    for sid, table in (("s1", S1), ("s2", S2)):
        turns = [{"index": i, "arms": {a: _entry(*row, scale) for a, row in arms.items()}} for i, arms in table.items()]
        sessions.append({"id": sid, "source": f"{sid}.json", "turns": turns})
    return {"kind": "jumpahead.replay", "arms": ["ordinary", "edit", "same"], "sessions": sessions,
            "warnings": [], "wall_s": 10.0 * scale}


def _values(stat: dict[str, Any]) -> list[Any]:
    return stat["values"]


def test_summary_arithmetic_on_hand_made_repeats():
    docs = [hand_doc(s) for s in SCALE]
    section = summarize(docs)
    assert section["n"] == 3 and section["wall_s"] == [10.0, 12.0, 9.0]
    s1, s2 = section["sessions"]
    assert s1["turns"] == [10, 12, 14] and s1["first_edit"] == {"edit": 12, "same": None}
    assert s2["first_edit"] == {"edit": 20, "same": None}

    def times(table: dict, arm: str, k: int, turns: list[int] | None = None) -> list[float]:
        """Per repeat: the sum of column k (2: prefill, 3: decode) of `arm` over `turns`."""
        return [round(sum(table[t][arm][k] for t in (turns or table)) * s, 6) for s in SCALE]

    e1 = s1["arms"]["edit"]
    # model_s = prefill + decode, each counted once
    assert _values(e1["prefill_s"]) == pytest.approx(times(S1, "edit", 2))
    assert _values(e1["decode_s"]) == pytest.approx(times(S1, "edit", 3))
    assert _values(e1["model_s"]) == pytest.approx([a + b for a, b in zip(times(S1, "edit", 2), times(S1, "edit", 3))])
    assert e1["model_s"]["mean"] == pytest.approx((3.2 + 3.6 + 3.9) * sum(SCALE) / 3, abs=1e-5)
    assert {k: e1["model_s"][k] for k in ("mean", "lo", "hi", "n")} == bootstrap_mean(_values(e1["model_s"]))
    # later decode: the turns after the first edit (14 only), against ordinary's on them
    assert e1["later_turns"] == 1
    assert _values(e1["later_decode_s"]) == pytest.approx(times(S1, "edit", 3, [14]))
    assert _values(e1["later_decode_ordinary_s"]) == pytest.approx(times(S1, "ordinary", 3, [14]))
    d1 = s1["differences"]["edit"]
    assert _values(d1["later_decode_s"]) == pytest.approx([-0.5 * s for s in SCALE])
    assert d1["later_decode_s"]["p"] == sign_flip_p(_values(d1["later_decode_s"])) == 0.25  # 3 repeats: 2/8
    # tokens: exact, a single point
    assert _values(e1["cached_tokens"]) == [170] * 3 and e1["cached_tokens"]["lo"] == e1["cached_tokens"]["hi"] == 170
    assert _values(e1["prefilled_tokens"]) == [(100 - 0) + (120 - 50) + (170 - 120)] * 3
    assert _values(e1["cache_hit_rate"]) == [pytest.approx(170 / 390, abs=1e-6)] * 3
    # reread: prefilled beyond ordinary's on the same turn, never below 0 (turn 12: 70 - 50)
    assert _values(e1["reread_tokens"]) == [20] * 3
    assert _values(d1["reread_tokens"]) == [20] * 3
    assert _values(d1["prefilled_tokens"]) == [220 - 200] * 3
    assert _values(d1["cached_tokens"]) == [170 - 250] * 3
    # the difference is against ordinary, not another arm: `same` minus ordinary
    ds = s1["differences"]["same"]
    assert _values(ds["decode_s"]) == pytest.approx([round((9.7 - 9.0) * s, 6) for s in SCALE], abs=1e-6)
    assert _values(ds["model_s"]) == pytest.approx([round((12.0 - 11.0) * s, 6) for s in SCALE], abs=1e-6)
    assert ds["model_s"]["mean"] == pytest.approx(1.0 * sum(SCALE) / 3, abs=1e-5) and ds["model_s"]["p"] == 0.25
    assert _values(ds["reread_tokens"]) == [0] * 3 and ds["reread_tokens"]["p"] == 1.0
    # an arm that never edits has no later decode (null, not 0)
    assert s1["arms"]["same"]["later_decode_s"]["mean"] is None and ds["later_decode_s"]["p"] is None
    assert "ordinary" not in s1["differences"] and s1["arms"]["ordinary"]["later_decode_s"]["mean"] is None
    # overall: the sessions summed once each
    o = section["overall"]["arms"]["edit"]
    assert _values(o["model_s"]) == pytest.approx([round((10.7 + 6.0) * s, 6) for s in SCALE], abs=1e-5)
    assert _values(o["cached_tokens"]) == [170 + 200] * 3
    assert _values(o["cache_hit_rate"]) == [pytest.approx(370 / (390 + 550), abs=1e-6)] * 3
    assert _values(o["reread_tokens"]) == [20 + 50] * 3  # s2 turn 22: 100 prefilled against 50 (turn 20: 250 against 300 is not a reread)
    assert o["later_turns"] == 2
    assert _values(o["later_decode_s"]) == pytest.approx([(3.5 + 1.3) * s for s in SCALE])
    od = section["overall"]["differences"]["edit"]
    assert _values(od["later_decode_s"]) == pytest.approx([(3.5 + 1.3 - 4.0 - 1.5) * s for s in SCALE])
    assert _values(od["model_s"]) == pytest.approx([round((16.7 - 17.1) * s, 6) for s in SCALE], abs=1e-5)


def test_doctored_repeat_fails_the_token_check():
    docs = [hand_doc(s) for s in SCALE]
    check_tokens(docs)  # seconds differ, tokens do not: fine
    bad = copy.deepcopy(docs)
    bad[2]["sessions"][1]["turns"][1]["arms"]["edit"]["cached_tokens"] = 250
    with pytest.raises(RepeatMismatch, match=r"session s2 turn 22 arm edit: cached_tokens 200 in repeat 1, 250 in "
                                             r"repeat 3"):
        check_tokens(bad)
    options = ReplayOptions(parse_arms("ordinary"))
    with pytest.raises(RepeatMismatch):
        combine(bad, options)
    # a prompt that changed without changing its length, and a turn replayed in one repeat only
    bad = copy.deepcopy(docs)
    bad[1]["sessions"][0]["turns"][2]["arms"]["edit"]["prompt_digest"] = "X"
    with pytest.raises(RepeatMismatch, match="turn 14 arm edit: prompt_digest C in repeat 1, X in repeat 2"):
        check_tokens(bad)
    bad = copy.deepcopy(docs)
    del bad[1]["sessions"][0]["turns"][0]
    with pytest.raises(RepeatMismatch, match="turns replayed"):
        check_tokens(bad)
    # tokens by provenance: checked only for the arms named
    bad = copy.deepcopy(docs)
    bad[1]["sessions"][0]["turns"][0]["arms"]["same"]["tokens_by_kind"] = {"sampled": 3, "echo": 2}
    check_tokens(bad, kinds_for={"ordinary", "edit"})
    with pytest.raises(RepeatMismatch, match="tokens_by_kind"):
        check_tokens(bad, kinds_for={"same"})


# --- a real replay -------------------------------------------------------------------------------

REASON = ("I should look at the next file before changing anything, since the layout is conventional "
          "and every module opens with a short comment and a few small helpers that the tests import. ") * 2
ARM = "compaction:clear_at_least=32,max_chars=80"


def step_session() -> Session:
    """Four read steps with reasoning (~70 tokens each), then a final answer: under the
    template that shows reasoning, compaction commits from the third turn (message 6)
    on, the first step's reasoning being finished, so two turns follow its first edit."""
    msgs = [Message("system", "You are a coding agent."), Message("user", "Read the four files, then say done.")]
    for i in range(4):
        msgs.append(Message("assistant", "", reasoning=f"Step {i}. " + REASON,
                            tool_calls=[ToolCall("bash", {"command": f"cat f{i}.txt"}, f"c{i}")]))
        msgs.append(Message("tool", f"contents of f{i}", tool_call_id=f"c{i}", name="bash"))
    msgs.append(Message("assistant", "Done."))
    return Session(id="steps", format="test", messages=msgs, source="test")


@pytest.mark.timeout(600)
def test_two_repeats_of_a_real_replay(tiny_model):
    from jumpahead.traces.templates import showing_reasoning

    model, tokenizer, info = tiny_model
    options = ReplayOptions(parse_arms(["ordinary", ARM]), turns=4, max_context=1024)
    said: list[str] = []
    doc = replay_repeated([step_session()], options, (model, showing_reasoning(tokenizer), info), 2, say=said.append)
    assert said == ["repeat 1/2", "repeat 2/2"]
    section = doc["repeats"]
    docs = section["documents"]
    assert len(docs) == 2 and section["n"] == 2 and doc["warnings"] == []
    assert doc["sessions"] == docs[0]["sessions"] and "repeats" not in docs[0]
    assert json.loads(json.dumps(doc)) == doc  # plain JSON
    (s,) = section["sessions"]
    assert s["turns"] == [4, 6, 8, 10] and s["first_edit"] == {ARM: 6}
    for r, d in enumerate(docs):
        (report,) = d["sessions"]
        turns = report["turns"]
        # fresh engines and caches each repeat: the first turn hits nothing
        assert all(turns[0]["arms"][a]["cached_tokens"] == 0 for a in d["arms"])
        assert all(e["identical"] and "prompt_digest" in e for t in turns for e in t["arms"].values())
        for arm in d["arms"]:
            totals = report["totals"][arm]
            stats = s["arms"][arm]
            # the section's per-repeat values are this document's totals
            for q in ("model_s", "prefill_s", "decode_s", "cached_tokens", "prefilled_tokens"):
                assert stats[q]["values"][r] == pytest.approx(totals[q], abs=1e-5), (arm, q)
            assert stats["cache_hit_rate"]["values"][r] == pytest.approx(totals["cache_hit_rate"], abs=1e-4)
            assert section["overall"]["arms"][arm]["model_s"]["values"][r] == pytest.approx(totals["model_s"],
                                                                                           abs=1e-5)
        later = [t for t in turns if t["index"] > 6]
        assert s["arms"][ARM]["later_decode_s"]["values"][r] == pytest.approx(
            sum(t["arms"][ARM]["decode_s"] for t in later), abs=1e-5)
        ordinary_later = sum(t["arms"]["ordinary"]["decode_s"] for t in later)
        assert s["differences"][ARM]["later_decode_s"]["values"][r] == pytest.approx(
            s["arms"][ARM]["later_decode_s"]["values"][r] - ordinary_later, abs=1e-5)
        assert s["differences"][ARM]["model_s"]["values"][r] == pytest.approx(
            report["totals"][ARM]["model_s"] - report["totals"]["ordinary"]["model_s"], abs=1e-5)
        # compaction shrinks the prompt from turn 6 on and re-reads what follows its edit point there
        edit_turn = next(t for t in turns if t["index"] == 6)
        assert edit_turn["arms"][ARM]["prompt_tokens"] < edit_turn["arms"]["ordinary"]["prompt_tokens"]
    reread = s["arms"][ARM]["reread_tokens"]
    assert reread["values"][0] == reread["values"][1] > 0 and reread["lo"] == reread["hi"] == reread["mean"]
    assert s["arms"]["ordinary"]["reread_tokens"]["values"] == [0, 0]
    # the token counts agree between the two documents (the check passed)
    a, b = (d["sessions"][0]["totals"][ARM] for d in docs)
    assert (a["prompt_tokens"], a["cached_tokens"]) == (b["prompt_tokens"], b["cached_tokens"])


def test_cli_repeats_and_its_loud_failure(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`jumpahead replay --repeats 2` adds the section; a repeat whose token counts differ
    (doctored here) is an error with exit status 1 and no JSON."""
    import jumpahead.traces.repeats as repeats
    from jumpahead.app import cli

    from .test_replay import _write_session

    path = tmp_path / "session.json"
    _write_session(path)
    args = ["replay", str(path), "--arms", "ordinary", "--turns", "1", "--repeats", "2", "--quiet",
            "--model", str(tiny_model_dir)]
    out = tmp_path / "out.json"
    assert cli.main([*args, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["repeats"]["n"] == 2 and len(doc["repeats"]["documents"]) == 2
    assert doc["repeats"]["sessions"][0]["arms"]["ordinary"]["model_s"]["n"] == 2
    capsys.readouterr()

    real, calls = repeats.replay, []

    def doctored(*a: Any, **k: Any) -> dict[str, Any]:
        doc = real(*a, **k)
        calls.append(doc)
        if len(calls) == 2:
            doc["sessions"][0]["turns"][0]["arms"]["ordinary"]["cached_tokens"] += 1
        return doc

    monkeypatch.setattr(repeats, "replay", doctored)
    bad = tmp_path / "bad.json"
    assert cli.main([*args, "--out", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "ERROR: token counts differ between repeats" in err and "arm ordinary: cached_tokens" in err
    assert not bad.exists()
    with pytest.raises(SystemExit):
        cli.main([*args[:-3], "--repeats", "0"])
    assert cli.main(["replay", str(path), "--live", "--repeats", "2"]) == 2
