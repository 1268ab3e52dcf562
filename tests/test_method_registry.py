"""The method registry (engine/methods/registry.py) is the one list of proposal methods.

Token kinds, `--methods` names, the engine's proposers, the verified/asserted split and
the replay and live arms all come from it: a method registered here (a small real
proposer, below) is usable by name through parse_methods, a request's methods, a replay
arm and a live arm, and its tokens carry its own kind out of the real engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jumpahead.engine.methods import registry as methods
from jumpahead.engine.methods.registry import Method, MethodArm, describe, known, parse_methods, register, token_kinds, unregister
from jumpahead.engine.methods.proposal import ASSERTED_KINDS, VERIFIED_KINDS, Proposal, RowView
from jumpahead.engine.types import EngineError, GenerationRequest
from jumpahead.live.arms import parse_live_arm
from jumpahead.traces.arms import ARMS, parse_arm

REPO = Path(__file__).resolve().parents[1]


def test_every_name_and_kind_comes_from_the_registry() -> None:
    names = set(methods.REGISTRY)
    assert known() == ("echo", "ngram", "draft", "drafter", "mtp", "strict")  # the --methods names
    assert set(token_kinds()) == {"sampled", "strict", "echo", "ngram", "draft", "drafter", "mtp", "jump", "scripted"}
    assert set(token_kinds()) == {"sampled"} | {m.kind for m in methods.REGISTRY.values()}
    assert VERIFIED_KINDS == {"echo", "ngram", "draft", "drafter", "mtp"} and ASSERTED_KINDS == {"strict", "jump", "scripted"}
    for name in known():
        assert parse_methods(name) == (name,) and name in describe((name,))
    # every replay arm runs registered methods only (and `none`)
    assert list(ARMS) == ["ordinary", "echo", "ngram", "drafter", "strict", "strict-asserted"]
    for arm, spec in ARMS.items():
        assert set(spec.methods) <= names | methods.OFF, arm
    assert ARMS["echo"].methods == ["echo", "none"] and ARMS["strict"].methods == ["strict"]
    assert ARMS["strict-asserted"].asserted_strict


def _method_literals(path: Path) -> list[int]:
    """Lines of `path` with a tuple/list/set/dict literal of method names only (two or
    more; `none`/`off` aside): a vocabulary of its own. (A choice of arms, such as
    live/arms.py ALL_ARMS, names policies and arms too, and is not one.)"""
    names = set(methods.REGISTRY)
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
        strings = {k.value for k in items if isinstance(k, ast.Constant) and isinstance(k.value, str)} - methods.OFF
        if len(strings) >= 2 and strings <= names | {"sampled"}:
            lines.append(node.lineno)
    return lines


def test_no_other_module_lists_the_methods() -> None:
    """Outside the registry no source file spells out a list of method names."""
    found = {}
    for pkg in ("engine", "proxy", "policies", "traces", "live"):
        for f in sorted((REPO / pkg).rglob("*.py")):
            if f == REPO / "engine" / "methods" / "registry.py":
                continue
            lines = _method_literals(f)
            if lines:
                found[str(f.relative_to(REPO))] = lines
    assert not found, f"method names listed outside engine/methods/registry.py: {found}"


class ReplayProposer:
    """A real verified proposer: proposes, from a fixed continuation, the tokens that
    follow what the row has emitted so far (accepted where the model agrees)."""

    name = "replaycopy"

    def __init__(self, continuation: list[int]) -> None:
        self.continuation = continuation

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        done = len(view.tokens) - view.prompt_len
        rest = self.continuation[done : done + max_len]
        return Proposal(list(rest), "replaycopy") if rest else None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass


@pytest.fixture
def replaycopy():
    """Register method `replaycopy` for one test (its factory reads the continuation
    the test sets on the request's id)."""
    plans: dict[str, list[int]] = {}
    register(Method("replaycopy", "replaycopy", True, "test: a fixed continuation",
                    lambda engine, req: ReplayProposer(plans[req.request_id]),
                    arms=(MethodArm("replaycopy", "test: a fixed continuation, verified"),)))
    try:
        yield plans
    finally:
        unregister("replaycopy")
    assert "replaycopy" not in known() and "replaycopy" not in ARMS and "replaycopy" not in VERIFIED_KINDS


def test_a_registered_method_is_usable_by_name(replaycopy) -> None:
    assert parse_methods("replaycopy,echo") == ("replaycopy", "echo")
    assert "replaycopy" in token_kinds() and "replaycopy" in VERIFIED_KINDS
    assert "replaycopy" in ARMS and parse_arm("replaycopy").methods == ["replaycopy", "none"]
    assert parse_arm("strict+replaycopy").methods == ["strict", "replaycopy"]
    live = parse_live_arm("replaycopy")
    assert live.request_field() == {"methods": ["replaycopy", "none"]} and live.serve_args() == ["--methods", "none", "--drafter", "none"]
    with pytest.raises(ValueError, match="already registered"):
        register(Method("replaycopy", "replaycopy", True))


def test_a_registered_method_runs_in_the_engine(replaycopy, engine) -> None:
    prompt = engine.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
    plain = engine.generate_sync(GenerationRequest(prompt, max_tokens=24, methods=["none"]))
    tokens = [t for c in plain for t in c.tokens]
    req = GenerationRequest(prompt, max_tokens=24, methods=["replaycopy", "none"])
    replaycopy[req.request_id] = tokens
    chunks = engine.generate_sync(req)
    assert [t for c in chunks for t in c.tokens] == tokens  # verified: ordinary decoding's output
    kinds = [k for c in chunks for k in c.kinds]
    assert kinds.count("replaycopy") >= len(tokens) // 2, kinds
    assert set(kinds) <= set(token_kinds())
    with pytest.raises(EngineError, match="unknown proposal method 'warp'"):
        engine.validate(GenerationRequest(prompt, methods=["warp"]))
    # a name that is a kind but no --methods name is refused too
    with pytest.raises(EngineError, match="unknown proposal method 'jump'"):
        engine.validate(GenerationRequest(prompt, methods=["jump"]))
