"""Ground truth for a live task's tool calls: what each call did to the workspace,
judged against the state the task's ideal solution leaves, not against the result text.

Before the agent runs, the task's ideal calls are run in a scratch workspace: the files
they leave are the expected state. After each of the agent's calls the workspace is
compared with what it was before the call:

- `right`: every file the call changed now holds its expected content;
- `wrong`: it changed a file to anything else (a silent wrong write: "Wrote 3 lines"
  says nothing), created a file the task does not have, deleted one, or it failed
  (an error result, or a bash command that exited non-zero);
- `harmless`: it changed nothing and did not fail (a read, a listing).

A task with a wrong call is `recovered` when a later call puts every file the wrong
call touched back to its expected content, and `unnoticed` when no later call touches
them at all.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .sandbox import run_tool, workspace
from .world import Task

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


def expected_state(task: Task) -> dict[str, bytes]:
    """The files the task's ideal solution leaves."""
    with workspace("jumpahead-truth-") as ws:
        task.setup(ws)
        for name, arguments in task.ideal:
            run_tool(ws, name, dict(arguments))
        return snapshot(ws)


def failed(result: str) -> bool:
    """The call failed: the sandbox's error result, or a command's non-zero exit."""
    if result.startswith("Error"):
        return True
    match = _EXIT.search(result)
    return bool(match and int(match.group(1)) != 0)


def changed_paths(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def label_call(before: dict[str, bytes], after: dict[str, bytes], expected: dict[str, bytes],
               result: str) -> dict[str, Any]:
    """The call's `truth` (right | wrong | harmless), the paths it `changed`, and those of
    them not at their expected content after it (`bad_after`)."""
    changed = changed_paths(before, after)
    bad = [p for p in changed if after.get(p) != expected.get(p)]
    truth = "wrong" if failed(result) or bad else ("right" if changed else "harmless")
    return {"truth": truth, "changed": changed, "bad_after": bad}


def task_outcome(calls: list[dict[str, Any]]) -> str | None:
    """None without a wrong call. Else, for the files the wrong calls changed:
    `unnoticed` where no later call touches them, `recovered` where each one's last
    change left it at its expected content, `unrecovered` otherwise. A wrong call that
    changed nothing (it failed, and its result said so) is `recovered` when a later call
    is right, else `unrecovered`."""
    wrong_at = [i for i, c in enumerate(calls) if c.get("truth") == "wrong"]
    if not wrong_at:
        return None
    touched = {p for i in wrong_at for p in calls[i].get("changed", [])}
    later = calls[wrong_at[0] + 1:]
    if not touched:
        return "recovered" if any(c.get("truth") == "right" for c in later) else "unrecovered"
    if not any(set(c.get("changed", [])) & touched for c in later):
        return "unnoticed"
    last_ok: dict[str, bool] = {}
    for c in calls:
        for path in c.get("changed", []):
            last_ok[path] = path not in c.get("bad_after", [])
    return "recovered" if all(last_ok.get(p, False) for p in touched) else "unrecovered"
