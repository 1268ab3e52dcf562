"""A live run is recomputable: the runner keeps its raw per-task records (tasks.jsonl)
with the summary, the commit and the machine; `jumpahead write-up` rebuilds the summary
from those records with the current code, keeps them beside the page, and a rebuild
from the page's own copy gives the same files again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jumpahead.app.cli import main
from jumpahead.live.run_records import read_records, summary_of
from jumpahead.live.command import git_commit, machine, write_outputs


def _turn(ms: float, n: int, supplied: int = 0, calls: list | None = None, interventions: list | None = None) -> dict:
    """A turn shaped as live/agent.py records it, with the trace's timings joined (live/command.py)."""
    rounds = [[ms, 1, 0]] * (n - supplied) + ([[ms * 1.5, supplied + 1, supplied]] if supplied else [])
    tokens = {"sampled": n - supplied, **({"jump": supplied} if supplied else {})}
    return {"wall_s": 0.3 + ms * len(rounds) / 1000, "finish_reason": "tool_calls" if calls else "stop",
            "prompt_tokens": 400, "completion_tokens": n, "cached_tokens": 380,
            "fill": {"tokens": tokens, "rounds": len(rounds), "propose_ms": 0.5 if supplied else 0.0,
                     "policies": {"interventions": interventions or []}},
            "content": "I will write the file.", "calls": calls or [],
            "timings": {"queue_s": 0.0, "prefill_s": 0.2, "decode_s": sum(r[0] for r in rounds) / 1000,
                        "total_s": 0.3, "rounds": len(rounds), "round_ms": [[200.0, 1, 0], *rounds]}}


def _records() -> list[dict]:
    write = {"name": "write_file", "arguments": '{"path": "a.txt", "content": "x\\n"}', "error": False,
             "result": "Wrote 1 lines to a.txt.", "truth": "right", "changed": ["a.txt"], "bad_after": []}
    bad = {**write, "truth": "wrong", "bad_after": ["a.txt"]}
    out, job = [], 0
    for seed in (1000000, 1000001, 1000002, 1000003):
        for arm in ("ordinary", "jump"):
            wrong = arm == "jump" and seed == 1000002
            jump = [{"policy": "jump", "boundary": "argument_key", "kind": "jump", "verified": False, "at": 12,
                     "tokens": 8, "emitted": 8, "label": "online write_file", "calls_done": 0}]
            first = _turn(100.0, 30, calls=[write]) if arm == "ordinary" else \
                _turn(100.0, 30, supplied=8, calls=[bad if wrong else write], interventions=jump)
            turns = [first, _turn(100.0, 10)] + ([_turn(100.0, 30, calls=[write]), _turn(100.0, 10)] if wrong else [])
            success = seed != 1000003 or arm == "ordinary"
            out.append({"arm": arm, "seed": seed, "kind": "create_file", "steps": 1, "session": f"live-{arm}-{seed}",
                        "success": success, "status": "answered", "error": None, "final_answer": "Done.",
                        "wall_s": sum(t["wall_s"] for t in turns), "turns": turns, "n_turns": len(turns),
                        "prompt_tokens": 400 * len(turns),
                        "completion_tokens": sum(t["completion_tokens"] for t in turns),
                        "cached_tokens": 380 * len(turns), "truth_outcome": "repaired" if wrong else None,
                        "longest_repeat": 1, "job": job})
            job += 1
    return out


def _run_info() -> dict:
    return {"tasks_per_arm": 4, "seeds": [1000000, 1000001, 1000002, 1000003], "kinds": None, "adapter": None,
            "model": None, "concurrency": 1, "arms": {}, "agent": None,
            "command": "jumpahead live --tasks 4 --arms ordinary,jump --out OUT", "command_source": "command line",
            "served": None, "served_by_arm": {}, "machine": machine(), **git_commit(), "records": "tasks.jsonl",
            "finished_utc": "2026-12-06 00:00:00", "wall_s": 12.5}


def test_the_run_records_its_commit_and_machine(tmp_path: Path) -> None:
    info = machine()
    assert info["cpus"] >= 1 and info["platform"] and "cpu_model" in info
    here = git_commit()
    assert here["commit"] is None or len(here["commit"]) == 40
    assert git_commit(tmp_path) == {"commit": None, "dirty": None}  # no git there: null, not a failure


def test_write_up_rebuilds_the_summary_from_the_raw_records(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the figures need matplotlib (the test extra installs it)")
    out = tmp_path / "run"
    records = _records()
    written = write_outputs(out, records, ["ordinary", "jump"], _run_info())
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(written))
    assert read_records(out) == records  # the raw records, kept with the run, in job order
    # the summary is a function of the records: rebuilt, it is the runner's
    assert json.loads(json.dumps(summary_of(read_records(out), on_disk["arms"], on_disk["run"]))) == on_disk
    assert on_disk["per_arm"]["jump"]["recovery"]["wrong"] == 1 and on_disk["comparisons"]["rows"]
    # a summary written by older code: the write-up rebuilds it from the records with the current code
    stale = {k: v for k, v in on_disk.items() if k != "comparisons"}
    stale["per_arm"] = {**on_disk["per_arm"], "jump": {**on_disk["per_arm"]["jump"], "totals": {"D_s": 99.0}}}
    (out / "summary.json").write_text(json.dumps(stale))
    page = tmp_path / "site" / "research.md"
    page.parent.mkdir()
    assert main(["write-up", "--run", str(out), "--out", str(page)]) == 0
    folder = page.parent / "research"
    copy = json.loads((folder / "summary.json").read_text())
    assert copy == on_disk
    assert read_records(folder) == records  # tasks.jsonl.gz beside the page
    assert "## Arm against arm" in page.read_text()
    # and from the page's own folder (its copy and records) the same bytes again
    again = tmp_path / "again" / "research.md"
    again.parent.mkdir()
    assert main(["write-up", "--run", str(folder / "summary.json"), "--out", str(again)]) == 0
    for path in sorted(p for p in folder.iterdir()):
        assert (again.parent / "research" / path.name).read_bytes() == path.read_bytes(), path.name
    assert again.read_text().replace("again", "site") == page.read_text().replace("again", "site")
