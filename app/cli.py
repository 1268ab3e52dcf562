"""The `jumpahead` command line: one subcommand per job, each in its own module.

A command module exposes `add_arguments(parser)` and `run(args) -> int` and keeps
heavy imports (mlx, the engine, the web stack) inside `run`, so `jumpahead --help`
and argument errors are instant. Only the module of the command being run is imported.
To add a command, add a line to COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("jumpahead.app.serve", "run the model server (OpenAI-compatible API)"),
    "doctor": ("jumpahead.app.doctor", "what this machine gives the server (CPU, BLAS, MLX, speed, caches) and what to fix"),
    "bench": ("jumpahead.bench.command", "run a benchmark and print JSON (decode, fill, cache, attention)"),
    "report": ("jumpahead.traces.report", "build an HTML report from replay/analysis JSON"),
    "traces": ("jumpahead.traces.command", "import and analyse agent sessions"),
    "replay": ("jumpahead.app.replay_command",
               "replay recorded sessions under paired arms (forced) or to a real client (--live)"),
    "live": ("jumpahead.live.command", "run tasks of the live task world per arm, paired by seed, through real servers"),
    "write-up": ("jumpahead.research.writeup",
                 "write the research write-up (docs/research.md, SVG figures) from a live run's summary.json"),
    "train-adapter": ("jumpahead.training.train", "train the LoRA adapter that teaches the default model the task world's tools"),
    "train-drafter": ("jumpahead.training.train_drafter", "train the learned drafter (engine/methods/drafter.py) for the served model from its own greedy outputs"),
    "eval-adapter": ("jumpahead.live.evaluate", "list the held-out task seeds an adapter is measured on"),
}


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """The parser; `load` names the one command whose arguments are added ("" none, None all)."""
    parser = argparse.ArgumentParser(
        prog="jumpahead",
        description="A local model server for coding agents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if load is None or load == name:
            importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(first if first in COMMANDS else "")
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
