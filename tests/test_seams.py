"""The seams between layers are typed: what a proposer can do is a declared capability
(engine/methods/proposal.py) checked with isinstance, `Engine.info` is a `ServedModel`, and no
data travels by setting attributes on another layer's objects. Read from the source
(AST), so a new probe by attribute name fails here."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from jumpahead.engine.methods.proposal import DraftsInGroup, ObservesHidden, Peeks, ReleasesRow, Wrapper, unwrapped

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "proxy", "policies", "engine", "traces", "live", "bench", "app")
CAPABILITIES = {"inner", "peek", "round_group", "release_row", "observe_hidden", "k"}
MODEL_FIELDS = {"name", "path", "vocab_size", "adapter", "adapter_digest", "cache_name", "dtype"}


@functools.cache
def _trees() -> tuple[tuple[str, ast.AST], ...]:
    """Every source module parsed once (the tests below walk them several times)."""
    return tuple((str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path)))
                 for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")))


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    return [(f"{where}:{node.lineno}", node) for where, tree in _trees() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name]


def _const(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def test_no_capability_is_found_by_getattr() -> None:
    probes = [where for where, call in _calls("getattr") + _calls("hasattr")
              if len(call.args) >= 2 and _const(call.args[1]) in CAPABILITIES]
    assert not probes, probes


def test_the_served_model_is_read_as_a_type() -> None:
    probes = [where for where, call in _calls("getattr") + _calls("hasattr")
              if len(call.args) >= 2 and _const(call.args[1]) in MODEL_FIELDS
              and "info" in ast.unparse(call.args[0])]
    assert not probes, probes


def test_no_data_is_passed_by_setattr() -> None:
    # fast_ops' stand-ins forward attribute writes to the module they stand in for
    allowed = {"engine/kv/fast_ops.py"}
    found = [where for where, _ in _calls("setattr") if where.split(":")[0] not in allowed]
    assert not found, found


class _Echoish(Peeks):
    def peek(self, view, max_len):
        return None


class _Grouped(DraftsInGroup, ReleasesRow, ObservesHidden):
    def __init__(self) -> None:
        self.round_group, self.k, self.released = object(), 3, False

    def release_row(self) -> None:
        self.released = True


class _Wrapped(Wrapper):
    def __init__(self, inner) -> None:
        self.inner = inner


def test_capabilities_are_declared_and_seen_through_a_wrapper() -> None:
    """A proposer without the capability classes has none of them, whatever attributes
    it happens to carry; a wrapper's inner proposer is where they are read."""

    class Lookalike:  # a `peek` and a `round_group` by accident are not capabilities
        round_group = object()

        def peek(self, view, max_len):
            return None

    grouped = _Grouped()
    assert unwrapped(_Wrapped(grouped)) is grouped and unwrapped(grouped) is grouped
    assert isinstance(unwrapped(_Wrapped(grouped)), (DraftsInGroup, ReleasesRow, ObservesHidden))
    assert isinstance(_Echoish(), Peeks) and not isinstance(Lookalike(), (Peeks, DraftsInGroup))
    from jumpahead.engine.methods.draft_model import DraftProposer
    from jumpahead.engine.methods.drafter import DrafterProposer
    from jumpahead.engine.methods.echo import EchoProposer, NgramProposer
    from jumpahead.engine.strict.grammar import ConstrainedProposer
    from jumpahead.engine.methods.mtp import MtpProposer
    from jumpahead.engine.methods.mtp_group import GroupedMtpProposer
    from jumpahead.traces.forcing import TimedProposer

    assert issubclass(EchoProposer, Peeks) and not issubclass(NgramProposer, Peeks)
    assert issubclass(DraftProposer, DraftsInGroup) and issubclass(DraftProposer, ReleasesRow)
    assert issubclass(DrafterProposer, DraftsInGroup) and not issubclass(DrafterProposer, ReleasesRow)
    assert issubclass(MtpProposer, ObservesHidden) and not issubclass(MtpProposer, DraftsInGroup)
    assert all(issubclass(GroupedMtpProposer, c) for c in (DraftsInGroup, ReleasesRow, ObservesHidden))
    assert issubclass(ConstrainedProposer, Wrapper) and issubclass(TimedProposer, Wrapper)


def test_the_engine_names_no_stateful_method() -> None:
    """Engine attaches, reports (/health, /metrics) and looks up every stateful method
    through the registry's Lifecycle: engine/engine.py spells no such method's name."""
    from jumpahead.engine.methods import registry

    names = {m.name for m in registry.stateful()}
    assert {"draft", "drafter", "mtp"} <= names
    tree = dict(_trees())["engine/engine.py"]
    found = [f"engine/engine.py:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in names]
    assert not found, found
