"""The two-model draft (`--draft-model`, method "draft", engine/methods/draft_model.py) grouped in the batch.

Every row's draft KV lives in one DraftModelGroup (a batched RowKVCache of the draft
model, a row per proposer with its own end pointer). Oracles: the group's drafts for
rows of different lengths, rolled back after partial acceptance, rows joining and
leaving, equal each row's draft computed alone in a group of its own; at B=4 the
draft model runs one forward per step for all rows (fewer forwards than the rows
drafting in them); greedy rows with the draft equal ordinary decoding at B=1 and 4
(rows of different prompt lengths, rows joining and leaving mid-run) and seeded
sampling emits the target sampler's tokens; the per-method telemetry adds up; a
second turn that extends the first one restores the draft KV stored with the
target's in the prefix cache (RAM and SSD) and feeds the draft only the new tokens.

The draft is the 4-layer truncated default model (`ensure_draft_model`).
"""

from __future__ import annotations

import json

import pytest

from jumpahead.engine.methods.proposal import RowView
from jumpahead.engine.types import GenerationRequest, SamplingParams
from tests.oracle import assert_same_or_near_tie
from tests.serving import chat_prompt, frozen_width_policy, run_rows

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue, for a child who asks every day.",
    "List the steps to make a cup of tea.",
    "What is 17 times 23? Show your work step by step, and check the result twice.",
]


@pytest.fixture(scope="module")
def weak(loaded_model):
    from jumpahead.engine.methods.draft_model import DraftModel, ensure_draft_model

    return DraftModel.load(ensure_draft_model(4, progress=lambda s: None), loaded_model[1], progress=lambda s: None)


@pytest.fixture(scope="module")
def deng(loaded_model, tmp_path_factory):
    """An engine of its own with the truncated draft attached. cost_aware off: every
    row's proposal is verified every round (the width policy only sizes them), so
    every row of a round drafts and the accept and reject paths both run."""
    from jumpahead.engine.methods.draft_model import DraftModel, ensure_draft_model
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    cache_dir = str(tmp_path_factory.mktemp("draft-model-prompt-cache"))
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=4, cost_aware=False, prefix_cache_dir=cache_dir))
    eng.scheduler.width_policy = frozen_width_policy()
    eng.attach("draft", DraftModel.load(ensure_draft_model(4, progress=lambda s: None), tokenizer,
                                     progress=lambda s: None))
    yield eng
    eng.close()


def _alone(draft, tokens, k):
    """Row `tokens`' draft computed in a group of its own (a fresh single-row cache)."""
    from jumpahead.engine.methods.draft_model import DraftModelGroup, DraftProposer

    p = DraftProposer(DraftModelGroup(draft), k=k, max_k=k)
    return p.propose(RowView(list(tokens), 0, 100), k).tokens


# --- the group itself ---------------------------------------------------------------------


def test_group_drafts_equal_each_row_alone_through_rollback_joins_and_leaves(weak, loaded_model):
    from jumpahead.engine.methods.draft_model import DraftModelGroup, DraftProposer

    tok = loaded_model[1]
    prompts = [chat_prompt(tok, p) for p in PROMPTS[:3]]
    assert len({len(p) for p in prompts}) == 3
    group = DraftModelGroup(weak)
    props = [DraftProposer(group, k=4, max_k=4) for _ in prompts]
    seqs = [p + [13] for p in prompts]  # each row's committed tokens (the last one pending)

    def round_(rows):
        group.start_round()
        views = {i: RowView(list(seqs[i]), len(prompts[i % 3]), 100) for i in rows}
        for i in rows:
            group.offer(props[i], views[i])
        before = (group.forwards, group.row_forwards)
        got = {i: props[i].propose(views[i], 4).tokens for i in rows}
        for i in rows:
            assert got[i] == _alone(weak, seqs[i], 4), f"row {i}: the batched draft is not the row's own"
            # the row's slot holds exactly its consumed tokens: committed ones, then its guesses
            b = group.index(props[i])
            assert group.cache.ends[b] == len(props[i].consumed)
            assert props[i].consumed == seqs[i] + got[i][:3]
        return got, (group.forwards - before[0], group.row_forwards - before[1])

    got, (forwards, row_forwards) = round_([0, 1, 2])  # three rows join, then draft together
    assert group.joins == 3 and len(group.members) == 3
    assert (forwards, row_forwards) == (3, 9), "the chain must run once for all rows: 3 forwards, not 9"
    # partial acceptance (all, some, none), then the target's own token; row 1 sits out a round
    for i, accepted in ((0, 4), (1, 2), (2, 0)):
        seqs[i] = seqs[i] + got[i][:accepted] + [17 + i]
    got2, (forwards, row_forwards) = round_([0, 2])
    assert (forwards, row_forwards) == (4, 8)  # one catch-up forward for both + 3 chain steps
    for i, accepted in ((0, 1), (2, 3)):
        seqs[i] = seqs[i] + got2[i][:accepted] + [29]
    seqs[1] = seqs[1] + [31, 32, 33]  # row 1 was not offered: it lags several tokens
    group.release(props[0])  # row 0 leaves mid-run
    assert len(group.members) == 2 and group.cache.size == 2
    props.append(DraftProposer(group, k=4, max_k=4))  # a new row joins
    seqs.append(prompts[0][:20] + [40, 41])
    round_([1, 2, 3])
    assert len(group.members) == 3 and group.joins == 4
    for p in props[1:]:
        group.release(p)
    assert group.members == [] and group.cache.size == 0


# --- through the engine ---------------------------------------------------------------------


def _draft_reqs(tok, n, sampling=None, max_tokens=None):
    return [GenerationRequest(prompt=chat_prompt(tok, p), max_tokens=(max_tokens or [16, 12, 14, 10])[i],
                              methods=["draft"], sampling=sampling or SamplingParams())
            for i, p in enumerate(PROMPTS[:n])]


@pytest.mark.parametrize("batch", [1, 4])  # alone, and a group (B=2 ran the same grouped path as B=4)
def test_grouped_draft_equals_ordinary_greedy_decoding(deng, loaded_model, batch):
    """Rows of different prompt lengths and answer lengths (they leave at different rounds)."""
    tok = deng.tokenizer
    reqs = _draft_reqs(tok, batch)
    plain = run_rows(deng, [GenerationRequest(prompt=r.prompt, max_tokens=r.max_tokens, methods=["off"]) for r in reqs])
    drafted = run_rows(deng, reqs)
    for r, got, want in zip(reqs, drafted, plain):
        assert_same_or_near_tie(loaded_model[0], r.prompt, got["tokens"], want["tokens"])
        m = got["fill"]["methods"]["draft"]
        assert m["proposals"] > 0, got["fill"]
    deng.flush_prefix_cache()  # (a row's last chunk goes out before it retires)
    assert deng.method_state("draft").group.members == [], "retired rows must leave the draft group"


def test_target_as_its_own_draft_is_accepted_in_a_batch_of_four(loaded_model):
    """With the target itself as the draft, a right batched cache (rollback by pointer,
    catch-up, joins, throwaway tokens of idle rows) drafts the target's own greedy
    tokens, so nearly all are accepted at B=4; a stale or misplaced key would miss."""
    from jumpahead.engine.methods.draft_model import DraftModel
    from tests.serving import engine_of

    model, tok, info = loaded_model
    with engine_of(loaded_model, max_batch=4, cost_aware=False, prefix_cache=False) as eng:
        eng.attach("draft", DraftModel(model, tok, info, target_tokenizer=tok))
        reqs = _draft_reqs(tok, 4, max_tokens=[20, 12, 16, 8])
        plain = run_rows(eng, [GenerationRequest(prompt=r.prompt, max_tokens=r.max_tokens, methods=["off"])
                               for r in reqs])
        out = run_rows(eng, reqs)
        for r, got, want in zip(reqs, out, plain):
            assert_same_or_near_tie(model, r.prompt, got["tokens"], want["tokens"])
        methods = [o["fill"]["methods"]["draft"] for o in out]
        proposed, accepted = sum(m["proposed"] for m in methods), sum(m["accepted"] for m in methods)
        assert accepted >= 0.8 * proposed > 0, methods
        group = eng.method_state("draft").group  # every row drafts every round: the forwards are shared
        assert 2 * group.catch_ups < group.rows_drafted and group.forwards < group.row_forwards, group.stats()


def test_rows_join_and_leave_mid_run(deng, loaded_model):
    """Four rows through two slots: rows 3 and 4 join the draft group as rows 1 and 2 leave."""
    tok = deng.tokenizer
    deng.scheduler.config.max_batch = 2
    try:
        reqs = _draft_reqs(tok, 4, max_tokens=[8, 16, 12, 10])
        plain = run_rows(deng, [GenerationRequest(prompt=r.prompt, max_tokens=r.max_tokens, methods=["off"])
                                for r in reqs])
        joins = deng.method_state("draft").group.joins
        drafted = run_rows(deng, reqs)
    finally:
        deng.scheduler.config.max_batch = 4
    for r, got, want in zip(reqs, drafted, plain):
        assert_same_or_near_tie(loaded_model[0], r.prompt, got["tokens"], want["tokens"])
    deng.flush_prefix_cache()
    assert deng.method_state("draft").group.joins - joins >= 4 and deng.method_state("draft").group.members == []


def test_seeded_sampling_emits_the_targets_tokens(deng, loaded_model):
    from tests.test_proposals import assert_same_or_near_boundary

    tok = deng.tokenizer
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    reqs = _draft_reqs(tok, 2, sampling=sampling)
    plain = run_rows(deng, [GenerationRequest(prompt=r.prompt, max_tokens=r.max_tokens, methods=["off"],
                                              sampling=sampling) for r in reqs])
    drafted = run_rows(deng, reqs)
    for r, got, want in zip(reqs, drafted, plain):
        assert_same_or_near_boundary(loaded_model[0], r.prompt, got["tokens"], want["tokens"], sampling)
        assert got["fill"]["methods"]["draft"]["proposals"] > 0


def test_four_rows_draft_in_shared_forwards(deng):
    """At B=4 the draft forwards are shared: drafting row by row runs a catch-up forward
    per row and round and a chain forward per row and drafted token (row_forwards, what
    the same drafts cost one row at a time); the group runs one of each for all rows."""
    group = deng.method_state("draft").group
    tok = deng.tokenizer
    counters = ("forwards", "catch_ups", "row_forwards", "chains", "rows_drafted")
    before = [getattr(group, c) for c in counters]
    deng.scheduler.config.objective = "latency"
    try:
        out = run_rows(deng, _draft_reqs(tok, 4, max_tokens=[20, 20, 20, 20]))
    finally:
        deng.scheduler.config.objective = "throughput"
    forwards, catch_ups, row_forwards, chains, rows = (getattr(group, c) - b for c, b in zip(counters, before))
    drafted_rounds = sum(o["fill"]["methods"]["draft"]["proposals"] + o["fill"]["methods"]["draft"]["outranked"]
                         for o in out)
    assert rows >= drafted_rounds > 0
    # (the truncated draft misses often, so its rows rest some rounds: fewer rows per chain)
    assert catch_ups < rows, (catch_ups, rows)  # row by row: a catch-up forward per row and round
    assert forwards < row_forwards, (forwards, row_forwards)  # row by row they are equal
    assert chains < rows


def test_telemetry_adds_up(deng):
    tok = deng.tokenizer
    before = json.loads(json.dumps(deng.metrics().get("methods", {}).get("draft", {"proposals": 0, "accepted": 0})))
    out = run_rows(deng, _draft_reqs(tok, 2))
    total = {"proposals": 0, "accepted": 0}
    for o in out:
        m = o["fill"]["methods"]["draft"]
        hist = m["accepted_histogram"]
        assert sum(hist) == m["proposals"] > 0
        assert sum(i * n for i, n in enumerate(hist)) == m["accepted"] <= m["proposed"]
        assert o["kinds"].count("draft") == o["fill"]["tokens"].get("draft", 0) == m["accepted"]
        assert o["fill"]["verified"]["accepted"] == m["accepted"]
        assert m["propose_ms"] > 0
        total["proposals"] += m["proposals"]
        total["accepted"] += m["accepted"]
    after = deng.metrics()["methods"]["draft"]
    assert after["proposals"] - before["proposals"] == total["proposals"]
    assert after["accepted"] - before["accepted"] == total["accepted"]


@pytest.mark.parametrize("tier", ["ram", "ssd"])
def test_warm_turn_restores_the_draft_state_from_the_prefix_cache(deng, loaded_model, tier):
    """Turn 2 extends turn 1 (its prompt, answer and a new message): the draft KV stored
    beside the target's at turn 1's end is restored, so the draft model is fed only the
    tokens after it, not the prompt; the output is still ordinary decoding's."""
    tok = deng.tokenizer
    first = chat_prompt(tok, PROMPTS[1] + f" ({tier})")
    p1 = deng.method_state("draft").proposer()
    one = run_rows(deng, [GenerationRequest(prompt=first, max_tokens=16, methods=["off"], proposers=[p1])])[0]
    assert p1.fed >= len(first), "turn 1 must prefill the draft model"
    deng.flush_prefix_cache()
    if tier == "ssd":
        deng.prefix_cache.clear_ram()  # only the SSD tier holds the entries now
    ssd_hits = deng.prefix_cache.counters["ssd_hits"]
    answer = [t for t in one["tokens"] if t not in set(tok.eos_token_ids)]
    extra = tok.encode("<|im_end|>\n<|im_start|>user\nThanks. Now say it again in one sentence.<|im_end|>\n"
                       "<|im_start|>assistant\n", add_special_tokens=False)
    second = first + answer + extra
    p2 = deng.method_state("draft").proposer()
    got = run_rows(deng, [GenerationRequest(prompt=second, max_tokens=16, methods=["off"], proposers=[p2])])[0]
    assert got["fill"]["methods"]["draft"]["proposals"] > 0
    # at most turn 1's answer (a last round's tokens the draft never saw), the new message
    # and the pending token: not the prompt
    assert 0 < p2.fed <= len(second) - len(first), (p2.fed, len(first), len(second))
    if tier == "ssd":
        assert deng.prefix_cache.counters["ssd_hits"] > ssd_hits
    want = run_rows(deng, [GenerationRequest(prompt=second, max_tokens=16, methods=["off"])])[0]
    assert_same_or_near_tie(loaded_model[0], second, got["tokens"], want["tokens"])


def test_sliding_window_draft_in_a_batch(tmp_path):
    """A draft with sliding-window layers (a tiny random gemma3_text, window 8, as its own
    draft): its rows' rings are rolled back by pointer after each chain, with prompts
    crossing the window several times; greedy output is ordinary decoding's and the
    draft, being the target, is accepted almost everywhere."""
    from jumpahead.bench.family_models import WINDOW, build
    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.methods.draft_model import DraftModel
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    folder = build("gemma3_text", tmp_path, ensure_default_model(progress=lambda s: None))
    model, tok, info = load_model(str(folder), progress=lambda s: None)
    eng = Engine(model, tok, info, EngineConfig(max_batch=2, cost_aware=False, prefix_cache=False))
    try:
        eng.attach("draft", DraftModel(model, tok, info, target_tokenizer=tok))
        assert eng.method_state("draft").group.cache.windowed or eng.method_state("draft").runner.windowed
        prompts = [chat_prompt(tok, p) for p in PROMPTS[:2]]
        assert min(len(p) for p in prompts) > 3 * WINDOW
        reqs = [GenerationRequest(prompt=p, max_tokens=16, methods=["draft"]) for p in prompts]
        plain = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=16, methods=["off"]) for p in prompts])
        out = run_rows(eng, reqs)
        for p, got, want in zip(prompts, out, plain):
            assert_same_or_near_tie(model, p, got["tokens"], want["tokens"])
        methods = [o["fill"]["methods"]["draft"] for o in out]
        proposed, accepted = sum(m["proposed"] for m in methods), sum(m["accepted"] for m in methods)
        assert accepted >= 0.8 * proposed > 0, methods
    finally:
        eng.close()


def test_a_draft_row_sits_out_behind_a_long_copy_and_drafts_again(deng, loaded_model):
    """methods ["echo", "draft"] on a copy-heavy row beside a plain one: rounds where the
    copy outranks the draft run no draft for the row (`sat_out`), the row's draft state
    catches up when it drafts again, and both rows equal ordinary greedy decoding."""
    from tests.test_proposals import CODE

    tok = deng.tokenizer
    prompts = [chat_prompt(tok, f"Repeat this code exactly:\n```python\n{CODE}```"), chat_prompt(tok, PROMPTS[0])]
    plain = run_rows(deng, [GenerationRequest(prompt=p, max_tokens=48, methods=["off"]) for p in prompts])
    got = run_rows(deng, [GenerationRequest(prompt=p, max_tokens=48, methods=["echo", "draft"]) for p in prompts])
    for p, g, want in zip(prompts, got, plain):
        assert_same_or_near_tie(loaded_model[0], p, g["tokens"], want["tokens"])
    copy_row = got[0]["fill"]["methods"]
    assert copy_row["draft"]["sat_out"] > 0 and copy_row["echo"]["accepted"] > 0, got[0]["fill"]
    assert sum(g["fill"]["methods"]["draft"]["proposals"] for g in got) > 0
    deng.flush_prefix_cache()
    assert deng.method_state("draft").group.members == []
