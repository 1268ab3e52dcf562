"""A drafter's own measurement: the live A/B `default+drafter` against `default`, written
into the drafter's folder (`jumpahead live ... --record-drafter`), where `serve` reads
whether the drafter pays on the model it serves (engine/methods/drafter.py measured_pays) and so
whether method "drafter" joins its defaults.

The figures are the run summary's (live/summary.py `versus`: paired by seed, time to
success within the retry budget, outputs compared seed by seed); this module only
checks the run can speak for the drafter and copies them with where they came from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jumpahead.engine.methods.drafter import MEASURED, measured_pays

BASE, ARM = "default", "default+drafter"
MEASUREMENT_KIND = "jumpahead.drafter.measurement"


class DrafterMeasurementError(ValueError):
    pass


def check_recordable(arms: list[str], seed_split: str) -> str | None:
    """Why a run with these arms and seeds cannot measure a drafter (None: it can)."""
    missing = [a for a in (BASE, ARM) if a not in arms]
    if missing:
        return f"the run needs arms {BASE} and {ARM} (missing: {', '.join(missing)})"
    if seed_split != "heldout":
        return "a drafter is measured on held-out seeds (--seed-split heldout): it was trained on the others"
    return None


def record_measurement(summary: dict[str, Any], seed_split: str) -> Path:
    """Write the run's `default+drafter` vs `default` into the folder of the drafter
    that arm's server loaded; the path written. DrafterMeasurementError says why not."""
    problem = check_recordable(list(summary.get("arms", [])), seed_split)
    if problem:
        raise DrafterMeasurementError(problem)
    run = summary.get("run") or {}
    served = (run.get("served_by_arm") or {}).get(ARM) or {}
    folder = served.get("drafter")
    if not folder:
        raise DrafterMeasurementError(f"the {ARM} server reported no drafter on /health")
    versus = (summary.get("versus") or {}).get(ARM)
    if not versus or versus.get("base") != BASE:
        raise DrafterMeasurementError(f"the summary has no {ARM} against {BASE}")
    adapter = served.get("adapter") or None
    if adapter:  # the adapter's identity, not where this machine keeps it
        adapter = {"name": adapter.get("name"), "digest": adapter.get("digest")}
    record = {
        "kind": MEASUREMENT_KIND, "version": 1, "arm": ARM, "versus": versus,
        "model": served.get("model"), "adapter": adapter,
        "seed_split": seed_split, "kinds": run.get("kinds"), "tasks_per_arm": run.get("tasks_per_arm"),
        "concurrency": run.get("concurrency"), "device": served.get("device"),
        "command": run.get("command"), "machine": run.get("machine"),
        "finished_utc": run.get("finished_utc") or time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    pays, why = measured_pays(record, adapter.get("digest") if adapter else None)
    record["verdict_when_recorded"] = {"pays": pays, "why": why}  # serve recomputes it from the figures
    path = Path(folder) / MEASURED
    try:
        path.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        raise DrafterMeasurementError(f"cannot write {path}: {exc}") from None
    return path
