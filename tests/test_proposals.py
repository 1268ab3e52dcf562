"""Verified proposals (echo, n-gram, draft model) on the real default model.

The oracle: with any verified method, a row's output equals ordinary decoding token
for token, at temperature 0 and with seeded sampling, alone and mixed into a batch of
4 with staggered joins. Where a wider forward (proposal positions, other rows) rounds
differently from the single-token forward, a divergence is accepted only with a proof:
a near-tie of the top two logits (greedy, tests/oracle.py) or a draw on a cdf
boundary (sampled: a logit perturbation of the same size moves the draw).

Drafts: `strong` is the target model itself in a DraftModel (its own cache; accepts
almost everything, so the accept paths and the cache sync after partial acceptance
run), `weak` is the 4-layer truncated default model built by `ensure_draft_model`
(rejects almost everything).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from jumpahead.engine.methods.proposal import Proposal
from jumpahead.engine.types import GenerationRequest, SamplingParams
from tests.oracle import assert_same_or_near_tie, first_difference, reference_logits

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over window."""
    result = []
    for i in range(len(values) - window + 1):
        chunk = values[i : i + window]
        result.append(sum(chunk) / window)
    return result
'''
CONFIG = 'HOST = "127.0.0.1"\nPORT = 8080\nDEBUG = True\nWORKERS = 4\nLOG_LEVEL = "info"\n'

PROMPTS = [
    f"Here is config.py:\n```python\n{CONFIG}```\nRewrite config.py with PORT = 9090. Show the whole file.",
    f"Repeat this code exactly:\n```python\n{CODE}```",
    "Write a short poem about the sea.",
]
N = 20  # tokens per row
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, seed=4242)
SAMPLINGS = {"greedy": GREEDY, "sampled": SAMPLED}
METHODS = ["echo", "ngram", "draft", "weak_draft"]


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ctx(loaded_model):
    """A private engine with the strong draft attached, plus the weak draft."""
    from jumpahead.engine.methods.draft_model import DraftModel, ensure_draft_model
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    # cost_aware off: every proposal is verified, so the accept/reject paths always run
    # (the width policy only decides how much to verify; tests/test_ragged.py)
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=8, cost_aware=False))
    eng.attach("draft", DraftModel(model, tokenizer, info, target_tokenizer=tokenizer))
    weak = DraftModel.load(ensure_draft_model(4, progress=lambda s: None), tokenizer, progress=lambda s: None)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in PROMPTS]
    yield {"engine": eng, "weak": weak, "model": model, "tokenizer": tokenizer, "prompts": prompts, "ordinary": {}}
    eng.close()


def request(ctx, i: int, method: str | None, sampling: SamplingParams, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", N)
    req = GenerationRequest(prompt=ctx["prompts"][i], sampling=sampling, **kw)
    if method == "weak_draft":
        req.proposers = [ctx["weak"].proposer()]
    elif method:
        req.methods = [method]
    return req


def tokens_of(chunks) -> list[int]:
    return [t for c in chunks for t in c.tokens]


def ordinary(ctx, i: int, sname: str) -> list[int]:
    key = (i, sname)
    if key not in ctx["ordinary"]:
        chunks = ctx["engine"].generate_sync(request(ctx, i, None, SAMPLINGS[sname]))
        check_fill(chunks, None)
        ctx["ordinary"][key] = tokens_of(chunks)
    return ctx["ordinary"][key]


# --- oracles -----------------------------------------------------------------------------


def check_fill(chunks, kind: str | None) -> dict:
    """usage.fill is consistent with the emitted tokens."""
    last = chunks[-1]
    fill = last.fill
    n = last.completion_tokens
    kinds = [k for c in chunks for k in c.kinds]
    assert len(tokens_of(chunks)) == len(kinds) == n
    assert fill["tokens"] == dict(Counter(kinds))
    v = fill["verified"]
    accepted = fill["tokens"].get(kind, 0) if kind else 0
    assert v["accepted"] == accepted, fill
    assert v["accepted"] + fill["tokens"].get("sampled", 0) == n, fill
    assert v["proposed"] == v["accepted"] + v["rejected"], fill
    assert fill["rounds"] == fill["forwards"] == last.timings.rounds
    if kind is None:
        assert v["proposed"] == 0
    return fill


def assert_same_or_near_boundary(model, prompt, got, want, params: SamplingParams, tol: float = 1e-2) -> str:
    """Seeded sampling: equal, or at the first divergence a logit perturbation of size
    `tol` (float noise between forward shapes is far smaller) moves the draw between the
    two tokens, i.e. the draw sits on a cdf / nucleus boundary."""
    from jumpahead.engine.sampler import RowSampler

    i = first_difference(got, want)
    if i is None:
        return "identical"
    assert i < len(got) and i < len(want), f"lengths differ: {len(got)} vs {len(want)}"
    x = np.array(reference_logits(model, prompt + want[:i]), copy=False).astype(np.float64)
    sampler = RowSampler(params, params.seed, prompt)
    rng = np.random.default_rng(0)
    picks = {sampler.pick(x + rng.uniform(-tol, tol, x.shape), len(prompt) + i) for _ in range(64)}
    picks.add(sampler.pick(x, len(prompt) + i))
    assert {got[i], want[i]} <= picks, f"divergence at {i} ({got[i]} vs {want[i]}) is not on a boundary: {picks}"
    return f"boundary at {i}"


def assert_equivalent(ctx, i: int, sname: str, got: list[int], want: list[int]) -> None:
    prompt = ctx["prompts"][i]
    if sname == "greedy":
        assert_same_or_near_tie(ctx["model"], prompt, got, want)
    else:
        assert_same_or_near_boundary(ctx["model"], prompt, got, want, SAMPLED)


# --- tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("sname", ["greedy", "sampled"])
def test_single_row_equals_ordinary(ctx, sname):
    """A copy-heavy prompt and a plain one, each method alone (B=1)."""
    eng = ctx["engine"]
    accepted = Counter()
    for i, methods in ((0, METHODS), (2, METHODS[:3])):
        want = ordinary(ctx, i, sname)
        for method in methods:
            chunks = eng.generate_sync(request(ctx, i, method, SAMPLINGS[sname]))
            kind = "draft" if method.endswith("draft") else method
            fill = check_fill(chunks, kind)
            accepted[method] += fill["verified"]["accepted"]
            if method == "draft" and sname == "greedy":  # the strong draft is the target: a synced
                v = fill["verified"]  # cache agrees with it (up to near-ties)
                assert v["accepted"] >= 0.8 * v["proposed"], fill
            assert_equivalent(ctx, i, sname, tokens_of(chunks), want)
    # the accept paths really ran: the copy-heavy prompt echoes, the strong draft agrees
    assert accepted["echo"] > 0 and accepted["ngram"] > 0 and accepted["draft"] > 0, accepted


async def _collect(engine, req, delay):
    await asyncio.sleep(delay)
    return [c async for c in engine.stream(req)]


@pytest.mark.parametrize("sname", ["greedy", "sampled"])
def test_mixed_batch_equals_ordinary(ctx, sname):
    """4 rows, staggered joins, each with another method (one with none)."""
    eng = ctx["engine"]
    rows = [0, 1, 2, 1]
    plan = ["echo", None, "draft", "ngram"] if sname == "greedy" else ["draft", "echo", "weak_draft", None]
    wants = [ordinary(ctx, i, sname) for i in rows]
    widths_before = eng.scheduler.counters["round_width_sum"] - eng.scheduler.counters["rounds"]

    async def together():
        return await asyncio.gather(*[
            _collect(eng, request(ctx, i, m, SAMPLINGS[sname]), 0.25 * j) for j, (i, m) in enumerate(zip(rows, plan))
        ])

    results = asyncio.run(together())
    for i, m, chunks, want in zip(rows, plan, results, wants):
        check_fill(chunks, ("draft" if m and m.endswith("draft") else m))
        assert_equivalent(ctx, i, sname, tokens_of(chunks), want)
    assert eng.scheduler.counters["round_width_sum"] - eng.scheduler.counters["rounds"] > widths_before


class _FrozenCosts:
    """The scheduler's width policy with this CPU's default costs, not refitted from the
    rounds it times: what these tests check is the mechanism (caps, which rows verify)
    and that outputs stay ordinary, not the online fit, which a loaded machine moves
    (a fit under load can price every copy out: nothing verified). The fit itself is
    tested on given rounds (tests/test_ragged.py)."""

    def __init__(self, eng) -> None:
        from tests.serving import frozen_width_policy

        self.scheduler, self.frozen = eng.scheduler, frozen_width_policy()

    def __enter__(self):
        self.before, self.scheduler.width_policy = self.scheduler.width_policy, self.frozen
        return self.frozen

    def __exit__(self, *exc) -> None:
        self.scheduler.width_policy = self.before


def test_cost_aware_widths_keep_outputs(ctx):
    """With the width policy on (the server default), a mixed batch still equals
    ordinary decoding, copies are still verified, and fewer tokens are verified than
    when every proposal is carried whole."""
    eng = ctx["engine"]
    rows = [0, 2, 1, 2]
    wants = [ordinary(ctx, i, "greedy") for i in rows]

    def batch():
        async def together():
            return await asyncio.gather(*[
                _collect(eng, request(ctx, i, "echo", GREEDY), 0.1 * j) for j, i in enumerate(rows)
            ])
        return asyncio.run(together())

    proposed = {}
    for on in (False, True):
        eng.scheduler.config.cost_aware = on
        try:
            with _FrozenCosts(eng):
                results = batch()
        finally:
            eng.scheduler.config.cost_aware = False
        fills = [check_fill(chunks, "echo") for chunks in results]
        for i, chunks, want in zip(rows, results, wants):
            assert_equivalent(ctx, i, "greedy", tokens_of(chunks), want)
        proposed[on] = sum(f["verified"]["proposed"] for f in fills)
        if on:
            assert sum(f["verified"]["capped"] for f in fills) > 0, fills
            assert sum(f["verified"]["accepted"] for f in fills) > 0, fills  # copies still verified
    assert proposed[True] < proposed[False], proposed
    assert "per_token_ms" in eng.metrics()["width_policy"]


def test_throughput_objective_verifies_only_where_the_batch_gains(ctx):
    """Objective "throughput": a copy row that joins two longer-running plain rows
    (nothing waiting for a slot) is not the row the batch waits on, so verifying its
    copies would only cost the others; it carries none, yet outputs stay ordinary.
    Under "latency" the same row verifies its copies."""
    eng = ctx["engine"]
    plain_n = 2 * N

    def run(objective: str):
        async def together():
            plain = [_collect(eng, request(ctx, 2, None, GREEDY, max_tokens=plain_n), 0.0) for _ in range(2)]
            copy = _collect(eng, request(ctx, 0, "echo", GREEDY), 0.5)  # joins the running plain rows
            return await asyncio.gather(copy, *plain)

        config = eng.scheduler.config
        before = config.objective
        config.cost_aware = True
        config.objective = objective
        try:
            with _FrozenCosts(eng):
                return asyncio.run(together())
        finally:
            config.cost_aware = False
            config.objective = before

    plain_want = tokens_of(eng.generate_sync(request(ctx, 2, None, GREEDY, max_tokens=plain_n)))
    assert len(plain_want) == plain_n, "the plain rows must outlast the copy row for this test"
    proposed = {}
    for objective in ("latency", "throughput"):
        copy, *plain = run(objective)
        assert_equivalent(ctx, 0, "greedy", tokens_of(copy), ordinary(ctx, 0, "greedy"))
        for chunks in plain:
            assert_same_or_near_tie(ctx["model"], ctx["prompts"][2], tokens_of(chunks), plain_want)
        fill = check_fill(copy, "echo")
        proposed[objective] = fill["verified"]["proposed"]
        if objective == "throughput":  # echo was not even asked: nothing proposed, nothing capped
            assert fill["verified"]["capped"] == 0, fill
    assert proposed["latency"] > 0, proposed
    assert proposed["throughput"] == 0, proposed


def test_objective_is_validated():
    from jumpahead.engine.schedule.scheduler import SchedulerConfig

    with pytest.raises(ValueError, match="objective must be one of latency, throughput"):
        SchedulerConfig(objective="fastest")


def _echo_spans(chunks) -> list[tuple[int, int]]:
    """[a, b) output ranges of chunks that carry >= 4 echo tokens."""
    out, pos = [], 0
    for c in chunks:
        if c.kinds.count("echo") >= 4:
            out.append((pos, pos + len(c.tokens)))
        pos += len(c.tokens)
    return out


def test_stops_inside_an_accepted_span(ctx):
    """Stop string, stop token and max_tokens landing inside a long echoed round end
    exactly where ordinary decoding ends."""
    eng, tok = ctx["engine"], ctx["tokenizer"]
    long = 48
    base = eng.generate_sync(request(ctx, 0, None, GREEDY, max_tokens=long))
    echo = eng.generate_sync(request(ctx, 0, "echo", GREEDY, max_tokens=long))
    out = tokens_of(base)
    assert tokens_of(echo) == out
    spans = _echo_spans(echo)
    assert spans, [c.kinds for c in echo]
    a, b = max(spans, key=lambda s: s[1] - s[0])
    text = "".join(c.text for c in base)

    def prefix_len(n):  # characters of the text after n output tokens
        return len(tok.decode(out[:n]))

    # 1. a stop string completed by a token in the middle of the span
    cases = []
    for e in range(a + 1, b - 1):
        s = text[prefix_len(e) - 2 : prefix_len(e + 1)]
        if len(s) >= 3 and text.find(s) == prefix_len(e) - 2:
            cases.append((e, s))
    assert cases, (a, b, text)
    e, stop = cases[0]
    got_base = eng.generate_sync(request(ctx, 0, None, GREEDY, max_tokens=long, stop=[stop]))
    got_echo = eng.generate_sync(request(ctx, 0, "echo", GREEDY, max_tokens=long, stop=[stop]))
    for chunks in (got_base, got_echo):
        assert chunks[-1].finish_reason == "stop"
        assert tokens_of(chunks) == out[: e + 1]
        assert "".join(c.text for c in chunks) == text[: text.find(stop)]
    assert got_echo[-1].kinds.count("echo") >= 1  # ended inside an accepted round
    check_fill(got_echo, "echo")  # accepted tokens cut off by the stop are not counted accepted

    # 2. a stop token id inside the span (first occurrence)
    e2 = next(e for e in range(a + 1, b - 1) if out[e] not in out[:e])
    for m in (None, "echo"):
        chunks = eng.generate_sync(request(ctx, 0, m, GREEDY, max_tokens=long, stop_token_ids=[out[e2]]))
        assert chunks[-1].finish_reason == "stop" and tokens_of(chunks) == out[: e2 + 1]
        check_fill(chunks, m)

    # 3. max_tokens inside the span
    n = (a + b) // 2
    for m in (None, "echo"):
        chunks = eng.generate_sync(request(ctx, 0, m, GREEDY, max_tokens=n))
        assert chunks[-1].finish_reason == "length" and tokens_of(chunks) == out[:n]
        check_fill(chunks, m)


class ScriptedProposer:
    """Asserts the next tokens of a known continuation (as a jump policy would)."""

    name = "scripted"

    def __init__(self, continuation: list[int], span: int = 4) -> None:
        self.continuation = continuation
        self.span = span

    def propose(self, view, max_len):
        done = len(view.tokens) - view.prompt_len
        if list(view.tokens[view.prompt_len :]) != self.continuation[:done]:
            return None
        nxt = self.continuation[done : done + min(self.span, max_len)]
        return Proposal(nxt, "scripted") if nxt else None

    def feedback(self, proposal, accepted):
        pass


def test_untrimmable_model_declines_verified_keeps_asserted(ctx):
    """With a cache that cannot roll back, verified proposals are declined with a
    reason in usage.fill (output unchanged); asserted proposals still apply."""
    eng = ctx["engine"]
    want = ordinary(ctx, 0, "greedy")
    eng.runner.trimmable = False
    try:
        chunks = eng.generate_sync(request(ctx, 0, "echo", GREEDY))
        fill = check_fill(chunks, "echo")
        assert fill["verified"]["proposed"] == 0
        assert "cannot be rolled back" in fill["declined"]["echo"]
        assert tokens_of(chunks) == want
        req = request(ctx, 0, None, GREEDY)
        req.proposers = [ScriptedProposer(want[:12])]
        chunks = eng.generate_sync(req)
        assert chunks[-1].fill["tokens"].get("scripted", 0) > 0
        assert_same_or_near_tie(ctx["model"], ctx["prompts"][0], tokens_of(chunks), want)
    finally:
        eng.runner.trimmable = True


def _tiny_mamba(folder, tokenizer_src):
    """A real (random-weight) recurrent mlx-lm model folder with the default tokenizer."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import mamba

    cfg = dict(model_type="mamba", vocab_size=49152, hidden_size=16, intermediate_size=32, state_size=4,
               num_hidden_layers=2, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=2,
               tie_word_embeddings=True)
    net = mamba.Model(mamba.ModelArgs(**cfg))
    mx.eval(net.parameters())
    folder.mkdir()
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(net.parameters())))
    (folder / "config.json").write_text(json.dumps(cfg))
    for f in tokenizer_src.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy2(f, folder / f.name)
    return folder


def test_recurrent_model_is_untrimmable_and_refused_as_draft(ctx, tmp_path):
    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.methods.draft_model import DraftModel, DraftModelError
    from jumpahead.engine.model.loader import load_model
    from jumpahead.engine.kv.model_runner import ModelRunner

    folder = _tiny_mamba(tmp_path / "mamba", ensure_default_model(progress=lambda s: None))
    net, tok, _ = load_model(str(folder), progress=lambda s: None)
    assert ModelRunner(net).trimmable is False
    with pytest.raises(DraftModelError, match="cannot be trimmed"):
        DraftModel(net, tok, target_tokenizer=ctx["tokenizer"])


def test_draft_with_another_tokenizer_is_refused(ctx, tmp_path):
    from jumpahead.engine.methods.draft_model import DraftModel, DraftModelError, ensure_draft_model

    src = ensure_draft_model(4, progress=lambda s: None)
    other = tmp_path / "other"
    shutil.copytree(src, other)
    tj = json.loads((other / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = "hello", "world"
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids mean other strings
    (other / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(DraftModelError, match="another tokenizer"):
        DraftModel.load(other, ctx["tokenizer"], progress=lambda s: None)
    draft = DraftModel.load(other, None, progress=lambda s: None)
    with pytest.raises(DraftModelError, match="tokens map to other ids"):
        ctx["engine"].attach("draft", draft)
    assert ctx["engine"].method_state("draft") is not draft


def test_draft_cache_sync_after_partial_acceptance(ctx):
    """The row's slot in the draft group's cache is rolled back to the committed tokens
    and fed what is missing: after a partial acceptance the next proposal equals a
    fresh proposer's."""
    from jumpahead.engine.methods.proposal import RowView

    weak, prompt = ctx["weak"], ctx["prompts"][0]
    group = weak.group
    p = weak.proposer()
    first = p.propose(RowView(prompt, len(prompt), 100), 4)
    assert len(first.tokens) == 4 and p.consumed == prompt + first.tokens[:3]
    for accepted in (2, 0, 4):  # the target accepted some, then emitted its own token
        seq = list(p.consumed[: len(p.consumed) - len(first.tokens) + 1]) + first.tokens[:accepted] + [17]
        p.k = 4
        first = p.propose(RowView(seq, len(prompt), 100), 4)
        other = weak.proposer()
        fresh = other.propose(RowView(seq, len(prompt), 100), 4)
        other.release_row()
        assert first.tokens == fresh.tokens
        assert p.consumed == seq + first.tokens[:3]
        assert group.cache.ends[group.index(p)] == len(p.consumed)
    p.release_row()
    assert group.index(p) is None
