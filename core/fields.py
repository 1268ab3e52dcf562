"""Readers for request fields: type and range checks that raise a 400 naming the field.

Shared by the wire protocols (chat completions, messages, responses).
"""

from __future__ import annotations

from typing import Any

from .errors import invalid_request


def number(body: dict[str, Any], key: str, default: float, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_request(f"{key} must be a number, got {type(value).__name__}", param=key)
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    if bad_lo or (hi is not None and value > hi):
        low = "" if lo is None else f"{'>' if lo_open else '>='} {lo}"
        high = "" if hi is None else f"<= {hi}"
        raise invalid_request(f"{key} must be {' and '.join(x for x in (low, high) if x)}, got {value}", param=key)
    return float(value)


def integer(body: dict[str, Any], key: str, lo: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(f"{key} must be an integer, got {type(value).__name__}", param=key)
    if lo is not None and value < lo:
        raise invalid_request(f"{key} must be >= {lo}, got {value}", param=key)
    return value


def boolean(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"{key} must be a boolean, got {type(value).__name__}", param=key)
    return value


def obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_request(f"{param} must be an object, got {type(value).__name__}", param=param)
    return value
