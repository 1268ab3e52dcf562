"""Results that show what a call did, `run_command` checked exactly, content split by
seed range, and training trajectories that check their work (issue 40)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from jumpahead.live.sandbox import run_tool, workspace
from jumpahead.live.trajectories import RECOVERY_SHARE, VERIFY_SHARE, applicable, build, generate
from jumpahead.live.world import KINDS, SHORT_VOCAB, WORDS, make_task, normalize_text, reports_output, split_seeds


def _ideal_results(kind: str, seed: int) -> list[tuple[str, dict, str]]:
    task = make_task(seed, kind)
    with workspace() as ws:
        task.setup(ws)
        return [(name, args, run_tool(ws, name, args, task.snippets)) for name, args in task.ideal]


@pytest.mark.parametrize("kind", KINDS)
def test_every_short_kind_shows_what_its_writes_did(kind):
    """A write or an edit answers with its changed lines numbered as by `cat -n` (Claude
    Code's result), so a wrong write is visible in its own result."""
    for seed in (0, 1, 1_000_000):
        assert make_task(seed, kind).snippets
        for name, args, result in _ideal_results(kind, seed):
            if name == "write_file":
                assert result.startswith(f"The file {args['path']} has been created")
                assert "`cat -n`" in result
                for i, line in enumerate(args["content"].rstrip("\n").split("\n"), 1):
                    assert f"{i:6}\t{line}" in result
            elif name == "edit_file":
                assert result.startswith(f"The file {args['path']} has been updated") and "`cat -n`" in result
                assert all(re.search(rf"^ +\d+\t.*{re.escape(line)}", result, re.M) for line in args["new"].split("\n"))


def test_a_wrong_write_and_a_failing_command_show_in_their_results():
    with workspace() as ws:
        wrong = run_tool(ws, "write_file", {"path": "a.txt", "content": "aple\n"})
        assert wrong.endswith("     1\taple")
        assert run_tool(ws, "edit_file", {"path": "a.txt", "old": "aple", "new": "apple"}).endswith("     1\tapple")
        assert run_tool(ws, "edit_file", {"path": "a.txt", "old": "pear", "new": "x"}) == \
            "Error: old text not found in a.txt"
        (ws / "p.py").write_text("print(6 * 7)\nraise SystemExit(3)\n")
        assert run_tool(ws, "bash", {"command": "python3 p.py"}) == "42\n\n(exit code 3)"
        assert run_tool(ws, "bash", {"command": "true"}) == "(no output)"
        # the old bare text stays available, only to reproduce adapters trained on it
        assert run_tool(ws, "write_file", {"path": "b.txt", "content": "x\n"}, False) == "Wrote 1 line to b.txt."


def test_run_command_is_checked_exactly():
    assert reports_output("It prints:\n```\n42\n```", "42")
    assert reports_output("It prints `42`.", "42") and reports_output("The output:\n42  \n", "42")
    assert reports_output("It prints:\n```text\nAPPLE-57\n\n```", "APPLE-57")
    for wrong in ("It prints:\n```\n142\n```", "It prints `421`.", "142", "It prints 42.", "```\n42\n43\n```"):
        assert not reports_output(wrong, "42"), wrong
    task = next(t for t in (make_task(s, "run_command") for s in range(40)) if t.answer.count("\n") == 3)
    output = task.answer.split("```\n")[1].rstrip("\n")
    with workspace() as ws:
        task.setup(ws)
        assert task.check(ws, task.answer)
        assert not task.check(ws, task.answer.replace(output, "1" + output))
        assert not task.check(ws, f"It prints {output}0.")


def test_one_whitespace_rule():
    assert normalize_text("a  \nb\t\n\n") == "a\nb" == normalize_text("a\nb")
    assert normalize_text(" a") != normalize_text("a")  # leading space is content


def _content(task) -> str:
    args = " ".join(str(v) for _, a in task.ideal for v in a.values())
    return " ".join([task.prompt, *task.files.values(), args, task.answer])


def test_held_out_content_never_occurs_in_training_content():
    """Disjoint seeds are not enough: a held-out seed draws its words and numbers from
    other ranges (SHORT_VOCAB), so no held-out line, value or output is trained on."""
    assert not set(SHORT_VOCAB["train"]["words"]) & set(SHORT_VOCAB["heldout"]["words"])
    words = set(WORDS)
    numbered = ("run_command", "read_then_edit")
    seen: dict[str, tuple[set, set, set]] = {}
    for split in ("train", "heldout"):
        tasks = [make_task(s, k) for s in split_seeds(split, 60) for k in KINDS]
        found = {w for t in tasks for w in re.findall(r"[a-z]+", _content(t)) if w in words}
        # the numbers a task is made of (a program's operands, a setting's values); an
        # output computed from other operands may still equal one by arithmetic
        nums = {n for t in tasks if t.kind in numbered for n in re.findall(r"\b\d+\b", "".join(t.files.values()))}
        files = {text for t in tasks for text in t.files.values()}
        seen[split] = found, nums, files
    assert seen["train"][0] and seen["heldout"][0] and not seen["train"][0] & seen["heldout"][0]
    assert not seen["train"][1] & seen["heldout"][1] and not seen["train"][2] & seen["heldout"][2]
    # the trajectories built from training seeds hold no held-out word either
    text = " ".join(m.get("content") or "" for t in generate(split_seeds("train", 80)) for m in t["messages"])
    assert not set(re.findall(r"[a-z]+", text)) & seen["heldout"][0]


def test_trajectories_check_their_work_in_stated_shares():
    trajs = generate(split_seeds("train", 400))
    assert [t["variant"] for t in trajs] == [t["variant"] for t in generate(split_seeds("train", 400))]  # seeded
    counts = Counter("clean" if t["variant"] == "clean" else "verify" if t["variant"] == "verify" else "recovery"
                     for t in trajs)
    n = len(trajs)
    assert abs(counts["recovery"] / n - RECOVERY_SHARE) < 0.07, counts
    assert abs(counts["verify"] / n - VERIFY_SHARE) < 0.07, counts
    assert len({t["variant"] for t in trajs}) >= 8


def test_a_revealed_mistake_is_repaired_from_what_its_result_shows():
    for variant, kind in (("write_typo", "create_file"), ("edit_typo", "replace_line"), ("append_typo", "append_line")):
        task = next(t for t in (make_task(s, kind) for s in range(40)) if variant in applicable(t))
        msgs = build(task, variant, task.seed)["messages"]
        mistake = next(i for i, m in enumerate(msgs) if m.get("tool_calls")
                       and i in build(task, variant, task.seed)["mistakes"])
        shown = msgs[mistake + 1]["content"] if variant != "append_typo" else msgs[mistake + 3]["content"]
        bad = re.search(r"`([^`]+)`", msgs[mistake + (2 if variant != "append_typo" else 4)]["content"]).group(1)
        assert bad in shown, (variant, shown, bad)  # the repair quotes what the result showed
    task = next(t for t in (make_task(s, "copy_function") for s in range(40)))
    msgs = build(task, "verify", task.seed)["messages"]
    run = [m for m in msgs if m["role"] == "tool"][-1]["content"]
    assert re.fullmatch(r"-?\d+\n", run), run  # the copied function ran
