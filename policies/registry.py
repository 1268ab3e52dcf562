"""Policy specs: which policy class, with which options.

A spec names a policy and its options:

- `NAME[:key=value,...]` for a built-in (policies/builtin.py BUILTIN; names have no dot);
- `package.module:Class[:key=value,...]` for a user policy (any importable class that
  subclasses `Policy` or at least has one of its hooks).

Both contain ":", so a spec is read as a built-in when its first part is a built-in
name, else as `module:Class` followed by optional options. Options are passed to the
class's `__init__` as keyword strings; a value cannot hold a comma on the command line
(use a TOML config file for those: `load_config`).
"""

from __future__ import annotations

import importlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .api import BOUNDARIES, Policy
from .builtin import BUILTIN

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_HOOKS = ("on_request", "proposers", "on_boundary", "on_result", *(f"on_{b}" for b in BOUNDARIES))


class PolicyError(ValueError):
    """A spec that names no usable policy, or options the policy refuses."""


@dataclass(frozen=True)
class PolicySpec:
    """A policy class reference ("module:Class") plus its options, as given."""

    name: str  # what the user wrote: a built-in name or "module:Class"
    target: str  # "module:Class"
    options: dict[str, str] = field(default_factory=dict)

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN

    def load(self) -> type:
        return load_class(self.target, self.name)

    def build(self) -> Any:
        """A fresh instance (one per request: instances may keep per-request state)."""
        cls = self.load()
        try:
            return cls(**self.options)
        except TypeError as exc:
            raise PolicyError(f"policy {self.name}: bad options {self.options}: {exc}") from None
        except PolicyError:
            raise
        except Exception as exc:  # a policy's own validation (ValueError, ...)
            raise PolicyError(f"policy {self.name}: {type(exc).__name__}: {exc}") from None

    def __str__(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name}:{opts}" if opts else self.name


def _options(text: str, spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _KEY.match(key):
            raise PolicyError(f"policy spec {spec!r}: option {item.strip()!r} is not key=value")
        out[key.replace("-", "_")] = value.strip()
    return out


def parse_spec(spec: str) -> PolicySpec:
    """`NAME[:key=value,...]` or `module:Class[:key=value,...]` as a PolicySpec (not imported)."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyError("empty policy spec")
    spec = spec.strip()
    parts = spec.split(":")
    head = parts[0].strip()
    if head in BUILTIN:
        return PolicySpec(head, BUILTIN[head], _options(":".join(parts[1:]), spec))
    if len(parts) < 2 or "=" in parts[1] or not parts[1].strip():
        raise PolicyError(f"unknown policy {head!r} (built-in: {', '.join(sorted(BUILTIN))}; "
                          "a user policy is given as package.module:Class)")
    module, cls = head, parts[1].strip()
    if not all(p.isidentifier() for p in module.split(".")) or not cls.isidentifier():
        raise PolicyError(f"policy spec {spec!r}: expected package.module:Class")
    return PolicySpec(f"{module}:{cls}", f"{module}:{cls}", _options(":".join(parts[2:]), spec))


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return orjson.dumps(value, default=str).decode()


def spec_from_object(obj: Any) -> PolicySpec:
    """A spec string, or `{"name": NAME, key: value, ...}` (values become option strings)."""
    if isinstance(obj, str):
        return parse_spec(obj)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise PolicyError(f"a policy is a spec string or an object with a 'name', got {str(obj)[:80]!r}")
    base = parse_spec(obj["name"])
    options = dict(base.options)
    for key, value in obj.items():
        if key == "name":
            continue
        if not _KEY.match(str(key)):
            raise PolicyError(f"policy {base.name}: bad option name {key!r}")
        options[str(key).replace("-", "_")] = _option_text(value)
    return PolicySpec(base.name, base.target, options)


def load_class(target: str, name: str | None = None) -> type:
    """The class "module:Class" names; a clear PolicyError when it cannot be used."""
    label = name or target
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyError(f"policy {label}: cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself fails while importing
        raise PolicyError(f"policy {label}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise PolicyError(f"policy {label}: module {module_name!r} has no {cls_name!r}")
    if not isinstance(cls, type):
        raise PolicyError(f"policy {label}: {target} is not a class")
    if not issubclass(cls, Policy) and not any(callable(getattr(cls, h, None)) for h in _HOOKS):
        raise PolicyError(f"policy {label}: {target} is neither a Policy subclass nor has any policy hook "
                          f"({', '.join(_HOOKS[:4])}, ...)")
    return cls


def resolve(spec: str | PolicySpec) -> Any:
    """A policy instance from a spec; raises PolicyError naming what is wrong."""
    parsed = spec if isinstance(spec, PolicySpec) else parse_spec(spec)
    return parsed.build()


def load_config(path: str | Path) -> list[PolicySpec]:
    """The policies of a TOML file, in order:

        [[policy]]
        name = "compaction"
        clear_at_least = 2000

        [[policy]]
        name = "mypkg.policies:Mine"
    """
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"cannot read policy config {p}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(f"policy config {p} is not valid TOML: {exc}") from None
    unknown = set(doc) - {"policy"}
    if unknown:
        raise PolicyError(f"policy config {p}: unknown top-level keys {sorted(unknown)} (expected [[policy]] tables)")
    entries = doc.get("policy", [])
    if not isinstance(entries, list):
        raise PolicyError(f"policy config {p}: 'policy' must be an array of tables ([[policy]])")
    specs = []
    for i, entry in enumerate(entries, 1):
        try:
            specs.append(spec_from_object(entry))
        except PolicyError as exc:
            raise PolicyError(f"policy config {p}, policy {i}: {exc}") from None
    return specs
