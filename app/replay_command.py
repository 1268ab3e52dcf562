"""`jumpahead replay`: replay recorded sessions.

Forced replay (default): `jumpahead replay SESSION... [--arms ordinary,strict,echo]`
re-drives each session's last assistant turns through the engine under paired arms
(traces/replay.py) and prints the `jumpahead.replay` JSON (also to --out).
`--repeats N` runs the whole replay N times, each on fresh engines and empty caches,
and adds means and intervals over the repeats (traces/repeats.py).

Live replay: `jumpahead replay --live SESSION [--port P] [serve options]` serves the
session's recorded assistant turns, in order, to a real client: the session becomes a
script (core/script.py) and the server starts exactly as `jumpahead serve --script`
does (app/serve.py run), so an agent can be re-run against changed policies
(`--policy`) and compared.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

from . import serve

from jumpahead.traces.arms import ARMS

DEFAULT_ARMS = "ordinary,strict,echo"


def _count(text: str) -> int:
    return serve.at_least(text, 0)


def _repeats(text: str) -> int:
    return serve.at_least(text, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jumpahead.traces.replay import DEFAULT_MAX_CONTEXT, DEFAULT_MAX_OUTPUT, DEFAULT_TURNS

    parser.add_argument("sessions", nargs="+", metavar="SESSION",
                        help="session files in any format `jumpahead traces import` reads")
    parser.add_argument("--format", default=None, metavar="NAME", help="read the files as this format (default: detect)")
    parser.add_argument("--arms", default=DEFAULT_ARMS, metavar="LIST",
                        help=f"comma-separated arms (default: {DEFAULT_ARMS}): {', '.join(ARMS)}, a policy name "
                             "(oracle-jump, jump, compaction, ...; NAME:key=value for options), or parts joined by "
                             "'+' (strict+echo); 'ordinary' is always run as the baseline")
    parser.add_argument("--turns", type=_count, default=DEFAULT_TURNS, metavar="N",
                        help=f"replay the last N assistant turns of each session (default: {DEFAULT_TURNS}; 0: all)")
    parser.add_argument("--max-context", type=_count, default=DEFAULT_MAX_CONTEXT, metavar="N",
                        help=f"prompt tokens per turn; longer histories are replayed over a tail window (system "
                             f"message + newest messages, moved in steps) (default: {DEFAULT_MAX_CONTEXT}; 0: the "
                             "model's window minus the longest output)")
    parser.add_argument("--max-output-tokens", type=_count, default=DEFAULT_MAX_OUTPUT, metavar="N",
                        help=f"skip turns whose recorded output is longer (default: {DEFAULT_MAX_OUTPUT}; 0: no limit)")
    parser.add_argument("--show-reasoning", action="store_true",
                        help="render earlier assistant reasoning into prompts (<think>...</think>, as reasoning "
                             "models' templates do; the embedded template drops it), so reasoning compaction "
                             "and thinking clearing have something to remove (embedded default model only)")
    parser.add_argument("--repeats", type=_repeats, default=1, metavar="N",
                        help="run the whole replay N times, each on fresh engines with empty prefix caches, and "
                             "add a `repeats` section: per arm, session and overall the per-repeat values, their "
                             "mean with a 95%% interval, and the paired difference against ordinary with its "
                             "p-value; token counts must be equal in every repeat (else exit 1) (default: 1: "
                             "one replay, no section)")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="also write the JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--live", action="store_true",
                        help="serve the session's recorded turns to a real client instead (one SESSION; the "
                             "server options below apply)")
    serve.add_arguments(parser.add_argument_group("server options (--live; --model, --max-proposal, "
                                                  "--no-cost-aware and --objective also apply to forced replay)"))


def _fail(message: str) -> int:
    print(f"jumpahead replay: {message}", file=sys.stderr)
    return 2


def _load(paths: list[str], fmt: str | None) -> list[Any]:
    from jumpahead.traces.formats import UnknownFormat, load_sessions

    sessions = []
    for path in paths:
        try:
            found = load_sessions(path, fmt)
        except (UnknownFormat, OSError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        if not found:
            raise ValueError(f"{path}: no session in the file")
        for s in found:
            s.source = s.source or path
        sessions += found
    return sessions


def run(args: argparse.Namespace) -> int:
    if args.live:
        if args.repeats != 1:
            return _fail("--repeats applies to forced replay, not --live")
        return run_live(args)
    from jumpahead.traces.arms import ArmError, parse_arms

    try:
        arms = parse_arms(args.arms)
    except ArmError as exc:
        return _fail(str(exc))
    try:
        sessions = _load(args.sessions, args.format)
    except ValueError as exc:
        return _fail(str(exc))

    import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
    from jumpahead.bench.output import emit
    from jumpahead.engine.model.loader import load_model

    from jumpahead.traces.progress import Progress
    from jumpahead.traces.replay import ReplayOptions, replay

    options = ReplayOptions(arms, turns=args.turns or None, max_context=args.max_context or None,
                            max_output_tokens=args.max_output_tokens or None, max_proposal=args.max_proposal,
                            cost_aware=not args.no_cost_aware, objective=args.objective,
                            drafter=None if args.drafter in (None, "auto", "none", "off") else args.drafter)
    say = (lambda s: None) if args.quiet else (lambda s: print(f"jumpahead replay: {s}", file=sys.stderr))
    try:
        loaded = load_model(args.model, progress=say)
    except Exception as exc:
        return _fail(f"cannot load model {args.model or '(default)'}: {type(exc).__name__}: {exc}")
    if args.show_reasoning:
        from jumpahead.traces.templates import TemplateError, showing_reasoning

        try:
            loaded = (loaded[0], showing_reasoning(loaded[1]), loaded[2])
        except TemplateError as exc:
            return _fail(str(exc))
    from jumpahead.engine.methods.registry import MethodError
    from jumpahead.traces.repeats import RepeatMismatch, replay_repeated

    def note_template(doc: dict[str, Any]) -> None:
        if args.show_reasoning:
            doc["options"]["template"] = "earlier reasoning shown (--show-reasoning)"

    progress = None if args.quiet else (lambda total, turns: Progress(total, turns))
    warn = lambda m: print(f"jumpahead replay: WARNING: {m}", file=sys.stderr)  # noqa: E731
    try:
        if args.repeats == 1:
            doc = replay(sessions, options, loaded, progress=progress, warn=warn)
            note_template(doc)
        else:
            doc = replay_repeated(sessions, options, loaded, args.repeats, progress=progress, warn=warn, say=say,
                                  finish=note_template)
    except MethodError as exc:  # an arm runs method "drafter" and the drafter is not this model's
        return _fail(str(exc))
    except RepeatMismatch as exc:
        print(f"jumpahead replay: ERROR: {exc}", file=sys.stderr)
        return 1
    emit(doc, args.out)
    return 0


def write_script(session: Any, path: str) -> int:
    """The session's assistant turns as a script file (core/script.py JSONL); how many."""
    import orjson

    from jumpahead.traces.replay import script_turn

    n = 0
    with open(path, "wb") as fh:
        for i in session.assistant_indices():
            t = script_turn(session.messages[i])
            line = {"reasoning": t.reasoning, "text": t.text,
                    # raw-text arguments go as a JSON text of the string (the script reads it back)
                    "tool_calls": [{"name": c.name, "arguments": orjson.dumps(c.arguments).decode()
                                    if isinstance(c.arguments, str) else c.arguments} for c in t.tool_calls]}
            fh.write(orjson.dumps(line) + b"\n")
            n += 1
    return n


def run_live(args: argparse.Namespace) -> int:
    if len(args.sessions) != 1:
        return _fail("--live serves one session (give one SESSION file)")
    try:
        sessions = _load(args.sessions, args.format)
    except ValueError as exc:
        return _fail(str(exc))
    session = sessions[0]
    if not session.turns:
        return _fail(f"{args.sessions[0]}: the session has no assistant turns to serve")
    if len(sessions) > 1:
        print(f"jumpahead replay: {args.sessions[0]} holds {len(sessions)} sessions; serving the first "
              f"({session.id})", file=sys.stderr)
    fd, path = tempfile.mkstemp(prefix="jumpahead-live-", suffix=".jsonl")
    os.close(fd)
    try:
        turns = write_script(session, path)
        print(f"jumpahead replay: serving the {turns} recorded assistant turns of {session.id} in order",
              file=sys.stderr)
        args.script = path
        return serve.run(args)
    finally:
        os.unlink(path)
