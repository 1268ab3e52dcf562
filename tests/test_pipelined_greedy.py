"""The pipelined greedy round (engine/schedule/scheduler.py `_greedy_round`: the next round's
forward is queued from this round's lazy argmax before its tokens are read, as mlx-lm's
generate_step does) forced on the CPU with EngineConfig(pipeline_greedy=True); it is the
default decode path on a GPU and off on this CPU, where it is slower.

Oracles, on the tiny random-weight llama (conftest `tiny_model`): ordinary decoding
(the same engine config with pipeline_greedy=False) and mlx-lm's stream_generate,
token for token (or a proven near-tie), alone and at B=4 with staggered joins; stops
at max_tokens and at a stop token (as EOS), rows finishing and joining while a round
is queued; and a second turn from the prefix cache after such a finish. The counters
prove the path ran: rounds taken by `_greedy_round`, and rounds that used the forward
the round before had queued.
"""

from __future__ import annotations

import asyncio

import pytest
from mlx_lm import stream_generate

from jumpahead.engine.types import GenerationRequest
from tests.oracle import assert_same_or_near_tie
from tests.serving import chat_prompt

TEXTS = ["Write a short poem about the sea.", "List three prime numbers and explain why they are prime.",
         "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
         "Translate 'good morning' into French, Spanish and German."]
N = 40


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """{"pipelined": ..., "plain": ...}: two engines of the tiny llama, each with a model
    of its own, that differ only in pipeline_greedy."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    out = {}
    for name, pipeline in (("pipelined", True), ("plain", False)):
        model, tok, info = load_model(str(tiny_model_dir), progress=lambda s: None)
        out[name] = Engine(model, tok, info, EngineConfig(max_batch=4, pipeline_greedy=pipeline, warm_up=False,
                                                          prefix_cache_ssd=False))
    assert out["pipelined"].scheduler.pipeline and not out["plain"].scheduler.pipeline
    yield out
    for eng in out.values():
        eng.close()


def run(eng, req: GenerationRequest) -> tuple[list[int], str]:
    chunks = eng.generate_sync(req)
    return [t for c in chunks for t in c.tokens], chunks[-1].finish_reason


async def _collect(eng, req: GenerationRequest, delay: float) -> tuple[list[int], str]:
    await asyncio.sleep(delay)
    tokens, reason = [], None
    async for chunk in eng.stream(req):
        tokens += chunk.tokens
        if chunk.finish_reason is not None:
            assert chunk.error is None, chunk.error
            reason = chunk.finish_reason
    return tokens, reason


def together(eng, reqs: list[GenerationRequest], stagger: float) -> list[tuple[list[int], str]]:
    async def all_rows():
        return await asyncio.gather(*[_collect(eng, r, stagger * i) for i, r in enumerate(reqs)])

    return asyncio.run(all_rows())


@pytest.fixture(scope="module")
def alone(engines, tiny_model):
    """Per prompt: (prompt, plain engine's N tokens, mlx-lm's N tokens)."""
    model, tok, _ = tiny_model
    out = []
    for text in TEXTS:
        p = chat_prompt(tok, text)
        plain, reason = run(engines["plain"], GenerationRequest(prompt=p, max_tokens=N, methods=["off"]))
        assert reason == "length"
        want = [r.token for r in stream_generate(model, tok, p, max_tokens=N)]
        assert_same_or_near_tie(model, p, plain, want)
        out.append((p, plain, want))
    return out


def counters(eng) -> tuple[int, int]:
    c = eng.scheduler.counters
    return c["pipelined_rounds"], c["pipelined_queued_used"]


def test_pipelined_alone_equals_ordinary_and_mlx_lm(engines, alone, tiny_model):
    model = tiny_model[0]
    eng = engines["pipelined"]
    rounds, used = counters(eng)
    for p, plain, want in alone:
        got, reason = run(eng, GenerationRequest(prompt=p, max_tokens=N, methods=["off"]))
        assert reason == "length" and len(got) == N
        assert_same_or_near_tie(model, p, got, plain)
        assert_same_or_near_tie(model, p, got, want)
    # every token after the prefill's came from a pipelined round, all but the first of
    # each row from the forward queued the round before
    assert counters(eng)[0] - rounds == len(alone) * (N - 1)
    assert counters(eng)[1] - used == len(alone) * (N - 2)
    assert counters(engines["plain"]) == (0, 0)


def test_pipelined_stops_at_max_tokens_and_stop_tokens(engines, alone, tiny_model):
    """A row that ends on a round whose successor is already queued: at max_tokens
    (1, 2, 3: the prefill's token, the first and second rounds) and at a stop token
    (the engine's EOS path), as ordinary decoding ends it."""
    model = tiny_model[0]
    eng, ref = engines["pipelined"], engines["plain"]
    p, plain, _ = alone[0]
    rounds = counters(eng)[0]
    for n in (1, 2, 3, 7):
        got, reason = run(eng, GenerationRequest(prompt=p, max_tokens=n, methods=["off"]))
        assert reason == "length" and got == run(ref, GenerationRequest(prompt=p, max_tokens=n, methods=["off"]))[0]
        assert_same_or_near_tie(model, p, got, plain[:n])
    assert counters(eng)[0] - rounds == 0 + 1 + 2 + 6
    # stop at the first occurrence of a token that first appears a few rounds in
    k = next(i for i in range(3, N) if plain[i] not in plain[:i])
    stop = plain[k]
    rounds = counters(eng)[0]
    got, reason = run(eng, GenerationRequest(prompt=p, max_tokens=N, stop_token_ids=[stop], methods=["off"]))
    want, want_reason = run(ref, GenerationRequest(prompt=p, max_tokens=N, stop_token_ids=[stop], methods=["off"]))
    assert (got, reason) == (want, want_reason) and reason == "stop"
    assert got == plain[:k + 1], (got, plain[:k + 1])  # the stop token is the row's last (as EOS)
    assert counters(eng)[0] - rounds == k


def test_pipelined_batch_of_four_staggered_equals_alone(engines, alone, tiny_model):
    """Four rows joining 30 ms apart (a join drops the queued round), one ending at
    max_tokens and one at a stop token while the others run on (a finish drops it too):
    each row equal to its solo run and to mlx-lm's."""
    model = tiny_model[0]
    eng = engines["pipelined"]
    p1 = alone[1][1]
    k = next(i for i in range(5, N) if p1[i] not in p1[:i])
    reqs = [GenerationRequest(prompt=alone[0][0], max_tokens=N, methods=["off"]),
            GenerationRequest(prompt=alone[1][0], max_tokens=N, stop_token_ids=[p1[k]], methods=["off"]),
            GenerationRequest(prompt=alone[2][0], max_tokens=11, methods=["off"]),
            GenerationRequest(prompt=alone[3][0], max_tokens=N, methods=["off"])]
    rounds, used = counters(eng)
    got = together(eng, reqs, stagger=0.03)
    lengths = [N, k + 1, 11, N]
    for (tokens, reason), (p, plain, want), n in zip(got, alone, lengths):
        assert len(tokens) == n
        assert_same_or_near_tie(model, p, tokens, plain[:n])
        assert_same_or_near_tie(model, p, tokens, want[:n])
    assert [r for _, r in got] == ["length", "stop", "length", "length"]
    # the rows ran together in pipelined rounds: fewer rounds than tokens, most of them queued
    assert counters(eng)[0] - rounds < sum(lengths) - len(lengths)
    assert counters(eng)[1] - used > (counters(eng)[0] - rounds) // 2
    # the same batch on the plain engine (the same rounds' shapes, no queue) agrees
    ref = together(engines["plain"], reqs, stagger=0.03)
    for (tokens, _), (want_tokens, _), (p, _, _) in zip(got, ref, alone):
        assert_same_or_near_tie(model, p, tokens, want_tokens)


def test_second_turn_after_a_pipelined_finish_hits_the_prefix_cache(engines, alone, tiny_model):
    """A row that ended while its next round was queued (whose cache writes lie past its
    end) leaves its prefix in the prompt cache; a turn extending it reuses that prefix
    and decodes what mlx-lm decodes from the whole prompt."""
    model, tok, _ = tiny_model
    eng = engines["pipelined"]
    p, plain, _ = alone[2]
    first, _ = run(eng, GenerationRequest(prompt=p, max_tokens=9, methods=["off"]))
    follow = tok.encode("\nNow say it again, shorter.", add_special_tokens=False)
    second_prompt = p + first + follow
    before = counters(eng)[0]
    chunks = eng.generate_sync(GenerationRequest(prompt=second_prompt, max_tokens=16, methods=["off"]))
    got = [t for c in chunks for t in c.tokens]
    want = [r.token for r in stream_generate(model, tok, second_prompt, max_tokens=16)]
    assert_same_or_near_tie(model, second_prompt, got, want)
    assert counters(eng)[0] - before == len(got) - 1
    assert chunks[-1].cached_tokens >= len(p), chunks[-1].cached_tokens  # the first turn's prefix, at least


def test_pipelined_rounds_interleaved_with_a_long_prefill(engines, alone, tiny_model):
    """A row whose long prompt is prefilled in chunks (SchedulerConfig.prefill_chunk_busy)
    between the rounds of a decoding row: the queued round stays in use across the
    chunks (the prefill runs in a cache of its own) and is dropped when the row joins."""
    model, tok, _ = tiny_model
    eng, ref = engines["pipelined"], engines["plain"]
    long_text = " ".join(f"item {i}: {TEXTS[i % 4]}" for i in range(40))
    long_prompt = chat_prompt(tok, long_text)
    assert len(long_prompt) > 3 * eng.scheduler.config.prefill_chunk_busy
    p, plain, _ = alone[0]
    reqs = [GenerationRequest(prompt=p, max_tokens=N, methods=["off"]),
            GenerationRequest(prompt=long_prompt, max_tokens=24, methods=["off"])]
    rounds, used = counters(eng)
    got = together(eng, reqs, stagger=0.05)
    assert counters(eng)[1] - used > 0 and counters(eng)[0] - rounds < N + 24 - 2
    solo_long = run(ref, GenerationRequest(prompt=long_prompt, max_tokens=24, methods=["off"]))[0]
    want_long = [r.token for r in stream_generate(model, tok, long_prompt, max_tokens=24)]
    assert_same_or_near_tie(model, p, got[0][0], plain)
    assert_same_or_near_tie(model, long_prompt, got[1][0], solo_long)
    assert_same_or_near_tie(model, long_prompt, got[1][0], want_long)
