"""Draft, drafter and MTP composed with a quantized KV cache (--kv-bits, issue 41).

Under --kv-bits only the target's attention KV is quantized: the draft model runs its
own ModelRunner (engine/methods/draft_model.py, full-precision KV), the drafter reads the target's
hidden state and keeps no KV, and the MTP layer keeps its own full-precision cache
(engine/methods/mtp_group.py RowKVCache(1)). What must hold is that the target verifies the
proposals over its quantized KV exactly as it decodes without them: the rows equal
ordinary decoding under the same format, alone and at B=4 with staggered arrivals,
while the method really proposes and gets tokens accepted (the rows' own usage.fill
counts and the tokens' kinds, not a mock).

Subjects (tiny random weights, heads 64 wide so keys and values group by 64):
- "draft": the tiny llama (`size="kv"`), itself as its own draft model (full-precision
  draft KV against the quantized target: most drafts land, some miss);
- "drafter": the predictable qwen3_next (a nearly-bigram trunk, build_hf_with_mtp
  predictable=True) with a drafter built to compute that bigram from the embedding of
  the pending token (fc passes the embedding half, the model's own final norm and
  lm_head);
- "mtp": the same folder's MTP layer (computes the same bigram).

Also: random MTP weights (the trunk at full strength, so the format's rounding matters)
rejected and rolled back exactly; a second turn restoring the draft's / MTP layer's
state stored beside the quantized prefix (RAM, then SSD after a restart); and `jumpahead
serve --kv-bits 8 --methods ...` parsing and attaching each method (app/serve.py).

A divergence is accepted only as test_kv_quant accepts it: the reference's top two
within QUANT_TIE over a single forward of the same quantized cache (none was needed
when this was written: every row came out identical).
"""

from __future__ import annotations

import asyncio
import time

import mlx.core as mx
import pytest

from jumpahead.bench.family_models import build, build_hf_with_mtp
from jumpahead.engine.kv.kv_format import KVFormat, parse_kv_format
from jumpahead.engine.types import GenerationRequest
from tests.oracle import assert_same_or_near_tie
from tests.serving import frozen_width_policy, run_rows
from tests.test_kv_quant import QUANT_TIE

TEXTS = [
    "Write a Python function that adds two numbers.",
    "List the files in the current folder, then explain what each one is for.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n# explain",
    "What is 17 times 23?",
]
N = 20
FORMATS = {"k8v8": KVFormat(8, 8), "k4v4": KVFormat(4, 4)}
METHODS = ["draft", "drafter", "mtp"]
# the folder each subject serves ("mtp-random": method "mtp" with random MTP weights)
SUBJECTS = {"draft": "llama", "drafter": "next", "mtp": "next", "mtp-random": "next-random"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from jumpahead.engine.model.default_model import ensure_default_model

    tok = ensure_default_model(progress=lambda s: None)
    root = tmp_path_factory.mktemp("kv-methods")
    return {"llama": lambda: build("llama", root, tok, size="kv"),
            "next": lambda: build_hf_with_mtp("qwen3_next", root, tok, predictable=True, size="kv"),
            "next-random": lambda: build_hf_with_mtp("qwen3_next", root, tok, size="kv")}


def bigram_drafter(model):
    """A Drafter that predicts the predictable model's next token from the pending one:
    x = rmsnorm(embed(token)) (fc passes the embedding half, the FFN adds nothing), then
    the target's own final norm and lm_head over the whole vocabulary."""
    from jumpahead.engine.methods.drafter import Drafter

    embed = model.model.embed_tokens.weight
    vocab, dim = embed.shape
    drafter = Drafter(dim, 8, vocab)
    head = model.lm_head.weight if hasattr(model, "lm_head") else embed
    drafter.fc.weight = mx.concatenate([mx.zeros((dim, dim)), mx.eye(dim)], axis=1)
    for layer in (drafter.gate, drafter.up, drafter.down):
        layer.weight = mx.zeros_like(layer.weight)
    drafter.norm_out.weight = model.model.norm.weight.astype(mx.float32)
    drafter.head.weight = head.astype(mx.float32)
    drafter.d2t = mx.arange(vocab, dtype=mx.int32)
    mx.eval(drafter.parameters())
    return drafter


@pytest.fixture(scope="module")
def served(folders):
    """(subject, format name) -> dict(engine, model, prompts, format, ordinary), one engine alive at a time."""
    from jumpahead.engine.methods.draft_model import DraftModel
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    made: dict[tuple, dict] = {}

    def get(subject: str, fmt: str) -> dict:
        key = (subject, fmt)
        method = subject.split("-")[0]
        if key not in made:
            for other in made.values():
                other["engine"].close()
            made.clear()
            folder = folders[SUBJECTS[subject]]()
            model, tok, info = load_model(str(folder), progress=lambda s: None)
            # every row drafts every round: proposals sized by the frozen default costs, not priced out
            eng = Engine(model, tok, info, EngineConfig(max_batch=4, cost_aware=False, objective="latency",
                                                        prefix_cache=False, warm_up=False,
                                                        kv_format=FORMATS[fmt],
                                                        method_specs={"mtp": "auto" if method == "mtp" else None}))
            eng.scheduler.width_policy = frozen_width_policy()
            if method == "draft":
                eng.attach("draft", DraftModel(model, tok, info, target_tokenizer=tok))
            elif method == "drafter":
                eng.attach("drafter", bigram_drafter(model))
            prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                       for t in TEXTS]
            made[key] = {"engine": eng, "model": model, "prompts": prompts, "format": FORMATS[fmt], "ordinary": {}}
        return made[key]

    yield get
    for f in made.values():
        f["engine"].close()


def ordinary(f: dict, i: int) -> list[int]:
    """Prompt i decoded alone with no method, under the engine's KV format."""
    if i not in f["ordinary"]:
        f["ordinary"][i] = run_rows(f["engine"], [GenerationRequest(prompt=f["prompts"][i], max_tokens=N,
                                                                    methods=["none"])])[0]["tokens"]
    return f["ordinary"][i]


def check(f: dict, i: int, got: list[int]) -> str:
    """got equals ordinary decoding of prompt i, or differs first at a near-tie of the
    single-forward reference over the same quantized cache (test_kv_quant)."""
    fmt = f["format"]
    return assert_same_or_near_tie(f["model"], f["prompts"][i], got, ordinary(f, i),
                                   tol=QUANT_TIE[min(fmt.key_bits, fmt.value_bits)],
                                   logits_fn=f["engine"].runner.fresh_logits)


def staggered_four(f: dict, method: str) -> list[dict]:
    """The four prompts with `method`, row i joining 0.05 * i s late: each row's tokens,
    kinds and final usage.fill."""
    async def one(i: int) -> dict:
        await asyncio.sleep(0.05 * i)
        tokens, kinds, fill = [], [], None
        async for chunk in f["engine"].stream(GenerationRequest(prompt=f["prompts"][i], max_tokens=N,
                                                               methods=[method])):
            tokens += chunk.tokens
            kinds += chunk.kinds
            if chunk.finish_reason is not None:
                assert chunk.error is None, chunk.error
                fill = chunk.fill
        return {"tokens": tokens, "kinds": kinds, "fill": fill}

    async def together():
        return await asyncio.gather(*[one(i) for i in range(4)])

    return asyncio.run(together())


def counts(rows: list[dict], method: str) -> dict[str, int]:
    """The rows' own telemetry for `method`, summed; each accepted token was emitted with its kind."""
    total = {"proposals": 0, "proposed": 0, "accepted": 0}
    for o in rows:
        m = o["fill"]["methods"][method]
        assert o["kinds"].count(method) == m["accepted"], (o["kinds"], m)
        for k in total:
            total[k] += m[k]
    return total


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("method", METHODS)
def test_method_alone_equals_ordinary_under_kv_bits(served, method, fmt):
    f = served(method, fmt)
    eng = f["engine"]
    assert eng.runner.kv_format == FORMATS[fmt]
    rows = [run_rows(eng, [GenerationRequest(prompt=f["prompts"][i], max_tokens=N, methods=[method])])[0]
            for i in (0, 2)]
    for i, o in zip((0, 2), rows):
        check(f, i, o["tokens"])
        assert o["fill"]["methods"][method]["proposals"] > 0, o["fill"]
    total = counts(rows, method)
    assert total["accepted"] > 0, f"{method} under {fmt}: no proposal ever landed ({total})"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("method", METHODS)
def test_method_staggered_four_equals_ordinary_under_kv_bits(served, method, fmt):
    """Four rows of different prompt lengths joining at different rounds, all with the method."""
    f = served(method, fmt)
    want = [ordinary(f, i) for i in range(4)]  # (alone, before the batch: not part of its timing)
    assert all(want)
    rows = staggered_four(f, method)
    for i, o in enumerate(rows):
        check(f, i, o["tokens"])
    total = counts(rows, method)
    assert sum(o["fill"]["methods"][method]["proposals"] > 0 for o in rows) >= 3, [o["fill"] for o in rows]
    assert total["accepted"] > 0, f"{method} under {fmt} at B=4: no proposal ever landed ({total})"
    eng = f["engine"]
    if method == "draft":
        deadline = time.monotonic() + 30  # (a row's last chunk goes out before it retires)
        while not eng.scheduler.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.method_state("draft").group.members == [], "retired rows must leave the draft group"


def test_proposers_keep_their_own_state_at_full_precision(served):
    """Only the target's attention KV takes the format: the draft model's runner and the
    MTP layer's cache have none (their KV is theirs, never verified against)."""
    f = served("draft", "k8v8")
    assert f["engine"].method_state("draft").runner.kv_format is None
    f = served("mtp", "k8v8")
    group = f["engine"].method_state("mtp").group
    assert f["engine"].runner.kv_format == FORMATS["k8v8"]
    assert all(getattr(layer, "fmt", None) is None for layer in group.cache.layers), group.cache.layers


def test_serve_parses_kv_bits_with_each_method_and_attaches_it(folders, tmp_path):
    """`jumpahead serve --kv-bits 8 --methods ...` (app/serve.py engine_config, whose
    method specs the Engine attaches: --draft-model, --drafter PATH, --mtp auto) loads
    each combination."""
    from jumpahead.app.cli import build_parser
    from jumpahead.app.serve import engine_config
    from jumpahead.engine.methods.drafter import target_fingerprint
    from jumpahead.engine.engine import Engine

    llama, nxt = folders["llama"](), folders["next"]()

    def args_of(*argv: str):
        return build_parser("serve").parse_args(["serve", "--kv-bits", "8", "--no-prefix-cache", *argv])

    # draft: --draft-model beside the quantized target
    args = args_of("--model", str(llama), "--methods", "echo,draft", "--draft-model", str(llama),
                   "--drafter", "none", "--mtp", "none")
    config, methods = engine_config(args)
    assert config.kv_format == parse_kv_format(8) and methods == ("echo", "draft")
    config.warm_up = False
    eng = Engine.load(args.model, config, progress=lambda s: None)
    try:
        assert config.method_specs["draft"] == str(llama) and eng.method_state("draft") is not None
    finally:
        eng.close()

    # drafter (a saved drafter folder for the served model) and mtp (the folder's own mtp.*)
    from jumpahead.engine.model.loader import load_model

    model = load_model(str(nxt), progress=lambda s: None)[0]
    drafter_dir = bigram_drafter(model).save(tmp_path / "drafter", target_fingerprint(model))
    args = args_of("--model", str(nxt), "--methods", "drafter,mtp", "--drafter", str(drafter_dir), "--mtp", "auto")
    config, methods = engine_config(args)
    assert config.kv_format == KVFormat(8, 8) and methods == ("drafter", "mtp")
    config.warm_up = False
    eng = Engine.load(args.model, config, progress=lambda s: None)
    try:
        assert eng.method_state("drafter") is not None and eng.method_state("mtp") is not None
        assert eng.runner.kv_format == KVFormat(8, 8)
        out = run_rows(eng, [GenerationRequest(prompt=[1, 2, 3, 4, 5], max_tokens=6, methods=[m])
                             for m in ("drafter", "mtp")])
        assert all(len(o["tokens"]) == 6 for o in out)
    finally:
        eng.close()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_random_mtp_weights_are_rejected_exactly_under_kv_bits(served, fmt):
    """The trunk at full strength (its attention is what the format rounds; the
    predictable model scales it down) with random MTP weights: nearly every draft is
    rejected and rolled back over the quantized cache, at B=4 staggered, and every row
    still equals ordinary decoding."""
    f = served("mtp-random", fmt)
    want = [ordinary(f, i) for i in range(4)]
    assert all(want)
    rows = staggered_four(f, "mtp")
    for i, o in enumerate(rows):
        check(f, i, o["tokens"])
    total = counts(rows, "mtp")
    assert total["proposals"] > 0 and total["proposed"] > total["accepted"], total


@pytest.mark.parametrize("method", ["draft", "mtp"])
def test_second_turn_restores_the_methods_state_beside_the_quantized_prefix(folders, tmp_path, method):
    """With the prefix cache on (serve's default), a second turn that extends the first
    restores the target's quantized KV and the method's own full-precision state stored
    beside it (engine/methods/draft_model.py DraftCompanion, engine/methods/mtp_companion.py), then drafts and
    lands tokens; it equals the same turn without the method. Then the same from the
    SSD tier in a restarted engine."""
    from jumpahead.engine.methods.draft_model import DraftModel
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    model, tok, info = load_model(str(folders[SUBJECTS[method]]()), progress=lambda s: None)

    def engine() -> Engine:
        eng = Engine(model, tok, info, EngineConfig(max_batch=2, cost_aware=False, objective="latency", warm_up=False,
                                                    prefix_cache_dir=str(tmp_path), kv_format=KVFormat(8, 8),
                                                    method_specs={"mtp": "auto" if method == "mtp" else None}))
        eng.scheduler.width_policy = frozen_width_policy()
        if method == "draft":
            eng.attach("draft", DraftModel(model, tok, info, target_tokenizer=tok))
        return eng

    def turn(eng: Engine, prompt: list[int], methods: list[str], proposer=None) -> tuple[dict, int]:
        cached: list[int] = []
        tokens: list[int] = []
        fill: dict = {}

        async def go() -> None:
            nonlocal fill
            req = GenerationRequest(prompt=prompt, max_tokens=N, methods=methods,
                                    proposers=[proposer] if proposer is not None else [])
            async for chunk in eng.stream(req):
                cached.append(chunk.cached_tokens)
                tokens.extend(chunk.tokens)
                if chunk.finish_reason is not None:
                    assert chunk.error is None, chunk.error
                    fill = chunk.fill

        asyncio.run(go())
        return {"tokens": tokens, "fill": fill}, max(cached)

    first = tok.apply_chat_template([{"role": "user", "content": TEXTS[0]}], add_generation_prompt=True)
    eng = engine()
    try:
        answer = turn(eng, first, [method])[0]["tokens"]
        second = first + answer + tok.apply_chat_template([{"role": "user", "content": TEXTS[1]}],
                                                          add_generation_prompt=True)
        assert eng.flush_prefix_cache()
        plain, _ = turn(eng, second, ["none"])
        for label in ("ram", "ssd"):
            if label == "ssd":  # a restart: the SSD tier holds the quantized KV and the method's state
                assert eng.flush_prefix_cache()
                eng.close()
                eng = engine()
            if label == "ssd":
                eng.prefix_cache.clear_ram()  # only the SSD tier holds the entries now
            proposer = (eng.method_state("draft") if method == "draft" else eng.method_state("mtp")).proposer()
            got, hit = turn(eng, second, ["off"], proposer)
            assert hit >= len(first), f"{label}: the second turn did not hit the prefix cache ({hit})"
            # the method's state over the cached prefix came back with it: it was fed at most
            # turn 1's last tokens, the new message and the pending token, not the prompt
            assert 0 < proposer.fed <= len(second) - len(first), (label, proposer.fed, len(first), len(second))
            assert got["tokens"] == plain["tokens"], label
            m = got["fill"]["methods"][method]
            assert m["proposals"] > 0 and m["accepted"] > 0, (label, m)
    finally:
        eng.close()
