"""`jumpahead write-up`: the research page from a live run's summary.

- From a real run (conftest.py's `live_run`, shared with tests/test_live_command.py):
  every arm in the results table with its numbers as the JSON has them, SVG figures,
  the run's command stated, and a second build byte-identical to the first.
- The committed docs/research.md is what the generator builds from the committed
  docs/research/summary.json.
- Sentences that compare arms follow the data (the page is not a constant).
- The command line the runner records parses back to the same options.
"""

from __future__ import annotations

import copy
import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from jumpahead.app.cli import build_parser, main
from jumpahead.research import writeup_text as wt
from jumpahead.live.summary import summarize
from jumpahead.research.writeup import COPY_LIMIT, copy_text, render
from jumpahead.research.writeup_figures import FIGURES

ROOT = Path(__file__).resolve().parents[1]


def _row(page: str, arm: str) -> list[str]:
    """The cells of the results table's row of `arm` (the first table whose header has 'R s')."""
    table = page.split("## Results", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith(f"| {arm} |")]
    assert rows, f"no row for {arm}"
    return [c.strip() for c in rows[0].strip("|").split("|")]


def _ci(d: dict) -> str:
    return f"{d['mean']:.2f} ({d['lo']:.2f} to {d['hi']:.2f})" if d.get("mean") is not None else "n/a"


@pytest.mark.timeout(400)
def test_write_up_of_a_real_run(live_run, tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the figures need matplotlib (the test extra installs it)")
    out, summary = live_run
    first = tmp_path / "a" / "research.md"
    first.parent.mkdir()
    assert main(["write-up", "--run", str(out), "--out", str(first)]) == 0
    page = first.read_text()
    folder = first.parent / "research"
    copied = json.loads((folder / "summary.json").read_text())
    assert copied == json.loads(json.dumps(summary))  # small: the whole summary, as written
    for arm in summary["arms"]:
        s = summary["per_arm"][arm]
        t, rec = s["totals"], s["recovery"]
        lo, hi = s["success_ci95"]
        assert _row(page, arm) == [
            arm, f"{s['successes']}/{s['tasks']} ({lo:.2f} to {hi:.2f})",
            *(f"{t[k]:.2f}" for k in ("D_s", "P_s", "H_s", "R_s", "net_s")),
            _ci(s["gain_s_per_task"]), _ci(s["tts_s_saved_per_task"]), _ci(s["R_s_per_task"]), _ci(s["net_s_per_task"]),
            f"{t['tasks']} ({s['unsolved_pairs']})", f"{rec['jump_interventions']} ({rec['wrong']})"]
    command = summary["run"]["command"]
    assert command.startswith("jumpahead live ") and f"--out {out}" in command
    # every table and figure states the command that made the run (the arm-against-arm table included)
    assert summary["comparisons"]["rows"]
    assert page.count(f"Run: `{command}`") == 5 + len(FIGURES)
    for name in FIGURES:
        svg = folder / f"{name}.svg"
        assert f"]({folder.name}/{name}.svg)" in page
        assert svg.stat().st_size < 100_000
        root = ET.fromstring(svg.read_bytes())
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert "jumpahead live" in svg.read_text()  # the footer carries the command
    # a second build (through the Python API this time) gives the same bytes
    from jumpahead.research.writeup import build

    second = tmp_path / "b" / "research.md"
    second.parent.mkdir()
    paths = build(out, second)
    assert set(paths) == {"page", "summary", "records", *FIGURES}  # the raw records kept beside the page
    for path in paths.values():
        twin = first.parent / path.relative_to(second.parent)
        assert path.read_bytes() == twin.read_bytes(), path.name
    # and rebuilding from the copy gives the same page again
    third = tmp_path / "c" / "research.md"
    third.parent.mkdir()
    build(folder / "summary.json", third)
    assert third.read_bytes() == first.read_bytes()


def test_committed_write_up_is_what_the_generator_builds() -> None:
    copy_path = ROOT / "docs" / "research" / "summary.json"
    if not copy_path.exists():
        pytest.skip("docs/research/summary.json is not committed yet: the lead's live run and "
                    "`jumpahead write-up --run OUT --out docs/research.md` make it")
    text = copy_path.read_text()
    summary = json.loads(text)
    assert copy_text(summary) == text, "the committed copy is not as the generator writes it"
    page = (ROOT / "docs" / "research.md").read_text()
    assert page == render(summary, "research"), (
        "docs/research.md differs from what research/writeup.py builds from docs/research/summary.json: "
        "run `jumpahead write-up --run docs/research/summary.json --out docs/research.md`")
    for name in FIGURES:
        assert (ROOT / "docs" / "research" / f"{name}.svg").exists(), name


# --- sentences follow the data ------------------------------------------------------------


def _turn(decode_rounds: list[list], completion: int, sampled: int, interventions: list | None = None) -> dict:
    fill = {"tokens": {"sampled": sampled, **({"jump": completion - sampled} if completion > sampled else {})},
            "propose_ms": 1.0, "policies": {"interventions": interventions or []}}
    return {"wall_s": 1.0, "completion_tokens": completion, "fill": fill,
            "timings": {"prefill_s": 0.1, "decode_s": sum(r[0] for r in decode_rounds) / 1000,
                        "rounds": len(decode_rounds) + 1, "round_ms": [[100.0, 1], *decode_rounds]},
            "calls": [{"name": "write_file", "truth": "right"}]}


def _summary() -> dict:
    """A made-up two-arm run: ordinary and a jump arm, four seeds each, all solved."""
    jump = [{"boundary": "tool_name", "tokens": 10, "label": "oracle write_file"}]
    records = []
    for seed in range(4):
        records.append({"arm": "ordinary", "seed": seed, "success": True, "status": "answered", "wall_s": 2.0,
                        "kind": "create_file", "steps": 1, "turns": [_turn([[100.0 + seed, 1]] * 10, 10, 10)]})
        records.append({"arm": "jump", "seed": seed, "success": True, "status": "answered", "wall_s": 1.5,
                        "kind": "create_file", "steps": 1, "turns": [_turn([[150.0, 10]], 10, 1, jump)]})
    summary = summarize(records, ["ordinary", "jump"])
    summary["run"] = {"command": "jumpahead live --tasks 4 --arms ordinary,jump", "command_source": "command line",
                      "tasks_per_arm": 4, "seeds": summary["seeds"]}
    return summary


def test_sentences_that_compare_arms_follow_the_data() -> None:
    base = _summary()
    covers, above, below = (copy.deepcopy(base) for _ in range(3))
    covers["per_arm"]["jump"]["R_s_per_task"] = {"mean": 0.1, "lo": -0.2, "hi": 0.4, "n": 4}
    above["per_arm"]["jump"]["R_s_per_task"] = {"mean": 0.5, "lo": 0.1, "hi": 0.9, "n": 4}
    below["per_arm"]["jump"]["R_s_per_task"] = {"mean": -0.5, "lo": -0.9, "hi": -0.1, "n": 4}
    pages = {name: render(s) for name, s in (("covers", covers), ("above", above), ("below", below))}
    assert "`jump`: R is 0.10 s per task (95% CI -0.20 to 0.40); its CI covers 0: D - P - H explains" \
        in pages["covers"]
    assert "`jump`: R is 0.50 s per task (95% CI 0.10 to 0.90); its CI lies above 0" in pages["above"]
    assert "Recovery cost the most in `jump`" in pages["above"]
    assert "its CI lies below 0: the measured saving exceeds D - P - H by 0.50 s" in pages["below"]
    assert "explains the measured saving" not in pages["above"] + pages["below"]
    assert len(set(pages.values())) == 3

    # success: overlapping Wilson intervals, then the jump arm's interval above the ordinary arm's
    s = copy.deepcopy(base)
    assert "overlap, so this run shows no difference in success" in wt.success_sentence(s, "jump")
    s["per_arm"]["ordinary"]["success_ci95"] = [0.1, 0.4]
    assert "do not overlap: the arm solves more tasks" in wt.success_sentence(s, "jump")

    # saving: a CI that lies below 0 turns "faster" into "slower"
    s = copy.deepcopy(base)
    s["per_arm"]["jump"]["tts_s_saved_per_task"] = {"mean": 0.3, "lo": 0.1, "hi": 0.5, "n": 4}
    assert "is faster to success" in wt.saving_sentence(s, "jump")
    s["per_arm"]["jump"]["tts_s_saved_per_task"] = {"mean": -0.3, "lo": -0.5, "hi": -0.1, "n": 4}
    assert "is slower to success" in wt.saving_sentence(s, "jump")

    # break-even: a wrong-jump rate below the break-even rate with the intervals apart, then
    # below it with the intervals overlapping (no claim), then above it
    s = copy.deepcopy(base)
    s["per_arm"]["jump"]["recovery"].update(wrong=1, wrong_rate=0.25, wrong_rate_ci95=[0.1, 0.3],
                                            breakeven_frequency=0.4, breakeven_ci95=[0.35, 0.5],
                                            cost_per_recovery_s=2.0)
    assert "below the break-even rate 0.400 (0.350 to 0.500)" in wt.breakeven_sentence(s, "jump")
    assert "the jumps save more than their wrong ones cost" in wt.breakeven_sentence(s, "jump")
    s["per_arm"]["jump"]["recovery"].update(wrong_rate_ci95=[0.1, 0.45])
    assert "the intervals overlap: this run does not show" in wt.breakeven_sentence(s, "jump")
    s["per_arm"]["jump"]["recovery"].update(wrong_rate=0.5, wrong_rate_ci95=[0.3, 0.7])
    assert "at or above the break-even rate 0.400" in wt.breakeven_sentence(s, "jump")
    assert wt.breakeven_sentence(s, "ordinary") is None  # no jumps: nothing to compare


def test_a_run_that_cannot_price_rejected_rounds_says_so() -> None:
    old = _summary()  # made-up traces without round_ms' proposal counts, as before that field
    assert old["rejected_rounds_priced"] is False
    assert "could not be priced in P, so their cost is in R" in render(old)
    new = copy.deepcopy(old)
    new["rejected_rounds_priced"] = True
    assert "could not be priced" not in render(new)


def test_a_summary_without_run_details_still_renders() -> None:
    s = _summary()
    del s["run"]
    page = render(s)
    assert "reconstructed: this run's runner did not record its command line" in page
    assert all(f"| {arm} |" in page for arm in s["arms"])


def test_a_run_in_several_passes_names_each_pass_machine_and_commit() -> None:
    s = _summary()
    assert "passes (`--resume`" not in render(s)  # one pass: the run's own commit and machine say it
    s["run"]["passes"] = [{"commit": "a" * 40, "dirty": False, "machine": {"cpu_model": "AMD EPYC"}, "tasks": 40},
                          {"commit": "b" * 40, "dirty": True, "machine": {"cpu_model": "Intel Xeon"}, "tasks": 24}]
    page = render(s)
    assert "run in 2 passes (`--resume`; every seed's arms in one pass)" in page
    assert "pass 0: 40 tasks, AMD EPYC, commit `aaaaaaaaaaaa`" in page
    assert "pass 1: 24 tasks, Intel Xeon, commit `bbbbbbbbbbbb` with uncommitted changes" in page


def test_the_ground_truth_sentence_says_what_its_table_says() -> None:
    """Today's outcome keys (repaired / not_repaired / unnoticed) and the old ones
    (recovered / unrecovered) give the same sentence, with the table's counts."""
    from jumpahead.research.writeup_text import truth_sentence

    def summary(tasks: dict) -> dict:
        gt = {"calls": {"right": 9, "harmless": 1, "wrong": 7}, "tasks": tasks}
        return {"per_arm": {"ordinary": {"ground_truth": {"calls": {"wrong": 3}, "tasks": {}}},
                            "jump": {"ground_truth": gt}}}

    today = truth_sentence(summary({"repaired": 1, "not_repaired": 5, "unnoticed": 10}), "jump")
    assert ("of its 16 tasks with a wrong call, 1 had the files repaired by a later call, 5 not repaired and "
            "10 never noticed") in today and "7 wrong calls (4 more than the ordinary arm's 3)" in today
    assert truth_sentence(summary({"recovered": 1, "unrecovered": 5, "unnoticed": 10}), "jump") == today


def test_a_large_summary_is_copied_without_its_accounts() -> None:
    s = _summary()
    assert json.loads(copy_text(s)) == s  # small: whole
    s["accounts"]["jump"] = s["accounts"]["jump"] * (COPY_LIMIT // 200)
    trimmed = json.loads(copy_text(s))
    assert "accounts" not in trimmed and trimmed["per_arm"] == s["per_arm"]
    assert render(trimmed) == render(s)  # the page never reads the accounts


def test_the_recorded_command_line_parses_back_to_the_same_options(monkeypatch, tmp_path) -> None:
    from jumpahead.live.command import command_line

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    argv = ["live", "--tasks", "3", "--arms", "ordinary,mistaken-jump:rate=0.5,base=oracle", "--adapter",
            "smol-agent", "--seed-split", "train", "--concurrency", "2", "--serve-arg=--max-batch=4",
            "--keep-workspaces", "--out", str(tmp_path / "my run")]
    args = build_parser("live").parse_args(argv)
    text = command_line(args, Path(args.out))
    assert text.startswith("OPENBLAS_NUM_THREADS=1 jumpahead live --tasks 3 --arms ")
    words = shlex.split(text)
    again = build_parser("live").parse_args(words[words.index("jumpahead") + 1:])
    assert vars(again) == vars(args)


def test_a_run_with_long_kinds_reports_them_apart() -> None:
    """Long-kind seeds (live/world.py LONG_KINDS) get their own table on the page (solved
    per group as the summary counts it); a run without them says in its limits that the
    shipped adapter was never trained on them."""
    short = _summary()
    assert "## Short and long task kinds" not in render(short)
    assert "shipped adapter was never trained on them" in render(short)
    records = []
    for seed in range(4):
        kind = "add_feature" if seed % 2 else "create_file"
        for arm, ok in (("ordinary", True), ("jump", seed != 3)):
            records.append({"arm": arm, "seed": seed, "success": ok, "status": "answered" if ok else "step_limit",
                            "wall_s": 2.0, "kind": kind, "steps": 14 if seed % 2 else 1,
                            "turns": [_turn([[100.0, 1]] * 10, 10, 10)]})
    mixed = summarize(records, ["ordinary", "jump"])
    page = render(mixed)
    section = page.split("## Short and long task kinds", 1)[1].split("\n## ", 1)[0]
    assert "| long (add_feature) | jump | 1/2 |" in section and "| short (create_file) | jump | 2/2 |" in section
    assert "shipped adapter was never trained on them" not in page
    long_only = summarize([r for r in records if r["kind"] == "add_feature"], ["ordinary", "jump"])
    assert "| long (add_feature) | ordinary | 2/2 |" in render(long_only)
