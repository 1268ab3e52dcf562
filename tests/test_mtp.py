"""Checkpoint-native MTP (engine/methods/mtp.py) on tiny random-weight qwen3_next and qwen3_5
models saved as Hugging Face format folders with `mtp.*` tensors of the real names and
shapes (bench/family_models.build_hf_with_mtp), read by the real loading code.

Oracles: the loaded MTP parameters are the saved tensors (norms shifted, experts
stacked); drafted rows equal ordinary decoding token for token at B=1, 2 and 4
(greedy) and under seeded sampling; a "predictable" model (a nearly-bigram trunk and an
MTP layer that computes that bigram) gets drafts accepted and rejected; after a run
with rejections the MTP cache holds, at every committed position t, exactly the entry a
fresh forward computes from (the target's hidden state at t, the embedding of x_{t+1});
a folder without mtp weights serves as before.
"""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx
from mlx.utils import tree_flatten

from jumpahead.bench.family_models import MTP_FAMILIES, build, build_hf_with_mtp
from jumpahead.engine.methods.mtp import MtpCache, MtpProposer, read_mtp_weights
from jumpahead.engine.types import EngineError, GenerationRequest, SamplingParams
from tests.serving import chat_prompt, frozen_width_policy, run_rows

TEXTS = ["Write a Python function that adds two numbers.", "Explain in one sentence why the sky is blue.",
         "List the steps to make tea.", "What is 17 times 23?"]
TOKENS = 24


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from jumpahead.engine.model.default_model import ensure_default_model

    root = tmp_path_factory.mktemp("mtp-families")
    tok = ensure_default_model(progress=lambda s: None)
    return lambda fam, predictable=False: build_hf_with_mtp(fam, root, tok, predictable=predictable)


@pytest.fixture(scope="module")
def served(folders):
    """(fam, predictable) -> an engine with the folder's MTP layer (one engine alive at a time)."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    made: dict = {}

    def get(fam: str, predictable: bool = False):
        key = (fam, predictable)
        if key not in made:
            for eng in made.values():
                eng.close()
            made.clear()
            model, tok, info = load_model(str(folders(fam, predictable)), progress=lambda s: None)
            # every row drafts every round (latency objective, default costs frozen)
            eng = Engine(model, tok, info, EngineConfig(max_batch=4, prefix_cache=False, method_specs={"mtp": "auto"},
                                                        objective="latency", warm_up=False))
            eng.scheduler.width_policy = frozen_width_policy()
            made[key] = eng
        return made[key]

    yield get
    for eng in made.values():
        eng.close()


def prompts(eng, n: int) -> list[list[int]]:
    return [chat_prompt(eng.tokenizer, t) for t in TEXTS[:n]]


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_loader_keeps_the_saved_mtp_weights(folders, served, fam):
    """mlx-lm's loader drops mtp.*; ours reads them, and the engine's MTP layer holds the
    saved tensors (zero-centred norms + 1, per-expert tensors stacked)."""
    folder = folders(fam)
    saved = {k: v for k, v in mx.load(str(folder / "model.safetensors")).items() if k.startswith("mtp.")}
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= set(saved)
    raw, hf = read_mtp_weights(folder)
    assert hf and set(raw) == set(saved)
    eng = served(fam)
    assert eng.method_state("mtp") is not None
    params = dict(tree_flatten(eng.method_state("mtp").head.parameters()))
    dim = eng.method_state("mtp").head.fc.weight.shape[0]
    assert eng.method_state("mtp").head.fc.weight.shape == (dim, 2 * dim)
    checked = 0
    for name, value in saved.items():
        key = name.removeprefix("mtp.")
        if ".experts." in key:  # layers.0.mlp.experts.E.proj.weight -> switch_mlp.proj.weight[E]
            head, _, rest = key.partition(".experts.")
            e, _, proj = rest.partition(".")
            got = params[f"{head}.switch_mlp.{proj}"][int(e)]
        else:
            got = params[key]
            if value.ndim == 1 and "norm" in key:
                value = value + 1.0
        assert got.shape == value.shape and mx.array_equal(got, value.astype(got.dtype)), name
        checked += 1
    assert checked == len(saved)
    # the trunk was loaded without them (mlx-lm's sanitize dropped mtp.*)
    trunk = dict(tree_flatten(eng.model.parameters()))
    assert not any("mtp" in k for k in trunk)


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_greedy_with_mtp_equals_ordinary(served, fam, batch):
    eng = served(fam, predictable=True)
    ps = prompts(eng, batch)
    plain = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["none"]) for p in ps])
    drafted = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["mtp"]) for p in ps])
    assert [o["tokens"] for o in drafted] == [o["tokens"] for o in plain]
    stats = [o["fill"]["methods"]["mtp"] for o in drafted]
    assert all(m["proposals"] > 0 for m in stats), stats


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_random_mtp_weights_are_rejected_exactly(served, fam):
    """Random MTP weights: nearly every draft is rejected, and the rows still equal ordinary decoding."""
    check_rejected_exactly(served(fam))


def check_rejected_exactly(eng) -> None:
    ps = prompts(eng, 2)
    plain = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["none"]) for p in ps])
    drafted = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["mtp"]) for p in ps])
    assert [o["tokens"] for o in drafted] == [o["tokens"] for o in plain]
    m = drafted[0]["fill"]["methods"]["mtp"]
    assert m["proposals"] > 0 and m["proposed"] > m["accepted"]


def check_entries_are_the_targets(eng, seq: list[int], n: int, keys, values) -> None:
    """MTP entries (numpy [H, >=n, D], positions 0..) at positions < n equal a fresh
    forward of the MTP layer over (mlx-lm's own hidden state of the target at t, the
    embedding of x_{t+1})."""
    toks = mx.array([seq[: n + 1]], dtype=mx.int32)
    fresh = MtpCache(0)
    eng.method_state("mtp").head(eng.model.model(toks[:, :n]), eng.method_state("mtp").embed(toks[:, 1:]), fresh)
    for got, want in zip((keys, values), fresh.kv.keys_and_values()):
        got, want = np.asarray(got)[..., :n, :], np.array(want[0, ..., :n, :].astype(mx.float32))
        assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max(), "an MTP entry not from the target's state"


def two_turns(eng, proposer, first_method: str = "none", between=None) -> tuple[list[int], dict]:
    """Turn 1 (with `first_method`), then turn 2 (turn 1's prompt and answer, then
    more) ordinary and with `proposer(engine)`: equal outputs. `between(engine)` may
    return another engine for turn 2 (a restart). Returns (turn 2's prompt, its row)."""
    first = chat_prompt(eng.tokenizer, TEXTS[0])
    answer = run_rows(eng, [GenerationRequest(prompt=first, max_tokens=12, methods=[first_method])])[0]["tokens"]
    eng.flush_prefix_cache()
    eng = between(eng) if between is not None else eng
    second = first + answer + chat_prompt(eng.tokenizer, TEXTS[1])
    plain = run_rows(eng, [GenerationRequest(prompt=second, max_tokens=TOKENS, methods=["none"])])[0]
    drafted = run_rows(eng, [GenerationRequest(prompt=second, max_tokens=TOKENS, methods=["none"],
                                               proposers=[proposer(eng)])])[0]
    assert drafted["tokens"] == plain["tokens"]
    return second, drafted


def cache_engine(folders, tmp_path, ssd: bool = False):
    """An engine on the predictable qwen3_next folder with a prefix cache under tmp_path."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    model, tok, info = load_model(str(folders("qwen3_next", True)), progress=lambda s: None)
    eng = Engine(model, tok, info, EngineConfig(max_batch=2, method_specs={"mtp": "auto"}, objective="latency", warm_up=False,
                                                prefix_cache_ssd=ssd, prefix_cache_dir=str(tmp_path)))
    eng.scheduler.width_policy = frozen_width_policy()
    return eng


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_seeded_sampling_picks_the_targets_tokens(served, fam):
    eng = served(fam, predictable=True)
    ps = prompts(eng, 2)
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    plain = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["none"], sampling=sampling)
                           for p in ps])
    drafted = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["mtp"], sampling=sampling)
                             for p in ps])
    assert [o["tokens"] for o in drafted] == [o["tokens"] for o in plain]
    assert sum(o["fill"]["methods"]["mtp"]["proposals"] for o in drafted) > 0


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_drafts_are_accepted_and_rejected_and_counted(served, fam):
    """The predictable model: MTP lands tokens (kind 'mtp') and misses some (rollback);
    usage.fill's per-method telemetry adds up and /metrics aggregates it."""
    eng = served(fam, predictable=True)
    before = dict(eng.metrics().get("methods", {}).get("mtp", {"proposals": 0}))
    out = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=48, methods=["mtp"]) for p in prompts(eng, 2)])
    for o in out:
        m = o["fill"]["methods"]["mtp"]
        hist = m["accepted_histogram"]
        assert sum(hist) == m["proposals"] > 0
        assert sum(i * n for i, n in enumerate(hist)) == m["accepted"] == o["kinds"].count("mtp")
    total = {k: sum(o["fill"]["methods"]["mtp"][k] for o in out) for k in ("proposals", "proposed", "accepted")}
    assert total["accepted"] > 0, "the MTP layer that computes the target's bigram never landed a token"
    assert total["proposed"] > total["accepted"], "no draft was rejected: rollback not exercised"
    assert eng.metrics()["methods"]["mtp"]["proposals"] - before["proposals"] == total["proposals"]


class Watched(MtpProposer):
    """Records the pending position of every draft (so the test knows which entries are committed)."""

    def __init__(self, mtp) -> None:
        super().__init__(mtp)
        self.drafted_at: list[int] = []

    def propose(self, view, max_len):
        prop = super().propose(view, max_len)
        if prop is not None:
            self.drafted_at.append(len(view.tokens) - 1)
        return prop


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_mtp_cache_holds_the_entries_of_the_targets_states(served, fam):
    """After a run with accepted and rejected drafts (a neighbour row in the batch), the
    MTP cache's entry at every committed position t equals a fresh forward of the MTP
    layer over (mlx-lm's own hidden state of the target at t, embedding of x_{t+1})."""
    eng = served(fam, predictable=True)
    watched = Watched(eng.method_state("mtp"))
    ps = prompts(eng, 2)
    out = run_rows(eng, [GenerationRequest(prompt=ps[0], max_tokens=40, methods=["none"], proposers=[watched]),
                         GenerationRequest(prompt=ps[1], max_tokens=40, methods=["mtp"])])
    m = out[0]["fill"]["methods"]["mtp"]
    assert m["accepted"] > 0 and m["proposed"] > m["accepted"] and len(watched.drafted_at) > 3
    n = watched.drafted_at[-1]  # entries 0..n-1 are the targets' (n..: the last draft's guesses)
    seq = ps[0] + out[0]["tokens"]
    cache = watched.cache
    assert cache.start == 0 and cache.offset >= n
    check_entries_are_the_targets(eng, seq, n, *(np.array(a[0].astype(mx.float32)) for a in cache.kv.keys_and_values()))


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_folder_without_mtp_weights_serves_as_before(tmp_path, fam):
    """An mlx-lm folder (no mtp.*) with --mtp auto: no MTP, ordinary serving unchanged,
    and method 'mtp' refused with the reason."""
    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    folder = build(fam, tmp_path, ensure_default_model(progress=lambda s: None))
    assert read_mtp_weights(folder) is None
    model, tok, info = load_model(str(folder), progress=lambda s: None)
    outs = []
    for mtp in ("auto", None):
        eng = Engine(model, tok, info, EngineConfig(max_batch=2, prefix_cache=False, method_specs={"mtp": mtp}, warm_up=False))
        try:
            assert eng.method_state("mtp") is None and not eng.runner.keep_all_hidden
            p = chat_prompt(tok, TEXTS[0])
            outs.append(run_rows(eng, [GenerationRequest(prompt=p, max_tokens=12, methods=["echo"])])[0]["tokens"])
            with pytest.raises(EngineError, match="mtp"):
                eng.validate(GenerationRequest(prompt=p, max_tokens=4, methods=["mtp"]))
        finally:
            eng.close()
    assert outs[0] == outs[1]


def _mtp_measurement(saved: list[float]) -> dict:
    """A live A/B record of `default+mtp` against `default` (the figures of
    live/summary.py, as live/drafter_measurement.py writes a drafter's): per seed the
    mtp arm `saved[i]` s faster, every output equal, every task solved."""
    from jumpahead.live.summary import summarize

    def rec(arm: str, seed: int, model_s: float) -> dict:
        turn = {"wall_s": model_s, "completion_tokens": 10, "content": f"said {seed}", "calls": [],
                "fill": {"tokens": {"sampled": 10}}, "timings": {"prefill_s": 0.1, "decode_s": model_s - 0.1,
                                                                 "rounds": 1, "round_ms": [[100.0, 1]]}}
        return {"arm": arm, "seed": seed, "success": True, "status": "answered", "wall_s": model_s, "turns": [turn]}

    records = []
    for seed, gain in enumerate(saved):
        records += [rec("ordinary", seed, 9.0), rec("default", seed, 5.0), rec("default+mtp", seed, 5.0 - gain)]
    summary = summarize(records, ["ordinary", "default", "default+mtp"])
    return {"kind": "jumpahead.mtp.measurement", "version": 1, "arm": "default+mtp",
            "versus": summary["versus"]["default+mtp"], "adapter": None}


def test_serve_adds_mtp_to_the_defaults_only_where_measured_to_pay(served, folders, caplog):
    """`serve` loads the MTP layer but adds method "mtp" to the defaults only where a
    measurement beside the MTP weights (mtp_measured.json) shows it paying, as a
    drafter's; the log and /health say why it is off. `--methods mtp` still runs it."""
    import json
    import logging

    from jumpahead.engine.methods.drafter import MIN_PAIRED_TASKS
    from jumpahead.engine.methods.registry import attach_methods, parse_methods
    from jumpahead.engine.methods.mtp import MEASURED

    def attach_mtp(eng, spec: str, explicit_methods: bool) -> None:  # as serve's --mtp SPEC [--methods]
        attach_methods(eng, {"mtp": spec}, measured_defaults=not explicit_methods)

    eng = served("qwen3_5", predictable=True)
    folder = folders("qwen3_5", predictable=True)
    saved = eng.config.default_methods
    try:
        # no measurement: loaded (EngineConfig mtp="auto"), opt-in only, and said why
        assert eng.method_state("mtp") is not None and not (folder / MEASURED).exists()
        eng.config.default_methods = parse_methods(None)
        with caplog.at_level(logging.INFO, logger="jumpahead.methods"):
            assert attach_mtp(eng, "none", explicit_methods=False) is None
        assert eng.config.default_methods == ("echo",)
        assert "mtp off by default: no measurement" in caplog.text
        health = eng.health()["mtp"]
        assert health["folder"] == str(folder.resolve()) and health["by_default"]["on"] is False
        assert MEASURED in health["by_default"]["why"]
        # a measurement that does not pay (too few tasks) leaves it off
        gains = [1.0 + 0.1 * (i % 5) for i in range(MIN_PAIRED_TASKS)]
        (folder / MEASURED).write_text(json.dumps(_mtp_measurement(gains[:5])))
        assert attach_mtp(eng, str(folder), explicit_methods=False) is None  # loads it (and the record) again
        assert eng.config.default_methods == ("echo",)
        assert "paired tasks measured" in eng.health()["mtp"]["by_default"]["why"]
        # a paying one turns it on for requests that name no methods ...
        (folder / MEASURED).write_text(json.dumps(_mtp_measurement(gains)))
        assert attach_mtp(eng, str(folder), explicit_methods=False) is None
        assert eng.config.default_methods == ("echo", "mtp")
        assert eng.health()["mtp"]["by_default"]["on"] is True
        # ... but not where --methods chose the defaults
        eng.config.default_methods = parse_methods("echo")
        assert attach_mtp(eng, "none", explicit_methods=True) is None
        assert eng.config.default_methods == ("echo",) and eng.health()["mtp"]["by_default"]["on"] is False
    finally:
        (folder / MEASURED).unlink(missing_ok=True)
    try:
        # --methods mtp (no measurement): the requests that name none draft with it
        eng.config.default_methods = parse_methods("mtp")
        assert attach_mtp(eng, str(folder), explicit_methods=True) is None
        assert eng.config.default_methods == ("mtp",) and eng.health()["mtp"]["by_default"]["on"] is True
        p = prompts(eng, 1)[0]
        got = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS)])[0]
        want = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=TOKENS, methods=["off"])])[0]
        assert got["fill"]["methods"]["mtp"]["proposals"] > 0 and got["tokens"] == want["tokens"]
    finally:
        eng.config.default_methods = saved


def test_prompt_cache_hit_drafts_from_the_positions_it_runs(folders, tmp_path):
    """A second turn from the prefix cache: the row's MTP context starts at the first
    position the target runs (no hidden states exist before it), and the output is
    still ordinary decoding's."""
    eng = cache_engine(folders, tmp_path)
    try:
        watched = Watched(eng.method_state("mtp"))
        second, _ = two_turns(eng, lambda e: watched)
        assert watched.drafted_at and 0 < watched.cache.start < len(second), "the second turn did not hit the cache"
    finally:
        eng.close()
