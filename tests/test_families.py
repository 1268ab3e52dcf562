"""Every layer family mlx-lm runs, served exactly: full attention (llama), MoE
(qwen3_moe), sliding window + global (gemma3_text; gemma4_text with wider global layers
and shared caches), sliding window + attention sinks
+ MoE (gpt_oss), hybrid Gated DeltaNet (qwen3_next, qwen3_5), MLA latents + MoE
(deepseek_v3), Mamba-2 state beside attention in one CacheList per layer (falcon_h1). Tiny random-weight models built from mlx-lm's own classes
(bench/family_models.py) are the oracles' subjects; mlx-lm's `stream_generate` and plain
forwards are the references.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import stream_generate

from jumpahead.engine.methods.proposal import Proposal
from jumpahead.engine.types import GenerationRequest
from jumpahead.bench.family_models import FAMILIES, WINDOW, build
from tests.oracle import assert_same_or_near_tie, reference_logits

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "Hello there, write a function that adds two numbers please",
    "List the files in the current folder",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n# explain this code in detail",
    "What is the capital of France? Answer in one word, then explain why it is the capital.",
]
N = 16
REAL = "gemma3-270m"  # real weights of a second family (engine/model/gemma3_model.py): slow, downloads once
ALL = [*FAMILIES, pytest.param(REAL, marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    from jumpahead.engine.model.default_model import ensure_default_model

    root = tmp_path_factory.mktemp("families")
    tok = ensure_default_model(progress=lambda s: None)
    return lambda fam: fam if fam == REAL else build(fam, root, tok)


@pytest.fixture(scope="module")
def fam(request) -> str:
    """The family a test runs on. Module-scoped (tests parametrize it indirectly), so
    pytest runs each family's tests together and `family` builds its model and engine
    once per family, not once per test."""
    return request.param


@pytest.fixture(scope="module")
def family(family_dir):
    """fam -> dict(model, tokenizer, engine, prompts, ordinary), built once per module."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    made: dict[str, dict] = {}

    def get(fam: str) -> dict:
        if fam not in made:
            for other in made.values():  # one tiny engine thread at a time
                other["engine"].close()
            made.clear()
            model, tok, info = load_model(str(family_dir(fam)), progress=lambda s: None)
            eng = Engine(model, tok, info, EngineConfig(max_batch=8, cost_aware=False, prefix_cache=False))
            texts = list(TEXTS)
            if fam == REAL:  # cross the real model's window (512) three times, as agents' prompts do
                listing = "\n".join(f"def step_{i}(x):\n    return x * {i} + {i % 7}" for i in range(150))
                texts[0] = f"{listing}\n\n{texts[0]}"
            prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                       for t in texts]
            made[fam] = {"model": model, "tokenizer": tok, "info": info, "engine": eng, "prompts": prompts, "texts": texts,
                         "ordinary": {}}
        return made[fam]

    yield get
    for f in made.values():
        f["engine"].close()


def tokens_of(chunks) -> list[int]:
    return [t for c in chunks for t in c.tokens]


def ordinary(f: dict, i: int) -> list[int]:
    if i not in f["ordinary"]:
        f["ordinary"][i] = tokens_of(f["engine"].generate_sync(GenerationRequest(prompt=f["prompts"][i], max_tokens=N)))
    return f["ordinary"][i]


class ScriptedVerified:
    """Verified proposals of a known continuation, corrupted on purpose: `mode`
    "accept" (all right), "partial" (wrong from its 3rd token), "first" (wrong at
    its 1st). The target must verify them back to ordinary decoding."""

    name = "echo"

    def __init__(self, continuation: list[int], mode: str, span: int = 5) -> None:
        self.continuation, self.mode, self.span = continuation, mode, span
        self.proposed = 0

    def propose(self, view, max_len):
        done = len(view.tokens) - view.prompt_len
        nxt = list(self.continuation[done : done + min(self.span, max_len)])
        if not nxt:
            return None
        bad = {"accept": len(nxt), "partial": 2, "first": 0}[self.mode]
        for j in range(bad, len(nxt)):
            nxt[j] = (nxt[j] + 7 + j) % 40000 + 100
        self.proposed += 1
        return Proposal(nxt, "echo")

    def feedback(self, proposal, accepted):
        pass


@pytest.mark.parametrize("fam", ALL, indirect=True)
def test_greedy_equals_mlx_lm(family, fam):
    f = family(fam)
    prompt = f["prompts"][0]
    window = getattr(f["model"].args, "sliding_window", None) if fam == REAL else WINDOW
    assert len(prompt) > 3 * window  # the sliding windows are crossed
    want = [r.token for r in stream_generate(f["model"], f["tokenizer"], prompt, max_tokens=N)]
    got = ordinary(f, 0)
    assert_same_or_near_tie(f["model"], prompt, got, want)
    layers = f["engine"].health()["layers"]["layers"]
    expect = {"gemma3_text": "sliding", "gemma4_text": "sliding", "gpt_oss": "sliding", "qwen3_next": "recurrent", "qwen3_5": "recurrent",
              "falcon_h1": "recurrent", "llama4": "chunked", REAL: "sliding"}
    assert expect.get(fam, "full") in layers
    # chunked attention serves one row at a time; every other family batches
    assert f["engine"].health()["layers"]["one_row_per_forward"] is (fam == "llama4")


async def _collect(engine, req: GenerationRequest, delay: float) -> list[int]:
    await asyncio.sleep(delay)
    out: list[int] = []
    async for chunk in engine.stream(req):
        out += chunk.tokens
    return out


def staggered_four(f: dict, alone: list[list[int]], **request: object) -> list[list[int]]:
    """f's first four prompts (GenerationRequest(..., **request)) in one batch, row i joining
    0.05 * i s late; odd rows carry proposals of `alone[i]` that are partly wrong (rounds of
    mixed widths). Each row's tokens."""
    def req(i: int) -> GenerationRequest:
        r = GenerationRequest(prompt=f["prompts"][i], max_tokens=N, **request)
        if i % 2:  # odd rows carry proposals: rounds of mixed widths
            r.proposers = [ScriptedVerified(alone[i], "partial", span=2 + i)]
        return r

    async def together():
        return await asyncio.gather(*[_collect(f["engine"], req(i), 0.05 * i) for i in range(4)])

    return asyncio.run(together())


@pytest.mark.parametrize("fam", ALL, indirect=True)
def test_batch_of_four_equals_alone(family, fam):
    """Four rows with different prompt lengths and staggered joins, with verified
    proposals of different widths in the same rounds (padding), each equal to alone."""
    f = family(fam)
    alone = [ordinary(f, i) for i in range(4)]
    got = staggered_four(f, alone)
    for i in range(4):
        assert_same_or_near_tie(f["model"], f["prompts"][i], got[i], alone[i])


@pytest.mark.parametrize("fam", ALL, indirect=True)
@pytest.mark.parametrize("mode", ["accept", "partial", "first"])
def test_verified_proposals_equal_ordinary(family, fam, mode):
    f = family(fam)
    want = ordinary(f, 1)
    r = GenerationRequest(prompt=f["prompts"][1], max_tokens=N)
    prop = ScriptedVerified(want, mode)
    r.proposers = [prop]
    chunks = f["engine"].generate_sync(r)
    got = tokens_of(chunks)
    assert prop.proposed > 0
    fill = chunks[-1].fill
    if mode == "accept":
        assert fill["verified"]["accepted"] > N // 2 and fill["verified"]["rejected"] <= 5
    else:
        assert fill["verified"]["rejected"] > 0
    assert_same_or_near_tie(f["model"], f["prompts"][1], got, want)


@pytest.mark.parametrize("fam", ALL, indirect=True)
@pytest.mark.parametrize("method", ["echo", "ngram", "draft"])
def test_methods_equal_ordinary(family, family_dir, fam, method):
    """The real proposers (draft: the tiny llama as draft model) on a copy-heavy prompt."""
    from jumpahead.engine.methods.draft_model import DraftModel
    from jumpahead.engine.model.loader import load_model

    f = family(fam)
    eng = f["engine"]
    if method == "draft" and eng.method_state("draft") is None and fam == REAL:  # its own weights as the draft
        eng.attach("draft", DraftModel(f["model"], f["tokenizer"], f["info"], target_tokenizer=f["tokenizer"]))
    elif method == "draft" and eng.method_state("draft") is None:
        dm, _, di = load_model(str(family_dir("llama")), progress=lambda s: None)
        # The same tokenizer files; transformers picks its class by model_type (qwen3_5
        # gets Qwen2's pre-tokenizer), so the draft is given the target's tokenizer.
        eng.attach("draft", DraftModel(dm, f["tokenizer"], di, target_tokenizer=f["tokenizer"]))
    want = ordinary(f, 2)
    chunks = eng.generate_sync(GenerationRequest(prompt=f["prompts"][2], max_tokens=N, methods=[method]))
    assert "declined" not in chunks[-1].fill, chunks[-1].fill
    assert_same_or_near_tie(f["model"], f["prompts"][2], tokens_of(chunks), want)


@pytest.mark.parametrize("fam", ALL, indirect=True)
def test_state_after_rejection_equals_fresh_forward(family, fam):
    """Two rows of different lengths verify proposals of different widths; each
    accepts part. After the round is settled (attention by pointer, recurrent state
    by replay) the next logits equal a fresh forward over the committed tokens."""
    from jumpahead.engine.kv.cache_layout import single_row

    f = family(fam)
    runner, model = f["engine"].runner, f["model"]
    prompts = [f["prompts"][0], f["prompts"][1]]
    rows = [[prompts[0][-1], 11, 12, 13, 14, 15], [prompts[1][-1], 21, 22]]
    consumed = [3, 1]  # row 0 kept pending + 2 proposal tokens, row 1 rejected at once
    nxt = [[31], [32]]
    # a model served one row at a time (chunked attention) verifies each row alone
    groups = [[0], [1]] if single_row(runner.layout) else [[0, 1]]
    for group in groups:
        cache = runner.new_cache()
        for b in group:  # prefill each row alone, then join, as the scheduler does
            one = runner.new_cache()
            one.ends = [0]
            runner.forward([prompts[b][:-1]], one, None)
            one.advance([len(prompts[b]) - 1])
            mx.eval(one.arrays())
            cache.append_rows(one)
        before = cache.states()
        runner.forward_ragged([rows[b] for b in group], cache, [len(rows[b]) for b in group])
        runner.replay(cache, [rows[b] for b in group], [consumed[b] for b in group], before)
        cache.advance([consumed[b] for b in group])
        logits, _ = runner.forward_ragged([nxt[b] for b in group], cache, [1] * len(group))
        for i, b in enumerate(group):
            committed = prompts[b][:-1] + rows[b][: consumed[b]] + nxt[b]
            ref = reference_logits(model, committed)
            diff = float(mx.abs(logits[i].astype(mx.float32) - ref).max())
            assert diff < 1e-3 * max(1.0, float(mx.abs(ref).max())), (fam, b, diff)


SLIDING = ["gemma3_text", "gemma4_text", "gpt_oss"]


@pytest.mark.parametrize("fam", SLIDING, indirect=True)
def test_sliding_layers_keep_a_ring_not_the_context(family, fam):
    """A sliding layer's buffers hold window + the widest forward's tokens, not the
    context: prefilled in chunks of 8, then decoded far past its ring, with a
    partly rejected proposal and a row of another length joined on the way, every
    step's logits equal a fresh forward over the committed tokens."""
    f = family(fam)
    runner, model = f["engine"].runner, f["model"]

    def check(logits, committed_rows):
        for b, committed in enumerate(committed_rows):
            ref = reference_logits(model, committed)
            diff = float(mx.abs(logits[b].astype(mx.float32).reshape(-1) - ref.reshape(-1)).max())
            assert diff < 1e-3 * max(1.0, float(mx.abs(ref).max())), (fam, b, len(committed), diff)

    def prefilled(p):
        one = runner.new_cache()
        one.ends = [0]
        for at in range(0, len(p), 8):
            runner.forward([p[at : at + 8]], one, None)
            one.advance([len(p[at : at + 8])])
        mx.eval(one.arrays())
        return one

    long, short = f["prompts"][0][:-1], f["prompts"][1][:-1]
    cache = prefilled(long)
    rows = [list(long)]
    for step in range(3 * WINDOW):
        logits = runner.forward([[rows[0][-1] if step else f["prompts"][0][-1]]], cache)
        rows[0].append(rows[0][-1] if step else f["prompts"][0][-1])
        cache.advance([1])
        check(logits[:, -1], rows)
        if step == WINDOW:  # a row of another length joins the group
            cache.append_rows(prefilled(short))
            rows.append(list(short))
            break
    # both rows verify a proposal of 5; row 0 keeps 2, row 1 none: rollback by pointer
    proposal = [[rows[0][-1], 11, 12, 13, 14], [f["prompts"][1][-1], 21, 22, 23, 24]]
    runner.forward(proposal, cache, None)
    cache.advance([2, 1])
    rows[0] += proposal[0][:2]
    rows[1] += proposal[1][:1]
    for step in range(2 * WINDOW):
        nxt = [[5 + step], [7 + step]]
        logits = runner.forward(nxt, cache)
        cache.advance([1, 1])
        rows[0].append(5 + step)
        rows[1].append(7 + step)
        check(logits[:, -1], rows)
    for layer in cache.windowed:
        assert layer.capacity <= layer.window + 8 < len(rows[0]), (layer.capacity, len(rows[0]))
    assert all(l.capacity >= len(rows[0]) for l in cache.stored)


COLD_AND_WARM = r"""
import json, sys
import jumpahead.engine
from jumpahead.engine.engine import Engine, EngineConfig
from jumpahead.engine.types import GenerationRequest
folder, directory, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
eng = Engine.load(folder, EngineConfig(prefix_cache_dir=directory), progress=lambda s: None)
chunks = eng.generate_sync(GenerationRequest(prompt=prompt, max_tokens=12))
stats = eng.metrics()["prefix_cache"]
print(json.dumps({"tokens": [t for c in chunks for t in c.tokens], "cached": chunks[-1].cached_tokens,
                  "ssd_hit_tokens": stats["ssd_hit_tokens"]}))
eng.close()
"""


@pytest.mark.parametrize("fam", ALL, indirect=True)
def test_prefix_cache_second_turn_in_ram_and_from_ssd(family, family_dir, fam, tmp_path):
    """An agent's second turn (first prompt + answer + a tool result) reports the first
    turn's tokens as cached and gives the cold tokens, from RAM and, after a restart
    (a new process), from SSD."""
    from jumpahead.engine.engine import Engine, EngineConfig

    f = family(fam)
    tok = f["tokenizer"]
    messages = [{"role": "user", "content": f["texts"][0]}]
    first = f["prompts"][0]
    directory = str(tmp_path / "pc")
    eng = Engine(f["model"], tok, f["info"], EngineConfig(prefix_cache_dir=directory))
    try:
        answer = tokens_of(eng.generate_sync(GenerationRequest(prompt=first, max_tokens=12)))
        assert_same_or_near_tie(f["model"], first, answer, ordinary(f, 0)[:12])
        messages += [{"role": "assistant", "content": tok.decode([t for t in answer if t not in tok.eos_token_ids])},
                     {"role": "user", "content": "The tool printed: 42 files, 3 folders."}]
        second = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert second[: len(first)] == first
        cold = tokens_of(f["engine"].generate_sync(GenerationRequest(prompt=second, max_tokens=12)))
        chunks = eng.generate_sync(GenerationRequest(prompt=second, max_tokens=12))
        assert chunks[-1].cached_tokens >= len(first)
        assert_same_or_near_tie(f["model"], second, tokens_of(chunks), cold)
        # both turns published at the prompt's end and when the row retired (a batch of one)
        assert eng.prefix_cache.counters["publish_errors"] == 0
        assert eng.prefix_cache.counters["published"] >= 3, eng.prefix_cache.counters
        eng.prefix_cache.flush(timeout=60)
    finally:
        eng.close()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", COLD_AND_WARM, str(family_dir(fam)), directory, json.dumps(second)],
                         capture_output=True, text=True, cwd=str(REPO), env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    warm = json.loads(out.stdout.strip().splitlines()[-1])
    assert warm["cached"] >= len(first) and warm["ssd_hit_tokens"] >= len(first), warm
    assert_same_or_near_tie(f["model"], second, warm["tokens"], cold)


@pytest.mark.parametrize("fam", [f for f in ALL if getattr(f, "values", (f,))[0] in ("gemma3_text", "gemma4_text", "gpt_oss", REAL)],
                         indirect=True)
def test_stored_prefix_keeps_only_the_sliding_windows(family, fam, tmp_path):
    """A stored prefix holds the full layers' KV by token and each sliding layer's last
    window only (an exact snapshot), so it does not grow with the sliding layers: its
    bytes are what the formula says, and a hit installs a row whose next logits equal
    a fresh forward's."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.prefix.prefix_cache import RECURRENT

    f = family(fam)
    prompt = f["prompts"][0]
    eng = Engine(f["model"], f["tokenizer"], f["info"], EngineConfig(prefix_cache_ssd=False))
    try:
        eng.generate_sync(GenerationRequest(prompt=prompt, max_tokens=2))
        pc = eng.prefix_cache
        hit = pc.lookup(prompt)
        assert hit.length == len(prompt)  # the snapshot at the prompt's end
        probe = eng.runner.new_cache()
        windows = [l.window for l in probe.windowed]
        assert windows and len(probe.stored) + len(windows) == len(probe.attention)
        kv = mx.concatenate(hit.pieces, axis=3)
        assert kv.shape[0] == len(probe.stored) and kv.shape[3] == len(prompt)
        snap = hit.companions[RECURRENT][1]
        for i, w in enumerate(windows):
            assert snap[f"w{i}.k"].shape[2] == min(w, len(prompt)) < len(prompt)
        stored = kv.nbytes + sum(a.nbytes for a in snap.values())
        whole = kv.nbytes // len(probe.stored) * len(probe.attention)
        assert stored < whole
        # installed, the row continues exactly: its next logits equal a fresh forward's
        cache = eng.runner.new_cache()
        cache.ends = [0]
        capacity = len(prompt) + 64
        pc.install(hit, cache, capacity)
        cache.set_row_states(snap, capacity)
        nxt = ordinary(f, 0)[0]
        logits = eng.runner.forward([[nxt]], cache)
        ref = reference_logits(f["model"], prompt + [nxt])
        diff = float(mx.abs(logits[0].astype(mx.float32).reshape(-1) - ref.reshape(-1)).max())
        assert diff < 1e-3 * max(1.0, float(mx.abs(ref).max())), diff
    finally:
        eng.close()


def test_unknown_cache_kind_is_refused_at_load(family_dir):
    """A layer cache the engine does not know fails at startup, naming it."""
    from mlx_lm.models.cache import _BaseCache

    from jumpahead.engine.kv.cache_layout import UnsupportedModel
    from jumpahead.engine.engine import Engine
    from jumpahead.engine.model.loader import load_model

    class MysteryCache(_BaseCache):  # a cache kind mlx-lm might add later
        pass

    model, tok, info = load_model(str(family_dir("llama")), progress=lambda s: None)
    model.make_cache = lambda: [MysteryCache() for _ in model.layers]
    with pytest.raises(UnsupportedModel, match="MysteryCache"):
        Engine(model, tok, info)
