"""`jumpahead bench trace-size [FILE ...]`: how big a recorded session's trace is with
delta-encoded turn lines (traces/delta.py) against every turn stored whole, side by side.

Each session (the public ones in ../shared/traces/public by default) is recorded as the
server would record it: per assistant turn, a turn line with the chat body an agent
resends (the whole history, the tools) and the parsed context. Both files are read back
with the real reader, and every run checks that they give identical turns (exit 1 if
not): the saving is never claimed for a file that does not round-trip.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces" / "public"


def records(session: Any) -> list[dict[str, Any]]:
    """The turn records of `session`, as TraceRecorder.turn_record lays them out."""
    from jumpahead.proxy.upstream.translate import chat_body
    from jumpahead.traces.turn_json import turn_to_json

    out = []
    for i, m in enumerate(session.messages):
        if m.role != "assistant":
            continue
        turn = session.turn(i)
        out.append({
            "type": "turn", "index": len(out), "protocol": "chat", "session": session.id,
            "request": {"headers": {"user-agent": "bench-trace-size", "authorization": "<redacted>"},
                        "body": chat_body(turn, "local")},
            "context": turn_to_json(turn),
            "response": {"reasoning": m.reasoning, "content": m.content,
                         "tool_calls": [{"name": c.name, "arguments": c.arguments, "id": c.id}
                                        for c in m.tool_calls],
                         "finish_reason": "tool_calls" if m.tool_calls else "stop"},
        })
    return out


def measure(path: Path, work: Path) -> list[dict[str, Any]]:
    from jumpahead.traces.delta import encode
    from jumpahead.traces.formats import load_sessions
    from jumpahead.traces.recorder import dumps_line
    from jumpahead.traces.trace_file import FORMAT, VERSION, read_trace

    rows = []
    for n, session in enumerate(load_sessions(path)):
        recs = records(session)
        if not recs:
            continue
        header = dumps_line({"type": "session", "format": FORMAT, "version": VERSION, "session": session.id})
        whole, delta = work / f"{path.stem}-{n}-whole.jsonl", work / f"{path.stem}-{n}-delta.jsonl"
        whole.write_bytes(header + b"".join(dumps_line(r) for r in recs))
        lines, base = [], None
        for r in recs:
            lines.append(dumps_line(encode(r, base, dumps_line)))
            base = r
        delta.write_bytes(header + b"".join(lines))
        got, want = read_trace(delta), read_trace(whole)
        rows.append({"file": path.name, "session": session.id, "turns": len(recs),
                     "whole_bytes": whole.stat().st_size, "delta_bytes": delta.stat().st_size,
                     "ratio": round(whole.stat().st_size / delta.stat().st_size, 2),
                     "last_line_whole_bytes": len(dumps_line(recs[-1])), "largest_delta_line_bytes": max(map(len, lines)),
                     "identical": got[1] == want[1] and not got[2]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jumpahead bench trace-size", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help=f"session files (default: every file under {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    files = args.files or sorted(p for p in DEFAULT_DIR.rglob("*") if p.is_file() and p.name != "SOURCES.md")
    if not files:
        print(f"jumpahead bench trace-size: no session files (none given, none under {DEFAULT_DIR})", file=sys.stderr)
        return 2
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"jumpahead bench trace-size: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trace-size-") as tmp:
        for n, f in enumerate(files, 1):
            found = measure(f, Path(tmp))
            rows += found
            print(f"trace-size: [{n}/{len(files)}] {f.name}: {sum(r['turns'] for r in found)} turns, "
                  f"{sum(r['whole_bytes'] for r in found) / 1e6:.1f} MB whole, "
                  f"{sum(r['delta_bytes'] for r in found) / 1e6:.2f} MB deltas", file=sys.stderr)
    whole, delta = sum(r["whole_bytes"] for r in rows), sum(r["delta_bytes"] for r in rows)
    report = {"bench": "trace-size", "sessions": rows, "turns": sum(r["turns"] for r in rows),
              "whole_bytes": whole, "delta_bytes": delta, "ratio": round(whole / delta, 2) if delta else None,
              "identical": all(r["identical"] for r in rows)}
    print(json.dumps(report, indent=1))
    if not report["identical"]:
        print("jumpahead bench trace-size: a delta file did not read back as the whole one", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
