"""A live run's raw per-task records, kept with the run, and its summary rebuilt from them.

`jumpahead live` writes every task's record to OUT/tasks.jsonl (live/command.py) and the
summary from exactly those records; `jumpahead write-up` keeps a copy of them beside the
page (tasks.jsonl.gz: gzip without a timestamp, so the same records give the same
bytes) and rebuilds the summary from them with the current code, taking from the
earlier summary only what records cannot say: the run's command, commit and machine.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

TASKS = "tasks.jsonl"
TASKS_GZ = "tasks.jsonl.gz"


def records_text(records: list[dict[str, Any]]) -> str:
    """The records as tasks.jsonl holds them: one JSON object per line, in job order."""
    ordered = sorted(records, key=lambda r: (r.get("job") is None, r.get("job") or 0))
    return "".join(json.dumps(r) + "\n" for r in ordered)


def read_records(folder: Path) -> list[dict[str, Any]] | None:
    """The records kept in `folder` (tasks.jsonl, else tasks.jsonl.gz), in job order;
    None where it keeps none. A line cut by a kill is skipped."""
    plain, packed = folder / TASKS, folder / TASKS_GZ
    if plain.is_file():
        text = plain.read_text()
    elif packed.is_file():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return None
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(out, key=lambda r: (r.get("job") is None, r.get("job") or 0))


def write_records_gz(records: list[dict[str, Any]], path: Path) -> Path:
    """The records gzipped with mtime 0 and no file name: the same records, the same bytes."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as fh:
        fh.write(records_text(records).encode())
    path.write_bytes(buf.getvalue())
    return path


def summary_of(records: list[dict[str, Any]], arms: list[str], run: dict[str, Any] | None) -> dict[str, Any]:
    """The summary of `records` by the current code, with the run's description `run`
    (what the runner recorded: command, commit, machine) attached as the runner does."""
    from .summary import summarize

    summary = summarize(sorted(records, key=lambda r: (r.get("job") is None, r.get("job") or 0)), arms)
    if run is not None:
        summary["run"] = run
    return summary
