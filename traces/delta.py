"""Delta-encoded turn lines: a trace stores what each turn adds, not the history again.

Agents resend the whole conversation every turn. Stored whole, each turn line repeats
every earlier message twice (the client's body and the parsed context) and the tool
schemas and system prompt once more, so a session's file grows with the square of its
length. A turn line may instead extend an earlier turn of the same file
(`"delta": {"of": INDEX, "keep": {...}, "same": [...]}`):

- `keep` maps a message list (e.g. "request.body.messages") to how many leading items
  it shares with that turn's; the line stores only the items after them;
- `same` names values equal to that turn's (the tool schemas, the system prompt), which
  the line leaves out.

`trace_file.read_trace` rebuilds every turn whole, so nothing above it sees deltas. A
writer that does not know the file's earlier turns (a restarted server) writes the
turn whole; a turn whose base line was lost is reported and skipped by the reader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

# Message lists that grow by appending, turn after turn.
LISTS: tuple[tuple[str, ...], ...] = (
    ("context", "messages"),
    ("request_context", "messages"),
    ("request", "body", "messages"),  # chat completions, Anthropic Messages
    ("request", "body", "input"),  # Responses
)
# Values an agent resends unchanged every turn.
SAME: tuple[tuple[str, ...], ...] = (
    ("context", "tools"),
    ("request_context", "tools"),
    ("request", "body", "tools"),
    ("request", "body", "system"),
    ("request", "body", "instructions"),
    ("request", "headers"),
)
_ABSENT = object()


class DeltaError(ValueError):
    """A delta line that its base turn cannot complete."""


def _get(record: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(record, dict) or key not in record:
            return _ABSENT
        record = record[key]
    return record


def _put(record: dict, path: tuple[str, ...], value: Any) -> dict:
    """A copy of `record` with `path` set to `value` (removed for _ABSENT); the dicts
    along the path are copied, everything else is shared."""
    out = dict(record)
    if len(path) == 1:
        if value is _ABSENT:
            out.pop(path[0], None)
        else:
            out[path[0]] = value
        return out
    inner = out.get(path[0])
    out[path[0]] = _put(inner if isinstance(inner, dict) else {}, path[1:], value)
    return out


def _shared_prefix(old: list, new: list, dumps: Callable[[Any], bytes]) -> int:
    """How many leading items the lists share, as written: Python's == also takes 1 for
    1.0 and True, which JSON tells apart, so a match is confirmed on the encoded bytes."""
    n = 0
    for a, b in zip(old, new):
        if a != b:
            break
        n += 1
    if n and dumps(old[:n]) != dumps(new[:n]):
        n = next((i for i, (a, b) in enumerate(zip(old, new)) if dumps(a) != dumps(b)), n)
    return n


def encode(record: dict[str, Any], base: dict[str, Any] | None,
           dumps: Callable[[Any], bytes] = orjson.dumps) -> dict[str, Any]:
    """The line to write for the whole turn `record`, as a delta of the whole turn `base`
    (the session's previous turn line) where they share anything; else `record` itself.
    `dumps` is the writer's encoder (what "the same" means is what it writes)."""
    if base is None or "index" not in base:
        return record
    keep: dict[str, int] = {}
    same: list[str] = []
    out = record
    for path in LISTS:
        new, old = _get(record, path), _get(base, path)
        if isinstance(new, list) and isinstance(old, list):
            n = _shared_prefix(old, new, dumps)
            if n:
                keep[".".join(path)] = n
                out = _put(out, path, new[n:])
    for path in SAME:
        new = _get(record, path)
        old = _get(base, path)
        if new is not _ABSENT and old is not _ABSENT and (new is old or (new == old and dumps(new) == dumps(old))):
            same.append(".".join(path))
            out = _put(out, path, _ABSENT)
    if not keep and not same:
        return record
    return {**out, "delta": {"of": base["index"], "keep": keep, "same": same}}


def decode(line: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The whole turn of a delta `line`, given the whole turn it extends."""
    delta = line.get("delta")
    if not isinstance(delta, dict):
        raise DeltaError("'delta' is not an object")
    out = {k: v for k, v in line.items() if k != "delta"}
    keep, same = delta.get("keep") or {}, delta.get("same") or []
    if not isinstance(keep, dict) or not isinstance(same, list):
        raise DeltaError("'delta.keep' must be an object and 'delta.same' a list")
    for dotted, n in keep.items():
        path = tuple(str(dotted).split("."))
        old, tail = _get(base, path), _get(line, path)
        if not isinstance(old, list) or not isinstance(n, int) or not 0 < n <= len(old) or not isinstance(tail, list):
            raise DeltaError(f"'{dotted}' keeps {n!r} items of a base that has {_size(old)}")
        out = _put(out, path, old[:n] + tail)
    for dotted in same:
        path = tuple(str(dotted).split("."))
        old = _get(base, path)
        if old is _ABSENT:
            raise DeltaError(f"'{dotted}' is the same as the base's, which has none")
        out = _put(out, path, old)
    return out


def _size(value: Any) -> str:
    return f"{len(value)} items" if isinstance(value, list) else "no such list"
