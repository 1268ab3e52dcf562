"""A stateful method is one registry entry (engine/methods/registry.py Method + Lifecycle).

The method `memo` below is registered alone, in this test: no Engine, serve or scheduler
code names it. Its state (a `Plan`, loaded from a spec file) is loaded and attached by
the one path every engine runs (EngineConfig.method_specs, engine/methods/registry.py
attach_methods), joins the defaults by its measured rule, and keeps per-row state in
the prefix cache through its companion; /health and /metrics report it through its
lifecycle (no engine code names it). Its proposer proposes, for a prompt it has seen,
the tokens that prompt produced before (verified: accepted where the model agrees).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest

from jumpahead.engine.methods import registry as methods
from jumpahead.engine.methods.registry import Lifecycle, Method, MethodError, attach_methods, register, unregister
from jumpahead.engine.methods.proposal import Proposal, RowView, unwrapped

NAME = "memo"


class Plan:
    """The method's state: what each prompt produced, and what its lifecycle saw."""

    def __init__(self, label: str, pays: bool) -> None:
        self.label = label
        self.pays = pays
        self.memo: dict[tuple[int, ...], list[int]] = {}
        self.engine: Any = None
        self.captures: list[int] = []
        self.restores: list[int] = []
        self.proposed = 0


class MemoProposer:
    name = NAME

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.restored: int | None = None  # the prefix-cache hit this row's state came from

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        prompt, out = tuple(view.tokens[: view.prompt_len]), list(view.tokens[view.prompt_len :])
        known = self.plan.memo.get(prompt)
        if known is None or len(out) > len(known):  # learn what this prompt produces
            self.plan.memo[prompt] = known = out
        rest = known[len(out) : len(out) + max_len]
        if not rest:
            return None
        self.plan.proposed += len(rest)
        return Proposal(list(rest), NAME)

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass


class MemoCompanion:
    """Keeps how far each row had got beside the target's KV (a real CompanionHook)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.name = f"memo-{plan.label}"

    @staticmethod
    def _member(row: Any) -> MemoProposer | None:
        return next((p for p in map(unwrapped, row.proposers) if isinstance(p, MemoProposer)), None)

    def capture(self, row: Any, length: int) -> dict[str, mx.array] | None:
        if self._member(row) is None:
            return None
        self.plan.captures.append(length)
        return {"length": mx.array([length], dtype=mx.int32)}

    def restore(self, row: Any, state: dict[str, mx.array], length: int) -> None:
        p = self._member(row)
        if p is not None and int(state["length"].item()) == length:
            p.restored = length
            self.plan.restores.append(length)


def _load(engine: Any, spec: str) -> Plan:
    meta = json.loads(Path(spec).read_text())  # OSError / ValueError: refused with the refusal
    return Plan(meta["label"], bool(meta.get("pays")))


def _attach(engine: Any, plan: Plan) -> Plan:
    plan.engine = engine
    return plan


@pytest.fixture
def memo():
    register(Method(NAME, NAME, True, "test: what the prompt produced before",
                    lambda engine, req: MemoProposer(engine.method_state(NAME)),
                    needs=lambda engine: None if engine.method_state(NAME) else "method 'memo' needs a plan",
                    lifecycle=Lifecycle(_load, "cannot use memo plan {spec}", attach=_attach, companion=MemoCompanion,
                                        measured=lambda engine, plan: (plan.pays, f"plan {plan.label} says so"),
                                        health=lambda engine, plan: {"label": plan.label},
                                        metrics=lambda plan: {"memo_plan": {"proposed": plan.proposed}})))
    try:
        yield
    finally:
        unregister(NAME)
    assert NAME not in methods.known()


def test_a_stateful_method_registered_alone_is_loaded_attached_served_and_cached(memo, loaded_model, tmp_path):
    from jumpahead.app.cli import build_parser
    from jumpahead.app.serve import engine_config
    from jumpahead.engine.engine import Engine

    from .serving import frozen_width_policy, serve

    spec = tmp_path / "plan.json"
    spec.write_text(json.dumps({"label": "p1", "pays": False}))
    args = build_parser("serve").parse_args(["serve", "--methods", f"{NAME},echo", "--no-ssd-cache", "--drafter",
                                             "none", "--mtp", "none", "--objective", "latency", "--no-cost-aware"])
    config, names = engine_config(args)
    assert names == (NAME, "echo")  # --methods knows it: the registry's name
    config.method_specs[NAME] = str(spec)  # what its --flag would carry
    config.warm_up = False
    model, tokenizer, info = loaded_model
    eng = Engine(model, tokenizer, info, config)
    try:
        plan = eng.method_state(NAME)
        assert isinstance(plan, Plan) and plan.label == "p1" and plan.engine is eng  # loaded, attached
        assert any(isinstance(h, MemoCompanion) for h in eng.prefix_cache.hooks)  # its companion registered
        assert eng.method_defaults[NAME]["on"] is True  # --methods named it (measurement: no)
        eng.scheduler.width_policy = frozen_width_policy()
        body = {"model": "m", "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
                "max_tokens": 24, "temperature": 0}
        with serve(eng) as url:
            def ask(extra: dict | None = None) -> tuple[str, dict]:
                r = httpx.post(f"{url}/v1/chat/completions", json={**body, **(extra or {})}, timeout=120)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["message"]["content"], r.json()["usage"]["fill"]

            plain, _ = ask({"jumpahead": {"methods": ["none"]}})
            # (a) --methods: a request naming none runs memo; its first turn learns the prompt's answer
            first, _ = ask()
            assert first == plain and plan.memo and plan.captures  # published with memo's state
            captured = len(plan.captures)
            # (b) a request's methods: the same prompt again, memo proposes what it produced (verified)
            again, fill = ask({"jumpahead": {"methods": [NAME, "none"]}})
            assert again == plain
            assert fill["tokens"].get(NAME, 0) > 0 and fill["methods"][NAME]["accepted"] > 0, fill
            assert plan.proposed > 0 and len(plan.captures) > captured
            # (c) the prefix cache: the next turn of the conversation hits what the last one
            # published, and memo's own per-row state comes back from the hit with it
            follow = {"messages": [*body["messages"], {"role": "assistant", "content": again},
                                   {"role": "user", "content": "Now backwards."}]}
            ask({**follow, "jumpahead": {"methods": [NAME, "none"]}})
            assert plan.restores and plan.restores[-1] in plan.captures, (plan.restores, plan.captures)
            assert httpx.get(f"{url}/metrics.json").json()["engine"]["methods"][NAME]["accepted"] > 0
            # (d) reported by its lifecycle alone: /health under its name, /metrics its own entries
            assert httpx.get(f"{url}/health").json()[NAME] == {"label": "p1"}
            assert httpx.get(f"{url}/metrics.json").json()["engine"]["memo_plan"] == {"proposed": plan.proposed}
        # the measured rule, by the same generic code: a plan that pays joins the defaults
        # of an engine whose methods were not chosen (serve without --methods)
        spec.write_text(json.dumps({"label": "p2", "pays": True}))
        eng.config.default_methods = ("echo",)
        attach_methods(eng, {NAME: str(spec)}, measured_defaults=True)
        assert eng.method_state(NAME).label == "p2" and eng.config.default_methods == ("echo", NAME)
        assert eng.method_defaults[NAME] == {"on": True, "why": "plan p2 says so"}
        hooks = [h for h in eng.prefix_cache.hooks if isinstance(h, MemoCompanion)]
        assert [h.name for h in hooks] == ["memo-p2"]  # the new state's companion replaced the old one
        # a spec it cannot load is refused by name, with the reason
        with pytest.raises(MethodError, match="cannot use memo plan .*missing"):
            attach_methods(eng, {NAME: str(tmp_path / "missing.json")})
    finally:
        eng.close()


def test_the_defaults_naming_a_stateful_method_without_state_are_refused(memo, loaded_model):
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    with pytest.raises(MethodError, match="method 'memo' needs a plan"):
        Engine(model, tokenizer, info, EngineConfig(default_methods=(NAME,), prefix_cache=False, warm_up=False))
    with pytest.raises(MethodError, match="no stateful method 'echo'"):
        Engine(model, tokenizer, info, EngineConfig(method_specs={"echo": "x"}, prefix_cache=False, warm_up=False))
