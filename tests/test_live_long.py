"""The live world's long kinds (multi-file features and renames of 14-27 calls): ideal
solutions pass their checks in a real sandbox and partial or wrong ones fail, the ground
truth labels a silent wrong edit, trajectories plan, draft, check and pass, held-out
content is disjoint from training content, and write/edit results show a snippet."""

from __future__ import annotations

import json
import random
import re

import pytest

from jumpahead.live.agent import LONG_TURN_TOKENS, STEP_SLACK, AgentOptions, budget
from jumpahead.live.ground_truth import expected_state, label_call, snapshot
from jumpahead.live.sandbox import SNIPPET_LINES, run_tool, workspace
from jumpahead.live.report import group_table, html_group_table
from jumpahead.live.summary import summarize
from jumpahead.live.trajectories import applicable, build, generate, plan
from jumpahead.live.world import ALL_KINDS, KINDS, LONG_KINDS, VOCAB, make_task, split_of, split_seeds
from jumpahead.policies.jump_sources import blocks_for_path, blocks_in

HELD = split_seeds("heldout", 400)
TRAIN = split_seeds("train", 400)
SEEDS = [*TRAIN[:5], *HELD[:5]]


def _run(task, calls) -> tuple[bool, list[str]]:
    with workspace() as ws:
        task.setup(ws)
        results = [run_tool(ws, name, dict(args)) for name, args in calls]
        return task.check(ws, task.answer), results


def _misspelt(name: str) -> str:
    return name[:-2] + name[-1] + name[-2]


# --- world ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", LONG_KINDS)
def test_ideal_solution_passes_and_noop_fails(kind):
    for seed in SEEDS:
        task = make_task(seed, kind)
        assert 10 <= task.steps == len(task.ideal) <= 30 and task.kind == kind
        ok, results = _run(task, task.ideal)
        assert ok, f"{kind} seed {seed}: the ideal solution fails"
        assert not any(r.startswith("Error") or "(exit code" in r for r in results), (kind, seed, results)
        assert not _run(task, [])[0], f"{kind} seed {seed}: a no-op passes"


@pytest.mark.parametrize("kind", LONG_KINDS)
def test_partial_or_misspelt_solutions_fail(kind):
    for seed in (TRAIN[7], HELD[7]):
        task = make_task(seed, kind)
        rng = random.Random(seed)
        edits = [i for i, (n, _) in enumerate(task.ideal) if n in ("edit_file", "write_file")]
        for i in rng.sample(edits, 3):  # one file change left out
            assert not _run(task, task.ideal[:i] + task.ideal[i + 1:])[0], (kind, seed, task.ideal[i])
        for i in rng.sample(edits, 2):  # one change with a typo in the name it writes
            name, args = task.ideal[i]
            key = "content" if name == "write_file" else "new"
            changed = names_in(args[key], task.names)
            if not changed:
                continue
            bad = {**args, key: args[key].replace(changed[0], _misspelt(changed[0]))}
            assert not _run(task, [*task.ideal[:i], (name, bad), *task.ideal[i + 1:]])[0], (kind, seed, bad)


def names_in(text: str, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if "_" in n and re.search(rf"\b{n}\b", text)]


def test_add_feature_reports_the_test_result():
    task = make_task(TRAIN[3], "add_feature")
    with workspace() as ws:
        task.setup(ws)
        for name, args in task.ideal:
            run_tool(ws, name, args)
        assert task.check(ws, task.answer) and not task.check(ws, "Done.")


def test_ground_truth_labels_a_silent_wrong_edit_wrong():
    for kind in LONG_KINDS:
        task = make_task(HELD[11], kind)
        expected = expected_state(task)
        with workspace() as ws:  # the ideal calls, in order and with a file's edits reversed, are right
            task.setup(ws)
            for name, args in [*task.ideal[:1], *reversed(task.ideal[1:])]:
                before = snapshot(ws)
                result = run_tool(ws, name, dict(args))
                assert label_call(before, snapshot(ws), expected, result)["truth"] in ("right", "harmless") \
                    or name == "bash", (kind, name, args, result)
        i = next(i for i, (n, a) in enumerate(task.ideal) if n == "edit_file" and names_in(a["new"], task.names))
        name, args = task.ideal[i]
        wrong_name = names_in(args["new"], task.names)[0]
        with workspace() as ws:
            task.setup(ws)
            for n, a in task.ideal[:i]:
                run_tool(ws, n, a)
            before = snapshot(ws)
            bad = {**args, "new": args["new"].replace(wrong_name, _misspelt(wrong_name))}
            result = run_tool(ws, name, bad)
            assert result.startswith(f"The file {args['path']} has been updated.")  # no error shown
            label = label_call(before, snapshot(ws), expected, result)
            assert label["truth"] == "wrong" and label["bad_after"] == [args["path"]]
            before = snapshot(ws)
            result = run_tool(ws, name, {"path": args["path"], "old": bad["new"], "new": args["new"]})
            assert label_call(before, snapshot(ws), expected, result)["truth"] == "right"


def test_long_kinds_are_named_not_cycled():
    assert not set(LONG_KINDS) & set(KINDS) and ALL_KINDS == KINDS + LONG_KINDS
    assert {make_task(s).kind for s in range(3 * len(KINDS))} == set(KINDS)
    assert split_of(TRAIN[-1]) == "train" and split_of(HELD[0]) == "heldout"
    a, b = make_task(HELD[5], "rename_symbol"), make_task(HELD[5], "rename_symbol")
    assert (a.prompt, a.files, a.ideal) == (b.prompt, b.files, b.ideal)
    with pytest.raises(ValueError, match="rename_symbol"):
        make_task(0, "no_such_kind")


def test_heldout_content_is_disjoint_from_train_content():
    words = {split: {w for group in vocab.values() for w in group} for split, vocab in VOCAB.items()}
    assert not words["train"] & words["heldout"]
    train_tokens: set[str] = set()
    for kind in LONG_KINDS:
        for seed in TRAIN[:300]:
            task = make_task(seed, kind)
            train_tokens |= set(re.findall(r"\w+", task.prompt + "".join(task.files) + "".join(task.files.values())))
    for kind in LONG_KINDS:
        for seed in HELD[:300]:
            task = make_task(seed, kind)
            assert task.names and not set(task.names) & train_tokens, (kind, seed, set(task.names) & train_tokens)
            assert not {w for n in task.names for w in n.split("_")} & words["train"]


# --- sandbox ----------------------------------------------------------------------------


def test_edit_and_write_results_show_a_numbered_snippet():
    with workspace() as ws:
        text = "".join(f"line {i}\n" for i in range(1, 101))
        wrote = run_tool(ws, "write_file", {"path": "a.txt", "content": text})
        assert wrote.startswith("The file a.txt has been created (100 lines). Here's the result of running "
                                "`cat -n` on a snippet of a.txt:\n     1\tline 1\n")
        assert f"    {SNIPPET_LINES}\tline {SNIPPET_LINES}\n[{100 - SNIPPET_LINES} more lines]" in wrote
        edited = run_tool(ws, "edit_file", {"path": "a.txt", "old": "line 50\n", "new": "fifty\nand a half\n"})
        lines = edited.split("\n")
        assert lines[0] == "The file a.txt has been updated. Here's the result of running `cat -n` on a snippet of a.txt:"
        assert lines[1:] == ["    47\tline 47", "    48\tline 48", "    49\tline 49", "    50\tfifty",
                             "    51\tand a half", "    52\tline 51", "    53\tline 52", "    54\tline 53"]
        assert run_tool(ws, "write_file", {"path": "a.txt", "content": ""}) == \
            "The file a.txt has been overwritten (0 lines). It is empty."
        big = run_tool(ws, "write_file", {"path": "b.txt", "content": "x\n" * 10})
        huge = run_tool(ws, "edit_file", {"path": "b.txt", "old": "x\n" * 10, "new": "y\n" * 200})
        assert big.count("\n") == 10 and huge.count("\n") <= SNIPPET_LINES + 2 and "lines ...]" in huge


# --- trajectories -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", LONG_KINDS)
def test_long_trajectories_plan_draft_check_and_pass(kind):
    seen = set()
    for seed in (TRAIN[0], TRAIN[1], TRAIN[2]):
        task = make_task(seed, kind)
        assert "skip_edit" in applicable(task)
        for variant in applicable(task):
            traj = build(task, variant, seed)  # raises when the finished workspace fails the check
            seen.add(variant)
            turns = [m for m in traj["messages"] if m.get("tool_calls")]
            assert len(turns) >= task.steps
            assert turns[0]["content"].startswith(plan(task)) and "1. " in turns[0]["content"]
            for m in turns:
                call = m["tool_calls"][0]["function"]
                args = json.loads(call["arguments"])
                if call["name"] == "write_file":  # the drafted content, in a block whose lead names its file
                    found = blocks_for_path(blocks_in(m["content"]), args["path"])
                    assert found.block is not None and found.block.text.rstrip("\n") == args["content"].rstrip("\n")
            changes = [i for i, m in enumerate(turns)
                       if m["tool_calls"][0]["function"]["name"] in ("write_file", "edit_file")]
            assert any(m["tool_calls"][0]["function"]["name"] in ("bash", "read_file") for m in turns[changes[-1]:])
    assert {"clean", "skip_edit", "edit_miss"} <= seen


def test_skip_edit_shows_the_failed_check_and_repairs():
    for kind in LONG_KINDS:
        task = make_task(TRAIN[4], kind)
        traj = build(task, "skip_edit", 4)
        msgs = traj["messages"]
        assert len(traj["mistakes"]) == 1 and msgs[traj["mistakes"][0]]["role"] == "assistant"
        repair = next(i for i, m in enumerate(msgs) if "still needs a change" in (m.get("content") or ""))
        check = msgs[repair - 1]["content"]
        assert ("(exit code" in check) if kind == "add_feature" else (check.count("\n") >= 1 and "left" not in check)
        assert "again to check" in msgs[repair + 2]["content"]


def test_generate_draws_long_kinds_by_share():
    seeds = TRAIN[:6]
    assert {t["kind"] for t in generate(seeds[:2])} <= set(KINDS)
    assert {t["kind"] for t in generate(seeds[:2], long_share=1.0)} == set(LONG_KINDS)


# --- agent budget and the summary's kind groups -------------------------------------------


def test_a_long_task_gets_turns_for_its_ideal_calls():
    options = AgentOptions(max_steps=6, max_tokens=256, timeout_s=300.0)
    assert budget(make_task(0, "create_file"), options) == (6, 256, 300.0)
    assert budget(make_task(1, "read_then_edit"), AgentOptions(max_steps=1)) [0] == 1
    long = make_task(TRAIN[0], "rename_symbol")
    turns, tokens, timeout = budget(long, options)
    assert turns == long.steps + STEP_SLACK and tokens == LONG_TURN_TOKENS and timeout == 300.0 * turns / 6


def test_summary_reports_kind_groups_separately():
    def rec(arm, seed, kind, success):
        turns = []
        if (arm, kind) == ("j", "fix_typo"):  # the same call three times in a row: a loop
            call = {"name": "write_file", "arguments": {"path": "a.py", "content": "x"}}
            turns = [{"calls": [call]} for _ in range(3)] + [{"calls": []}]
        return {"arm": arm, "seed": seed, "kind": kind, "success": success, "wall_s": 1.0, "turns": turns,
                "status": "answered" if success else "step_limit"}

    records = [rec(a, s, k, ok) for a in ("ordinary", "j")
               for s, k, ok in ((1, "create_file", True), (2, "fix_typo", False), (3, "add_feature", True))]
    groups = summarize(records, ["ordinary", "j"])["kind_groups"]
    assert set(groups) == {"short", "long"}
    assert groups["short"]["kinds"] == ["create_file", "fix_typo"] and groups["long"]["kinds"] == ["add_feature"]
    short, long = groups["short"]["per_arm"]["j"], groups["long"]["per_arm"]["j"]
    assert (short["tasks"], short["successes"], short["success_rate"]) == (2, 1, 0.5)
    assert (long["tasks"], long["successes"], long["statuses"]) == (1, 1, {"answered": 1})
    assert (short["looped_tasks"], short["turns_per_task"], long["looped_tasks"]) == (1, 2.0, 0)
    assert groups["short"]["per_arm"]["ordinary"]["looped_tasks"] == 0
    summary = summarize(records, ["ordinary", "j"])
    table = group_table(summary)
    assert "| long (add_feature) | j | 1/1 | 0.0 | 0 |" in table
    assert "| short (create_file, fix_typo) | j | 1/2 | 2.0 | 1 |" in table
    page = html_group_table(summary)
    assert "<td>long (add_feature)</td><td>j</td><td>1/1</td>" in page and "looped" in page
    assert html_group_table(summarize(records[:2], ["ordinary", "j"])) == ""
    assert group_table(summarize(records[:2], ["ordinary", "j"])) == ""


def test_every_kind_shows_what_a_write_did():
    """Write and edit results show the changed lines (Claude Code's `cat -n` snippet) for
    every kind, short and long, in the sandbox and in the trajectories; `snippets=False`
    keeps the old one-line text only to reproduce the adapter trained on it."""
    assert all(make_task(s, k).snippets for k in (*KINDS, *LONG_KINDS) for s in range(3))
    with workspace() as ws:
        assert "cat -n" in run_tool(ws, "write_file", {"path": "a.txt", "content": "one two\n"}, True)
        assert run_tool(ws, "write_file", {"path": "b.txt", "content": "x\n"}, False) == "Wrote 1 line to b.txt."
    for kind in ("create_file", "read_then_edit", "add_feature"):
        results = [m["content"] for m in build(make_task(5, kind))["messages"] if m["role"] == "tool"]
        writes = [r for r in results if r.startswith(("Wrote", "Edited", "The file"))]
        assert writes and all("cat -n" in r for r in writes), (kind, writes)
