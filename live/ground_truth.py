"""Ground truth for a live task's tool calls: what each call did to the workspace,
judged against the state the task's ideal solution leaves, not against the result text.

Before the agent runs, the task's ideal calls are run in a scratch workspace: the files
they leave are the expected state. After each of the agent's calls the workspace is
compared with what it was before the call:

- `right`: every file the call changed now holds its expected content, or a state on
  the way there: one the ideal calls pass through, or for a file the ideal solution
  changes by several edits, the start with any subset of them applied (a long task's
  file is edited a line at a time, in any order);
- `wrong`: it changed a file to anything else (a silent wrong write: its result reports
  no error, only its snippet shows what it wrote), created a file the task does not have, deleted one, or it failed
  (an error result, or a bash command that exited non-zero);
- `harmless`: it changed nothing and did not fail (a read, a listing).

Contents are compared as the task checks compare them (live/world.py `normalize_text`:
trailing spaces and trailing newlines do not count), so ground truth and the task's
check agree on what "the same text" is.

A task with a wrong call is `repaired` when a later call puts every file the wrong
call touched back to its expected content, `not_repaired` when a later call touches
them and leaves one wrong, and `unnoticed` when no later call touches them at all.
("Recovered" is the summary's word for a task whose arm made a wrong supplied call and
still succeeded, live/summary.py: one word, one meaning.) Records written before the
rename say `recovered` / `unrecovered` for repaired / not repaired (`OLD_OUTCOMES`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .sandbox import run_tool, workspace
from .world import Task, normalize_text

MAX_SNAPSHOT_FILES = 512  # the task world's workspaces hold a handful of small files
_EXIT = re.compile(r"\(exit code (-?\d+)\)\s*$")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file below `root`, by relative path."""
    out: dict[str, bytes] = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[path.relative_to(root).as_posix()] = path.read_bytes()
            if len(out) >= MAX_SNAPSHOT_FILES:
                break
    return out


MAX_SUBSET_EDITS = 6  # a file's ideal edits whose every subset counts as on the way


class Expected(dict):
    """The files the ideal solution leaves (path -> bytes), and in `along` the states on
    the way there per path."""

    along: dict[str, set[bytes]]


def expected_state(task: Task) -> Expected:
    """The files the task's ideal solution leaves, with the states on the way (`along`)."""
    along: dict[str, set[bytes]] = {}
    with workspace("jumpahead-truth-") as ws:
        task.setup(ws)
        for name, arguments in task.ideal:
            before = snapshot(ws)
            run_tool(ws, name, dict(arguments))
            after = snapshot(ws)
            for path in changed_paths(before, after):
                if path in after:
                    along.setdefault(path, set()).add(after[path])
        out = Expected(snapshot(ws))
    for path, start in task.files.items():
        edits = [(a["old"], a["new"]) for n, a in task.ideal if n == "edit_file" and a.get("path") == path]
        if not 1 < len(edits) <= MAX_SUBSET_EDITS:
            continue
        for mask in range(1 << len(edits)):
            text = start
            for j, (old, new) in enumerate(edits):
                if mask >> j & 1 and old in text:
                    text = text.replace(old, new, 1)
            along.setdefault(path, set()).add(text.encode())
    out.along = along
    return out


def failed(result: str) -> bool:
    """The call failed: the sandbox's error result, or a command's non-zero exit."""
    if result.startswith("Error"):
        return True
    match = _EXIT.search(result)
    return bool(match and int(match.group(1)) != 0)


def changed_paths(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def same_content(actual: bytes | None, expected: bytes | None) -> bool:
    """Whether a file's content is the expected one, by the task checks' rule (one
    function, world.normalize_text); bytes that are not text compare exactly."""
    if actual is None or expected is None:
        return actual is expected
    try:
        return normalize_text(actual.decode()) == normalize_text(expected.decode())
    except UnicodeDecodeError:
        return actual == expected


def _on_the_way(actual: bytes | None, expected: bytes | None, along: set[bytes]) -> bool:
    return same_content(actual, expected) or any(same_content(actual, state) for state in along)


def label_call(before: dict[str, bytes], after: dict[str, bytes], expected: dict[str, bytes],
               result: str) -> dict[str, Any]:
    """The call's `truth` (right | wrong | harmless), the paths it `changed`, and those of
    them neither at their expected content nor on the way to it after it (`bad_after`)."""
    changed = changed_paths(before, after)
    along = getattr(expected, "along", {})
    bad = [p for p in changed if not _on_the_way(after.get(p), expected.get(p), along.get(p, set()))]
    truth = "wrong" if failed(result) or bad else ("right" if changed else "harmless")
    return {"truth": truth, "changed": changed, "bad_after": bad}


def task_outcome(calls: list[dict[str, Any]]) -> str | None:
    """None without a wrong call. Else, for the files the wrong calls changed:
    `unnoticed` where no later call touches them, `repaired` where each one's last
    change left it at its expected content, `not_repaired` otherwise. A wrong call that
    changed nothing (it failed, and its result said so) is `repaired` when a later call
    is right, else `not_repaired`."""
    wrong_at = [i for i, c in enumerate(calls) if c.get("truth") == "wrong"]
    if not wrong_at:
        return None
    touched = {p for i in wrong_at for p in calls[i].get("changed", [])}
    later = calls[wrong_at[0] + 1:]
    if not touched:
        return "repaired" if any(c.get("truth") == "right" for c in later) else "not_repaired"
    if not any(set(c.get("changed", [])) & touched for c in later):
        return "unnoticed"
    last_ok: dict[str, bool] = {}
    for c in calls:
        for path in c.get("changed", []):
            last_ok[path] = path not in c.get("bad_after", [])
    return "repaired" if all(last_ok.get(p, False) for p in touched) else "not_repaired"


OUTCOMES = ("repaired", "not_repaired", "unnoticed")
OLD_OUTCOMES = {"recovered": "repaired", "unrecovered": "not_repaired"}  # records before the rename


def outcome_of(record: dict[str, Any]) -> str | None:
    """A task record's ground-truth outcome, in today's words whatever code wrote it."""
    value = record.get("truth_outcome")
    return OLD_OUTCOMES.get(value, value) if isinstance(value, str) else None


LOOP_REPEATS = 3  # the same call this many times in a row is a loop


def longest_repeat(calls: list[dict[str, Any]]) -> int:
    """The longest run of consecutive calls with the same name and arguments (0 without
    calls): a model repeating a call whose result it already has is stuck."""
    best = run = 0
    prev: tuple[Any, Any] | None = None
    for c in calls:
        key = (c.get("name"), c.get("arguments"))
        run = run + 1 if key == prev else 1
        prev, best = key, max(best, run)
    return best

