"""Built-in session importers: importing this package registers every format with
traces/formats.py. Detection tries them in this order, so the specific shapes come
first and the generic OpenAI-messages reader last."""

from __future__ import annotations

try:  # our own recorded traces; written by the recorder's module, which may not exist yet
    from . import jumpahead_trace  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != f"{__name__}.jumpahead_trace":
        raise

from . import (  # noqa: E402,F401  (each module registers its format on import)
    pi,
    claude_code,
    codex,
    opencode,
    mini_swe_agent,
    swe_agent,
    openhands_eval,
    openhands,
    cline,
    openai_messages,
)
