"""What every `jumpahead bench` command (and `jumpahead replay`) does with its result:
print it as JSON and, with `--out F`, also write it to F; and fail loudly (exit 1, a
message on stderr) when the result says two arms' outputs differ where they must be
identical."""

from __future__ import annotations

import json
import sys
from typing import Any

# Keys under which a bench states, from the token lists of that run, that two arms
# emitted the same tokens: a bool, or a dict of bools (one per pair of arms).
IDENTITY_KEYS = ("identical_outputs", "same_tokens")


def mismatches(result: Any, path: str = "") -> list[str]:
    """Where `result` records outputs that differ (paths of False identity flags)."""
    found: list[str] = []
    if isinstance(result, dict):
        for key, value in result.items():
            here = f"{path}.{key}" if path else str(key)
            if key in IDENTITY_KEYS:
                flags = value if isinstance(value, dict) else {"": value}
                found += [f"{here}.{k}" if k else here for k, v in flags.items() if v is False]
            else:
                found += mismatches(value, here)
    elif isinstance(result, list):
        for i, value in enumerate(result):
            found += mismatches(value, f"{path}[{i}]")
    return found


def emit(result: dict[str, Any], out: str | None = None) -> int:
    """Print (and write) the result; 1 with a loud message if outputs differ, else 0."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    bad = mismatches(result)
    if bad:
        print(f"BENCH FAILED: outputs that must be identical differ: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
