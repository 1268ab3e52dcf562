"""Ground truth for live tool calls: each call judged by its effect on a real sandbox
workspace against the state the task's ideal solution leaves, not by its result text."""

from __future__ import annotations

from pathlib import Path

import pytest

from jumpahead.live.ground_truth import expected_state, label_call, snapshot, task_outcome
from jumpahead.live.sandbox import run_tool, workspace
from jumpahead.live.summary import summarize
from jumpahead.live.world import KINDS, make_task


def _run(ws: Path, expected: dict[str, bytes], name: str, arguments: dict) -> dict:
    before = snapshot(ws)
    result = run_tool(ws, name, arguments)
    return {"name": name, "result": result, **label_call(before, snapshot(ws), expected, result)}


@pytest.mark.parametrize("kind", KINDS)
def test_the_ideal_solution_of_every_kind_is_right_or_harmless(kind: str) -> None:
    for seed in (3, 11):
        task = make_task(seed, kind)
        expected = expected_state(task)
        with workspace() as ws:
            task.setup(ws)
            calls = [_run(ws, expected, name, dict(args)) for name, args in task.ideal]
            assert task.check(ws, task.answer), (kind, seed)
        assert {c["truth"] for c in calls} <= {"right", "harmless"}, calls
        assert any(c["truth"] == "right" for c in calls) or kind == "run_command", calls
        assert task_outcome(calls) is None


def _write_task():
    task = make_task(0, "create_file")
    ((name, args),) = task.ideal
    assert name == "write_file"
    return task, args


def test_a_silent_wrong_write_is_wrong_and_a_later_fix_recovers_it() -> None:
    task, args = _write_task()
    expected = expected_state(task)
    with workspace() as ws:
        task.setup(ws)
        bad = _run(ws, expected, "write_file", {**args, "content": args["content"] + "oops\n"})
        assert not bad["result"].startswith("Error") and bad["result"].startswith("The file")  # no error: only the snippet shows it
        assert bad["truth"] == "wrong" and bad["changed"] == [args["path"]] == bad["bad_after"]
        read = _run(ws, expected, "read_file", {"path": args["path"]})
        assert read["truth"] == "harmless"
        assert task_outcome([bad, read]) == "unnoticed"
        fix = _run(ws, expected, "write_file", dict(args))
        assert fix["truth"] == "right"
        assert task_outcome([bad, read, fix]) == "repaired"
        worse = _run(ws, expected, "write_file", {**args, "content": "x"})
        assert task_outcome([bad, read, fix, worse]) == "not_repaired"


def test_a_stray_file_a_deletion_and_a_failing_command_are_wrong() -> None:
    task, args = _write_task()
    expected = expected_state(task)
    with workspace() as ws:
        task.setup(ws)
        stray = _run(ws, expected, "write_file", {"path": "stray.txt", "content": "x"})
        assert stray["truth"] == "wrong" and stray["changed"] == ["stray.txt"]
        gone = _run(ws, expected, "bash", {"command": "rm stray.txt"})
        assert gone["truth"] == "right"  # back to the expected state (no stray.txt)
        exit1 = _run(ws, expected, "bash", {"command": "ls no-such-file"})
        assert "(exit code" in exit1["result"] and exit1["truth"] == "wrong" and exit1["changed"] == []
        listing = _run(ws, expected, "bash", {"command": "ls"})
        assert listing["truth"] == "harmless"
        assert task_outcome([exit1, listing]) == "not_repaired"
        assert task_outcome([exit1, listing, _run(ws, expected, "write_file", dict(args))]) == "repaired"


def test_a_jump_into_a_silently_wrong_write_counts_as_wrong_in_the_summary() -> None:
    """The turn's call reported no error; its ground truth says wrong, so the jump is."""
    jump = [{"boundary": "tool_name", "tokens": 10, "label": "online write_file"}]
    fill = {"tokens": {"sampled": 2, "jump": 9}, "propose_ms": 0.0, "policies": {"interventions": jump}}
    turn = {"wall_s": 1.0, "completion_tokens": 11, "fill": fill,
            "timings": {"prefill_s": 0.1, "decode_s": 0.2, "rounds": 2, "round_ms": [[100.0, 1], [200.0, 10]]},
            "calls": [{"name": "write_file", "error": False, "truth": "wrong", "changed": ["a.txt"],
                       "bad_after": ["a.txt"]}]}
    plain = {"wall_s": 1.0, "completion_tokens": 2, "fill": {"tokens": {"sampled": 2}},
             "timings": {"prefill_s": 0.1, "decode_s": 0.2, "rounds": 3, "round_ms": [[100.0, 1], [100.0, 1], [100.0, 1]]},
             "calls": []}
    records = [{"arm": "ordinary", "seed": 1, "success": True, "status": "answered", "wall_s": 1.0, "turns": [plain]},
               {"arm": "j", "seed": 1, "success": False, "status": "answered", "wall_s": 1.0, "turns": [turn],
                "truth_outcome": "unnoticed"}]
    s = summarize(records, ["ordinary", "j"])["per_arm"]["j"]
    assert s["recovery"]["wrong"] == 1 and s["recovery"]["unrecovered_tasks"] == 1
    assert s["ground_truth"] == {"calls": {"right": 0, "harmless": 0, "wrong": 1},
                                 "tasks": {"repaired": 0, "not_repaired": 0, "unnoticed": 1}, "looped_tasks": 0}
    # a record written before the rename reads in today's words
    old = [records[0], {**records[1], "truth_outcome": "recovered"}]
    assert summarize(old, ["ordinary", "j"])["per_arm"]["j"]["ground_truth"]["tasks"]["repaired"] == 1


def test_a_repeated_call_is_a_loop() -> None:
    """The same call three times in a row (seen live: a long task's write repeated until
    the step limit) is a loop; the same call with other calls between, or twice, is not."""
    from jumpahead.live.ground_truth import longest_repeat

    w = {"name": "write_file", "arguments": '{"path":"a.py","content":"x"}'}
    r = {"name": "read_file", "arguments": '{"path":"a.py"}'}
    assert longest_repeat([]) == 0 and longest_repeat([w, r, w, r, w]) == 1 and longest_repeat([r, w, w]) == 2
    assert longest_repeat([r, w, w, w, r]) == 3
    other = {**w, "arguments": '{"path":"a.py","content":"y"}'}
    assert longest_repeat([w, other, w]) == 1
    looped = {"wall_s": 1.0, "completion_tokens": 3, "fill": {"tokens": {"sampled": 3}}, "calls": [w, w, w]}
    fine = {**looped, "calls": [w, r, w]}
    records = [{"arm": "ordinary", "seed": s, "success": False, "status": "step_limit", "wall_s": 1.0, "turns": [t]}
               for s, t in ((1, looped), (2, fine))]
    assert summarize(records, ["ordinary"])["per_arm"]["ordinary"]["ground_truth"]["looped_tasks"] == 1
