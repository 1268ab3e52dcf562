"""`jumpahead eval-adapter`: the held-out tasks an adapter is measured on.

The measurement itself runs through the real HTTP server and the agent loop of
`jumpahead live` (its `ordinary` arm); this module only fixes which tasks: the first
`n` seeds of the held-out split, never used for training (world.split_seeds).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .world import SINGLE_STEP, make_task, split_seeds


def heldout_seeds(n: int = 50) -> list[int]:
    """The held-out task seeds, in order (kinds cycle through world.KINDS)."""
    return split_seeds("heldout", n)


def heldout_tasks(n: int = 50) -> list[dict[str, Any]]:
    """seed, kind, steps and whether the kind is single-step, per held-out task."""
    out = []
    for seed in heldout_seeds(n):
        task = make_task(seed)
        out.append({"seed": seed, "kind": task.kind, "steps": task.steps,
                    "single_step": task.kind in SINGLE_STEP})
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", default="smol-agent", metavar="NAME|DIR",
                        help="the adapter to measure (default: the shipped smol-agent)")
    parser.add_argument("--n", type=int, default=50, help="held-out tasks (default: 50)")


def run(args: argparse.Namespace) -> int:
    tasks = heldout_tasks(args.n)
    print(json.dumps({
        "adapter": args.adapter,
        "seeds": [t["seed"] for t in tasks],
        "tasks": tasks,
        "measure_with": f"jumpahead serve --adapter {args.adapter}  # then: jumpahead live --arms ordinary "
                        f"(held-out seeds {tasks[0]['seed'] if tasks else ''}..)",
    }, indent=2))
    return 0
