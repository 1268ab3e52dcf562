"""The child process of `jumpahead bench models` (bench/model_sweep.py): one model
type loaded as `jumpahead serve` loads it (serve's default arguments and its
engine_config, whose method specs the Engine attaches), then checked. In app/ because serve's loading
path is here (bench/ may not import app/)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def open_engine(folder: str, extra: list[str]) -> Any:
    """`jumpahead serve --model folder *extra`'s Engine, with its drafter and MTP
    defaults attached (a problem attaching them: RuntimeError)."""
    import jumpahead.engine  # noqa: F401  (chooses and binds the BLAS before mlx is imported)
    from jumpahead.engine.engine import Engine
    from jumpahead.engine.methods.registry import MethodError

    from .serve import add_arguments, engine_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", folder, *extra])
    config, _ = engine_config(args)
    try:
        return Engine.load(args.model, config, progress=lambda s: None)
    except MethodError as exc:
        raise RuntimeError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    import jumpahead.engine  # noqa: F401
    from jumpahead.bench.model_sweep import child_main

    return child_main(list(sys.argv[1:] if argv is None else argv), open_engine)


if __name__ == "__main__":
    sys.exit(main())
