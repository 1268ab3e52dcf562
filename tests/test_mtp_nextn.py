"""The DeepSeek-V3 layout of checkpoint-native MTP (engine/methods/mtp_nextn.py) on tiny
random-weight deepseek_v3, glm4_moe and glm4_moe_lite models saved as Hugging Face
folders whose MTP layer is `model.layers.{N}.*` of the real names
(bench/family_models.build_hf_with_nextn), read by the real loading code.

Oracles: the loaded MTP parameters are the saved tensors (experts stacked, MLA's
kv_b_proj split as mlx-lm splits the trunk's); drafted rows equal ordinary decoding at
B=1, 2 and 4 (greedy), and a predictable MTP layer gets drafts accepted; random MTP
weights are rejected exactly; every grouped row's draft equals the per-row path's.
"""

from __future__ import annotations

import pytest

import mlx.core as mx
from mlx.utils import tree_flatten

from jumpahead.bench.family_models import NEXTN_FAMILIES, _nextn_to_hf, build_hf_with_nextn
from jumpahead.engine.methods.mtp_nextn import NextnHead, read_nextn_weights
from jumpahead.engine.types import GenerationRequest
from tests.serving import chat_prompt, frozen_width_policy, run_rows
from tests.test_mtp import TEXTS, check_rejected_exactly
from tests.test_mtp_group import Shadowed

TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(fam, predictable) -> (folder, an engine with its MTP layer); one engine alive at a time."""
    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    root = tmp_path_factory.mktemp("nextn-families")
    tok = ensure_default_model(progress=lambda s: None)
    made: dict = {}

    def get(fam: str, predictable: bool = False):
        key = (fam, predictable)
        if key not in made:
            for _, eng in made.values():
                eng.close()
            made.clear()
            folder = build_hf_with_nextn(fam, root, tok, predictable=predictable)
            model, tokenizer, info = load_model(str(folder), progress=lambda s: None)
            eng = Engine(model, tokenizer, info, EngineConfig(max_batch=4, prefix_cache=False, method_specs={"mtp": "auto"},
                                                              objective="latency", warm_up=False))
            eng.scheduler.width_policy = frozen_width_policy()
            made[key] = (folder, eng)
        return made[key]

    yield get
    for _, eng in made.values():
        eng.close()


def prompts(eng, n: int) -> list[list[int]]:
    return [chat_prompt(eng.tokenizer, t) for t in TEXTS[:n]]


@pytest.mark.parametrize("fam", NEXTN_FAMILIES)
def test_loader_keeps_the_saved_mtp_layer(served, fam):
    """mlx-lm's loader drops model.layers.{N}; ours reads it, and the engine's MTP layer
    holds the saved tensors (in mlx-lm's layout: experts stacked, kv_b_proj split)."""
    folder, eng = served(fam)
    prefix = f"model.layers.{eng.model.args.num_hidden_layers}."
    saved = read_nextn_weights(folder, prefix)
    assert {prefix + n for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                                 "shared_head.head.weight", "embed_tokens.weight")} <= set(saved)
    assert isinstance(eng.method_state("mtp").head, NextnHead)
    params = dict(tree_flatten(eng.method_state("mtp").head.parameters()))
    back = _nextn_to_hf({prefix + k.removeprefix("layers.0."): v for k, v in params.items()})
    del saved[prefix + "embed_tokens.weight"]  # the target's own table is used
    assert set(back) == set(saved)
    for name, value in saved.items():
        assert mx.array_equal(back[name], value.astype(back[name].dtype)), name
    assert not any(k.startswith(prefix.removeprefix("model.")) for k in dict(tree_flatten(eng.model.model.parameters())))


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("fam", NEXTN_FAMILIES)
def test_greedy_with_mtp_equals_ordinary(served, fam, batch):
    _, eng = served(fam, predictable=True)
    ps = prompts(eng, batch)
    plain = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["none"]) for p in ps])
    shadows = [Shadowed(eng.method_state("mtp").group) for _ in ps]
    drafted = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["none"], proposers=[s])
                             for p, s in zip(ps, shadows)])
    assert [o["tokens"] for o in drafted] == [o["tokens"] for o in plain]
    stats = [o["fill"]["methods"]["mtp"] for o in drafted]
    assert all(m["proposals"] > 0 for m in stats), stats
    assert sum(m["accepted"] for m in stats) > 0, "the predictable MTP layer never landed a token"
    pairs = [pair for s in shadows for pair in s.pairs]
    assert pairs and all(g == a for g, a in pairs), "a grouped draft differs from the row drafted alone"


@pytest.mark.parametrize("fam", NEXTN_FAMILIES)
def test_random_mtp_weights_are_rejected_exactly(served, fam):
    check_rejected_exactly(served(fam)[1])
