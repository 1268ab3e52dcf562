"""`jumpahead traces import|analyze|expand`: read session files.

`import` detects each file's format (traces/formats.py), prints a summary per session
(or JSON with --json) and with --out writes each session as normalized JSON
(Session.to_dict). `analyze` runs the copy-opportunity analysis (traces/analysis.py).
A file no importer reads is a one-line error naming the known formats, exit 2.
`expand` prints one of our own trace files with every turn line whole (the file
stores deltas: traces/delta.py), for jq, grep and other tools that read lines alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="traces_command", metavar="SUBCOMMAND", required=True)
    imp = sub.add_parser("import", help="read session files and summarise them (or write normalized JSON)",
                         description="Detect each file's session format, summarise its sessions, "
                                     "optionally write them as normalized JSON.")
    imp.add_argument("files", nargs="+", metavar="FILE", help="session files (pi, Claude Code, Codex, opencode, ...)")
    imp.add_argument("--format", default=None, metavar="NAME", help="read as this format instead of detecting it")
    imp.add_argument("--json", action="store_true", help="print the summaries as JSON")
    imp.add_argument("--out", default=None, metavar="DIR", help="write each session to DIR/<session id>.json")
    ana = sub.add_parser("analyze", help="how much of each session's tool-call output was already in its context",
                         description="Copy-opportunity analysis of session files (exact 8-token windows).")
    ana.add_argument("files", nargs="+", metavar="FILE", help="session files in any importable format")
    ana.add_argument("--json", action="store_true", help="print the full result as JSON")
    ana.add_argument("--tokenizer", default=None, metavar="PATH",
                     help="model folder whose tokenizer counts tokens (default: the default model's)")
    exp = sub.add_parser("expand", help="print a jumpahead trace file with every turn line whole",
                         description="Print a trace file written by `serve --trace-dir` as JSONL with every "
                                     "turn whole (each line then stands alone, as in version 1 files).")
    exp.add_argument("file", metavar="FILE", help="a trace file (DIR/<session>.jsonl)")
    exp.add_argument("--out", default=None, metavar="PATH", help="write to PATH instead of standard output")


def run(args: argparse.Namespace) -> int:
    if args.traces_command == "import":
        return _import(args)
    if args.traces_command == "expand":
        return _expand(args)
    return _analyze(args)


def _expand(args: argparse.Namespace) -> int:
    from .importers.jumpahead_trace import detect
    from .trace_file import FORMAT, read_trace

    path = Path(args.file)
    if not path.is_file():
        print(f"jumpahead traces expand: {args.file}: {'not a file' if path.exists() else 'no such file'}",
              file=sys.stderr)
        return 2
    with path.open("rb") as fh:
        ours = detect(path, fh.readline())
    if not ours:
        print(f"jumpahead traces expand: {args.file}: not a {FORMAT} file (its first line is not our "
              "session header); other formats: `jumpahead traces import --out DIR`", file=sys.stderr)
        return 2
    header, turns, warnings = read_trace(path)
    for warning in warnings:
        print(f"jumpahead traces expand: warning: {warning}", file=sys.stderr)
    resumed = header.pop("resumed", None)
    lines = [orjson.dumps(header)] + [orjson.dumps(t) for t in turns]
    if isinstance(resumed, list):  # the restarts' session headers: lines of their own after the first
        lines[1:1] = [orjson.dumps(h) for h in resumed]
    data = b"\n".join(lines) + b"\n"
    if args.out:
        Path(args.out).write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def _fail(command: str, message: str) -> int:
    from .formats import known_formats

    if "(known" not in message:  # formats.py messages already list them
        message = f"{message} (known formats: {', '.join(known_formats())})"
    print(f"jumpahead traces {command}: {message}", file=sys.stderr)
    return 2


def load_file(path: str, format: str | None = None) -> list[Any]:
    """Every session in `path`; UnknownFormat / ValueError with a one-line message otherwise."""
    from .formats import FORMATS, UnknownFormat, _load_importers, detect

    _load_importers()
    p = Path(path)
    if not p.is_file():
        raise UnknownFormat(f"{path}: no such file" if not p.exists() else f"{path}: not a file")
    if format is None:
        fmt = detect(p)
    else:
        found = [f for f in FORMATS if f.name == format]
        if not found:
            raise UnknownFormat(f"unknown format {format!r} (known: {', '.join(f.name for f in FORMATS)})")
        fmt = found[0]
    try:
        sessions = fmt.load(p)
        if format is not None and not any(s.messages for s in sessions):
            with p.open("rb") as fh:
                if not fmt.detect(p, fh.read(1 << 16)):  # forced onto a file of another shape
                    raise UnknownFormat(f"{path}: not a {fmt.name} session (no messages read)")
        return sessions
    except (UnknownFormat, ValueError, OSError) as exc:
        raise UnknownFormat(str(exc).splitlines()[0] if str(exc) else f"{path}: unreadable") from None
    except Exception as exc:  # a file that looks like the format but breaks its importer
        raise UnknownFormat(f"{path}: cannot be read as {fmt.name}: {type(exc).__name__}: {exc}") from None


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [("session", "id"), ("format", "format"), ("msgs", "messages"), ("turns", "turns"),
            ("calls", "tool_calls"), ("results", "tool_results"), ("reasoning", "reasoning_blocks"),
            ("warnings", "warnings"), ("models", "models")]

    def cell(row: dict[str, Any], key: str) -> str:
        value = row[key]
        if key == "models":
            return ", ".join(value) or "-"
        if key == "id" and len(str(value)) > 40:
            return "…" + str(value)[-39:]
        return str(value)

    cells = [[cell(r, k) for _, k in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(cols)]
    numeric = {k for _, k in cols} - {"id", "format", "models"}

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if cols[i][1] in numeric else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [line([h for h, _ in cols]), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in cells]
    return "\n".join(out)


def _write(sessions: list[Any], out_dir: Path) -> list[str]:
    from .file_names import safe_file_stem

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for s in sessions:
        stem = safe_file_stem(s.id)
        path = out_dir / f"{stem}.json"
        n = 1
        while str(path) in written:  # two files holding the same session id
            n += 1
            path = out_dir / f"{stem}-{n}.json"
        if path.is_symlink():  # planted in DIR: replace the link, never write through it
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(s.to_dict(), option=orjson.OPT_INDENT_2))
        written.append(str(path))
    return written


def _import(args: argparse.Namespace) -> int:
    from .formats import UnknownFormat

    sessions = []
    try:
        for path in args.files:
            sessions.extend(load_file(path, args.format))
    except UnknownFormat as exc:
        return _fail("import", str(exc))
    written: list[str] = []
    if args.out:
        try:
            written = _write(sessions, Path(args.out))
        except OSError as exc:
            return _fail("import", f"cannot write to {args.out}: {exc}")
    rows = [{**s.summary(), "warning_messages": s.warnings} for s in sessions]
    if args.json:
        print(orjson.dumps({"sessions": rows, "written": written}, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(_table(rows))
    for r in rows:
        for w in r["warning_messages"]:
            print(f"warning: {r['id']}: {w}")
    for w in written:
        print(f"wrote {w}")
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from .formats import UnknownFormat

    for path in args.files:  # a bad file fails before a tokenizer loads
        try:
            load_file(path)
        except UnknownFormat as exc:
            return _fail("analyze", str(exc))
    from . import analysis

    try:
        result = analysis.analyze_paths(list(args.files), args.tokenizer)
    except (UnknownFormat, ValueError, OSError) as exc:
        return _fail("analyze", str(exc))
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        print(analysis.format_table(result))
    return 0
