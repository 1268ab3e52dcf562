"""What every `jumpahead bench` command does with its result: print it as JSON and,
with `--out F`, also write it to F."""

from __future__ import annotations

import json
from typing import Any


def emit(result: dict[str, Any], out: str | None = None) -> None:
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
