"""The prefix cache: RAM radix tree, SSD tier, restarts, damaged files, eviction.

Engine-level tests run the real default model and compare against an engine with
the cache off (near-tie oracle: a cached prefix changes the prefill's matmul shapes,
so the last bits of a logit may differ). Tree and file mechanics are also tested on
small synthetic caches, which is fast and exact.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from jumpahead.engine.engine import Engine, EngineConfig
from jumpahead.engine.prefix.prefix_cache import PrefixCache
from jumpahead.engine.kv.row_cache import DiskPiece, RowKVCache
from jumpahead.engine.prefix.ssd_cache import SsdStore
from jumpahead.engine.types import GenerationRequest
from tests.oracle import assert_same_or_near_tie
from tests.serving import engine_of

REPO = Path(__file__).resolve().parents[1]
SYSTEM = "You are a careful coding assistant. Answer briefly."
QUESTIONS = [
    "Write a haiku about the sea.",
    "Explain in one sentence what a linked list is.",
    "Name three colors of the rainbow.",
]


# --- helpers ---------------------------------------------------------------------------


def chat(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def run(engine: Engine, prompt: list[int], max_tokens: int = 12) -> tuple[list[int], list]:
    chunks = engine.generate_sync(GenerationRequest(prompt=prompt, max_tokens=max_tokens))
    return [t for c in chunks for t in c.tokens], chunks


@pytest.fixture
def engines(loaded_model):
    made: list[Engine] = []

    def make(**config) -> Engine:
        model, tokenizer, info = loaded_model
        eng = Engine(model, tokenizer, info, EngineConfig(max_batch=4, **config))
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.close()


@pytest.fixture(scope="module")
def cache_off(loaded_model):
    with engine_of(loaded_model, max_batch=4, prefix_cache=False) as eng:
        yield eng


def fake_cache(tokens: int, layers: int = 2, heads: int = 2, dim: int = 4, seed: int = 0) -> RowKVCache:
    """A single-row RowKVCache whose positions [0, tokens) hold distinct random values."""
    cache = RowKVCache(layers)
    rng = np.random.default_rng(seed)
    for layer in cache.layers:
        layer.keys = mx.array(rng.standard_normal((1, heads, tokens + 8, dim), dtype=np.float32))
        layer.values = mx.array(rng.standard_normal((1, heads, tokens + 8, dim), dtype=np.float32))
    cache.ends = [tokens]
    mx.eval(cache.arrays())
    return cache


def expected_kv(cache: RowKVCache, lo: int, hi: int) -> np.ndarray:
    return np.stack([np.stack([np.array(l.keys[0, :, lo:hi]), np.array(l.values[0, :, lo:hi])]) for l in cache.layers])


def hit_kv(hit) -> np.ndarray:
    # a piece still on disk (DiskPiece) is read the way a row's install reads it
    return np.concatenate([np.array(p.load() if isinstance(p, DiskPiece) else p) for p in hit.pieces], axis=3)


def span(a: mx.array) -> tuple[int, int]:
    """[first byte, last byte) of the memory an evaluated array's view covers."""
    n = np.asarray(a)
    lo = n.__array_interface__["data"][0]
    return lo, lo + n.nbytes if n.flags["C_CONTIGUOUS"] else lo + sum((s - 1) * st for s, st in zip(n.shape, n.strides)) + n.itemsize


def overlaps(a: mx.array, b: mx.array) -> bool:
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


# --- engine-level: same tokens with the cache on and off --------------------------------


def test_multi_turn_same_tokens_with_cache_on_and_off(engines, cache_off, loaded_model, tmp_path):
    model, tokenizer, _ = loaded_model
    on = engines(prefix_cache_dir=str(tmp_path / "pc"))
    messages = [{"role": "system", "content": SYSTEM}]
    prev_prompt: list[int] | None = None
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        prompt = chat(tokenizer, messages)
        want, _ = run(cache_off, prompt)
        got, chunks = run(on, prompt)
        assert_same_or_near_tie(model, prompt, got, want)
        first, last = chunks[0].cached_tokens, chunks[-1].cached_tokens
        assert first == last, "cached_tokens is reported on the first and the last chunk"
        if prev_prompt is None:
            assert last == 0
        else:
            # the previous prompt and the tokens the model generated last turn are reused
            assert len(prev_prompt) < last < len(prompt), (len(prev_prompt), last, len(prompt))
        messages.append({"role": "assistant", "content": tokenizer.decode([t for t in want if t not in tokenizer.eos_token_ids])})
        prev_prompt = prompt

    stats = on.metrics()["prefix_cache"]
    assert stats["hits"] == len(QUESTIONS) - 1 and stats["cached_tokens"] > 0
    assert 0 < stats["token_hit_rate"] < 1 and stats["ram_bytes"] > 0
    assert on.flush_prefix_cache(timeout=60)
    stats = on.metrics()["prefix_cache"]
    assert stats["ssd_files"] > 0 and stats["ssd_bytes"] > 0 and stats["ssd_pending_bytes"] == 0


def test_concurrent_hits_on_a_shared_prefix(engines, cache_off, loaded_model, tmp_path):
    """Two sessions share the system prompt; their next turns hit while the other row
    is decoding. Each equals its cache-off run (no entry aliases a live row's cache)."""
    model, tokenizer, _ = loaded_model
    on = engines(prefix_cache_dir=str(tmp_path / "pc"))
    firsts = [chat(tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in QUESTIONS[:2]]
    for p in firsts:
        run(on, p, max_tokens=4)
    tail = tokenizer.encode("<|im_start|>user\nAnd again, differently.<|im_end|>\n<|im_start|>assistant\n")
    seconds = [p + tail for p in firsts]
    want = [run(cache_off, p, max_tokens=16)[0] for p in seconds]

    async def both():
        async def one(p, delay):
            await asyncio.sleep(delay)
            out, cached = [], []
            async for c in on.stream(GenerationRequest(prompt=p, max_tokens=16)):
                out += c.tokens
                cached.append(c.cached_tokens)
            return out, cached

        return await asyncio.gather(one(seconds[0], 0.0), one(seconds[1], 0.3))

    for p, w, (got, cached) in zip(seconds, want, asyncio.run(both())):
        assert cached[0] >= len(p) - len(tail), "the second turn starts from the first turn's prompt"
        assert_same_or_near_tie(model, p, got, w)


def test_entries_are_real_copies(loaded_model):
    """Published entries and installed hits live in buffers of their own."""
    from jumpahead.engine.kv.model_runner import ModelRunner

    model, tokenizer, _ = loaded_model
    runner = ModelRunner(model)
    a = chat(tokenizer, [{"role": "user", "content": QUESTIONS[0]}])
    b = chat(tokenizer, [{"role": "user", "content": QUESTIONS[1]}])

    def prefilled(tokens):
        c = runner.new_cache()
        c.ends = [0]
        runner.forward([tokens], c, None)
        c.advance([len(tokens)])
        mx.eval(c.arrays())
        return c

    group = prefilled(a)
    group.append_rows(prefilled(b))
    pc = PrefixCache(1 << 30)
    pc.insert(b, group, 1)
    pc.insert(a, group, 0)  # shares the template's first tokens with b: splits b's node
    nodes = list(pc._ram_nodes)
    assert len(nodes) == 3
    for i, node in enumerate(nodes):
        for layer in group.layers:
            assert not overlaps(node.kv, layer.keys) and not overlaps(node.kv, layer.values)
        for other in nodes[i + 1 :]:
            assert not overlaps(node.kv, other.kv)
    before = [np.array(n.kv) for n in nodes]
    row = runner.new_cache()
    hit = pc.lookup(b, limit=len(b) - 1)
    assert hit.length == len(b) - 1
    pc.install(hit, row, 256)
    for node in nodes:
        for layer in row.layers:
            assert not overlaps(node.kv, layer.keys) and not overlaps(node.kv, layer.values)
    # both the group and the restored row keep writing: the entries do not change
    runner.forward([[b[-1]], [7]], group, None)
    group.advance([1, 1])
    runner.forward([[b[-1], 5, 6]], row, None)
    row.advance([3])
    mx.eval(group.arrays() + row.arrays())
    for node, old in zip(nodes, before):
        assert np.array_equal(np.array(node.kv), old)


# --- SSD: restart in a new process, SIGKILL mid-write, damaged files --------------------

WRITER = r"""
import json, random, sys
import jumpahead.engine
from jumpahead.engine.model.loader import load_model
from jumpahead.engine.engine import Engine, EngineConfig
from jumpahead.engine.types import GenerationRequest

directory, prompt, seed, big = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m, tok, info = load_model(None, progress=lambda s: None)
eng = Engine(m, tok, info, EngineConfig(prefix_cache_dir=directory))
chunks = eng.generate_sync(GenerationRequest(prompt=prompt, max_tokens=12))
assert eng.flush_prefix_cache(timeout=120)
print("FLUSHED " + json.dumps([t for c in chunks for t in c.tokens]), flush=True)
rng = random.Random(seed)
for i in range(1000):  # keep publishing big entries until the parent kills us
    print(f"BIG {i}", flush=True)
    p = prompt + [rng.randrange(100, 40000) for _ in range(big)]
    eng.generate_sync(GenerationRequest(prompt=p, max_tokens=1))
"""


def big_prompt(prompt: list[int], seed: int, big: int, index: int) -> list[int]:
    import random

    rng = random.Random(seed)
    for i in range(index + 1):
        p = prompt + [rng.randrange(100, 40000) for _ in range(big)]
    return p


def test_restart_in_new_process_and_sigkill_mid_write(engines, cache_off, loaded_model, tmp_path):
    model, tokenizer, _ = loaded_model
    directory = tmp_path / "pc"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    prompt = chat(tokenizer, messages)
    seed, big = 7, 320
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), json.dumps(prompt), str(seed), str(big)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("FLUSHED "), line + proc.stderr.read()
        first = json.loads(line[len("FLUSHED "):])
        # kill it while a big entry is being written (its temp file exists)
        deadline = time.monotonic() + 240
        killed_mid_write = False
        while time.monotonic() < deadline and proc.poll() is None:
            if any(p.name.endswith(".tmp") for p in directory.iterdir()):
                os.kill(proc.pid, signal.SIGKILL)
                killed_mid_write = True
                break
            time.sleep(0.001)
        assert killed_mid_write, "the writer never started a big write"
        proc.wait(timeout=30)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    interrupted = max(int(l.split()[1]) for l in out.splitlines() if l.startswith("BIG "))
    assert any(p.name.endswith(".tmp") for p in directory.iterdir()), "the kill landed after the rename"

    on = engines(prefix_cache_dir=str(directory))  # the restart: index rebuilt from disk
    assert not any(p.name.endswith(".tmp") for p in directory.iterdir()), "unfinished writes are removed"
    assert on.metrics()["prefix_cache"]["ssd_files"] >= 2

    # the next turn of the conversation hits the entries the other process wrote
    messages.append({"role": "assistant", "content": tokenizer.decode([t for t in first if t not in tokenizer.eos_token_ids])})
    messages.append({"role": "user", "content": QUESTIONS[1]})
    turn2 = chat(tokenizer, messages)
    want, _ = run(cache_off, turn2)
    got, chunks = run(on, turn2)
    assert chunks[-1].cached_tokens > len(prompt)
    stats = on.metrics()["prefix_cache"]
    assert stats["ssd_hits"] == 1 and stats["ssd_hit_tokens"] > len(prompt)
    assert_same_or_near_tie(model, turn2, got, want)

    # the entry whose write was killed is never used wrongly
    p = big_prompt(prompt, seed, big, interrupted)
    want, _ = run(cache_off, p, max_tokens=4)
    got, chunks = run(on, p, max_tokens=4)
    assert chunks[-1].cached_tokens < len(p) - 1, "the interrupted entry must not exist"
    assert_same_or_near_tie(model, p, got, want)


def _kv_region(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    a, b = header["kv"]["data_offsets"]
    return 8 + hlen + a, 8 + hlen + b


def test_corrupt_truncated_and_foreign_files_are_skipped(engines, cache_off, loaded_model, tmp_path, caplog):
    model, tokenizer, _ = loaded_model
    directory = tmp_path / "pc"
    prompts = [chat(tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in QUESTIONS]
    lcp = lambda x, y: next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
    shared = lcp(prompts[0], prompts[1])
    assert lcp(prompts[2], prompts[0]) == lcp(prompts[2], prompts[1]) == shared
    a = engines(prefix_cache_dir=str(directory))
    for p in prompts:
        run(a, p, max_tokens=2)
    assert a.flush_prefix_cache(timeout=60)
    a.close()

    def prompt_file(p: list[int]) -> Path:
        start = 0 if p is prompts[0] else shared
        (f,) = directory.glob(f"{start:08d}-{len(p):08d}-*.safetensors")
        return f

    corrupt, truncated, foreign_src = prompt_file(prompts[1]), prompt_file(prompts[2]), prompt_file(prompts[0])
    lo, hi = _kv_region(corrupt)
    with open(corrupt, "r+b") as fh:  # flip bytes in the middle of the KV data
        fh.seek((lo + hi) // 2)
        chunk = fh.read(64)
        fh.seek((lo + hi) // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
    with open(truncated, "r+b") as fh:
        fh.truncate(truncated.stat().st_size - 1000)
    # a file of another model: same layout, other fingerprint
    raw = bytearray(foreign_src.read_bytes())
    fp = a.prefix_cache.ssd.fingerprint.encode()
    i = raw.index(fp)
    raw[i : i + len(fp)] = b"f" * len(fp)
    foreign = directory / f"{len(prompts[0]):08d}-{len(prompts[0]) + 40:08d}-{'0' * 16}.safetensors"
    foreign.write_bytes(bytes(raw))

    caplog.set_level(logging.WARNING, logger="jumpahead.engine.cache")
    b = engines(prefix_cache_dir=str(directory))
    text = caplog.text
    assert truncated.name in text and "truncated" in text and not truncated.exists()
    assert foreign.name in text and "foreign" in text and foreign.exists(), "foreign files are skipped, not deleted"

    for p, damaged in ((prompts[1], corrupt), (prompts[2], truncated)):
        want, _ = run(cache_off, p)
        got, chunks = run(b, p)
        assert chunks[-1].cached_tokens == shared, "only the intact shared prefix is used"
        assert_same_or_near_tie(model, p, got, want)
    # (the corrupt file was deleted; the prompt's own publish has written it again, intact)
    assert f"{corrupt.name}: data checksum mismatch (deleted)" in caplog.text
    stats = b.metrics()["prefix_cache"]
    assert stats["ssd_corrupt"] == 1 and stats["ssd_skipped"] == 2
    # the intact entry still hits
    got, chunks = run(b, prompts[0])
    assert chunks[-1].cached_tokens == len(prompts[0]) - 1


def test_one_process_per_directory(engines, tmp_path, caplog):
    a = engines(prefix_cache_dir=str(tmp_path / "pc"))
    caplog.set_level(logging.WARNING, logger="jumpahead.engine")
    b = engines(prefix_cache_dir=str(tmp_path / "pc"))
    assert a.prefix_cache.ssd is not None and b.prefix_cache.ssd is None
    assert "in use" in caplog.text


# --- tree mechanics on synthetic caches ----------------------------------------------------


def test_radix_split_partial_hits_are_exact():
    pc = PrefixCache(1 << 30)
    x = list(range(1000, 1100))
    y = x[:50] + list(range(5000, 5050))
    cx, cy = fake_cache(100, seed=1), fake_cache(100, seed=2)
    assert pc.insert(x, cx, 0) == 100
    assert pc.insert(y, cy, 0) == 50  # only the part the tree lacks is copied
    assert pc.insert(x[:70], cx, 0) == 0
    h = pc.lookup(x[:70] + [1, 2, 3])
    assert h.length == 70 and np.array_equal(hit_kv(h), expected_kv(cx, 0, 70))
    h = pc.lookup(y + [9])
    assert h.length == 100
    assert np.array_equal(hit_kv(h)[:, :, :, :50], expected_kv(cx, 0, 50))  # shared part from x
    assert np.array_equal(hit_kv(h)[:, :, :, 50:], expected_kv(cy, 50, 100))
    assert pc.lookup(y, limit=99).length == 99
    assert pc.lookup([7, 8, 9]).length == 0


def test_ram_eviction_by_budget_keeps_recent_and_disk_backed(tmp_path):
    seqs = [[s * 1000 + i for i in range(100)] for s in (1, 2, 3)]
    caches = [fake_cache(100, seed=s) for s in range(3)]
    entry = 2 * 2 * 2 * 100 * 4 * 4  # layers * k/v * heads * tokens * dim * float32

    ram_only = PrefixCache(int(entry * 2.5))
    for s, c in zip(seqs, caches):
        ram_only.insert(s, c, 0)
    assert ram_only.ram_bytes <= ram_only.ram_budget and ram_only.counters["ram_evictions"] == 1
    assert ram_only.lookup(seqs[0]).length == 0, "the least recently used entry went"
    assert ram_only.lookup(seqs[2]).length == 100

    ram_only.lookup(seqs[1])  # touch: now seqs[2] is the oldest
    ram_only.insert(seqs[0], caches[0], 0)
    assert ram_only.lookup(seqs[2]).length == 0 and ram_only.lookup(seqs[1]).length == 100

    store = SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=1 << 30)
    tiered = PrefixCache(int(entry * 2.5), store)
    for s, c in zip(seqs, caches):
        tiered.insert(s, c, 0)
    assert tiered.flush(timeout=30, inline=True)
    assert tiered.ram_bytes <= tiered.ram_budget and len(tiered.files) == 3
    h = tiered.lookup(seqs[0])  # evicted from RAM, still on disk
    assert h.length == 100 and h.ssd_tokens == 100
    assert np.array_equal(hit_kv(h), expected_kv(caches[0], 0, 100))
    assert tiered.ram_bytes <= tiered.ram_budget
    tiered.close()


def test_ssd_cap_evicts_oldest_files_and_survives_restart(tmp_path):
    seqs = [[s * 1000 + i for i in range(100)] for s in (1, 2, 3)]
    caches = [fake_cache(100, seed=s) for s in range(3)]
    store = SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=30_000)  # two files fit
    pc = PrefixCache(1 << 30, store)
    for s, c in zip(seqs, caches):
        pc.insert(s, c, 0)
        assert pc.flush(timeout=30, inline=True)
    assert len(pc.files) == 2 and pc.ssd_bytes <= 30_000 and pc.counters["ssd_evictions"] == 1
    assert len(list((tmp_path / "pc").glob("*.safetensors"))) == 2
    pc.close()

    again = PrefixCache(1 << 30, SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=30_000))
    assert again.lookup(seqs[0]).length == 0
    for s, c in zip(seqs[1:], caches[1:]):
        h = again.lookup(s)
        assert h.length == 100 and np.array_equal(hit_kv(h), expected_kv(c, 0, 100))
    again.close()


def test_saved_files_load_with_mlx(tmp_path):
    store = SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=1 << 30)
    pc = PrefixCache(1 << 30, store)
    cache = fake_cache(40)
    pc.insert(list(range(40)), cache, 0)
    assert pc.flush(timeout=30, inline=True)
    (path,) = (tmp_path / "pc").glob("*.safetensors")
    arrays, meta = mx.load(str(path), return_metadata=True)
    assert meta["format"].startswith("jumpahead-prefix-kv/") and meta["model"] == "fp"
    assert arrays["tokens"].tolist() == list(range(40))
    assert np.array_equal(np.array(arrays["kv"]), expected_kv(cache, 0, 40))
    pc.close()


class Counting:
    """A companion method whose state is the token count and the sum of the tokens."""

    name = "counting"

    def __init__(self) -> None:
        self.restored: list[tuple[int, list[int]]] = []

    def capture(self, row, length: int):
        toks = (list(row.prompt) + list(row.output))[:length]
        return {"n": mx.array([length]), "sum": mx.array([sum(toks)])}

    def restore(self, row, state, length: int) -> None:
        self.restored.append((length, [int(state["n"].item()), int(state["sum"].item())]))


def test_companion_state_is_checkpointed_and_restored(tmp_path):
    tokens = list(range(300, 360))
    cache = fake_cache(60)
    row = SimpleNamespace(prompt=tokens, output=[], prefill_cache=cache, finish_reason=None, prefilled=0, cached_tokens=0)
    hook = Counting()
    pc = PrefixCache(1 << 30, SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=1 << 30))
    pc.register_companion(hook)
    pc.on_prompt_done(row)
    assert pc.flush(timeout=30, inline=True)
    pc.close()

    hook2 = Counting()
    again = PrefixCache(1 << 30, SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=1 << 30))  # a restart
    again.register_companion(hook2)
    for source in ("ssd", "ram"):
        new = SimpleNamespace(prompt=tokens + [1, 2], output=[], prefill_cache=RowKVCache(2), finish_reason=None,
                              prefilled=0, cached_tokens=0)
        new.prefill_cache.ends = [0]
        again.on_prefill_start(new)
        assert new.prefilled == 60 and new.cached_tokens == 60 and new.prefill_cache.ends == [60], source
        assert hook2.restored[-1] == (60, [60, sum(tokens)]), source
    assert again.counters["ssd_hits"] == 1 and len(hook2.restored) == 2
    again.close()


# --- the bench's inputs (fast; the bench itself is `python -m jumpahead.bench.cache`) --


def test_bench_session_and_billing_header_measure(loaded_model):
    from jumpahead.bench import cache as bench_cache
    from tests.conftest import shared_path

    _, tokenizer, _ = loaded_model
    trace = shared_path("traces", "public", "mini-swe-agent", "marshmallow-code__marshmallow-1343.traj.json")
    messages = bench_cache.openai_messages(trace)
    k = bench_cache.pick_turn(tokenizer, messages, 2600)
    assert messages[k]["role"] == "assistant" and messages[k + 1]["role"] in ("tool", "user")
    assert 2000 < len(bench_cache.render(tokenizer, messages[:k])) <= 2600

    shared_path("fixtures", "clients", "claude-code")
    effect = bench_cache.billing_header_effect(tokenizer)
    n = effect["prompt_tokens"]
    assert effect["variants"]["same_header"]["shared_prefix_tokens"] == n
    # a different value on the first system line leaves only the first few tokens reusable
    assert effect["variants"]["fingerprint_changed"]["shared_prefix_tokens"] < 64 < n // 100
    assert effect["header_stripped_by_proxy"]["shared_prefix_tokens"] == effect["header_stripped_by_proxy"]["prompt_tokens"]


def test_restart_hit_reads_whole_files_in_place_and_survives_a_bad_one(tmp_path):
    """After a restart, files a hit uses whole are read straight into the row's buffers
    (no RAM copy is made: ram_bytes stays 0); a file whose checksum fails during that read
    is dropped and the hit falls back to the intact part, counted once and only as that."""
    from types import SimpleNamespace

    x = list(range(1000, 1100))
    y = x + list(range(7000, 7060))
    cx, cy = fake_cache(100, seed=1), fake_cache(160, seed=2)
    pc = PrefixCache(1 << 30, SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=1 << 30))
    pc.insert(x, cx, 0)
    pc.insert(y, cy, 0)  # stores only [100, 160) of cy
    assert pc.flush(timeout=30, inline=True) and len(pc.files) == 2
    pc.close()
    want = np.concatenate([expected_kv(cx, 0, 100), expected_kv(cy, 100, 160)], axis=3)

    def restart_and_hit():
        again = PrefixCache(1 << 30, SsdStore(tmp_path / "pc", "fp", "test", cap_bytes=1 << 30))
        row = SimpleNamespace(prompt=y + [1, 2], prefill_cache=RowKVCache(2), prefilled=0, cached_tokens=0)
        again.on_prefill_start(row)
        got = np.stack([np.stack([np.array(l.keys[0, :, : row.cached_tokens]), np.array(l.values[0, :, : row.cached_tokens])])
                        for l in row.prefill_cache.layers])
        return again, row, got

    pc, row, got = restart_and_hit()
    c = pc.counters
    assert row.cached_tokens == 160 and np.array_equal(got, want)
    assert pc.ram_bytes == 0, "the files went into the row, not through RAM entries"
    assert pc.ssd.counters["ssd_loads"] == 2 and c["hits"] == 1 and c["ssd_hit_tokens"] == 160
    assert pc.ssd.counters["ssd_load_bytes"] == want.nbytes
    assert row.prefill_cache.layers[0].keys.shape[2] >= len(row.prompt), "room for the rest of the prompt"
    pc.close()

    (bad,) = (tmp_path / "pc").glob(f"{100:08d}-{160:08d}-*.safetensors")
    lo, hi = _kv_region(bad)
    with open(bad, "r+b") as fh:
        fh.seek(hi - 16)
        fh.write(b"\xff" * 16)
    pc, row, got = restart_and_hit()
    c = pc.counters
    assert row.cached_tokens == 100 and np.array_equal(got, want[:, :, :, :100])
    assert not bad.exists() and c["ssd_corrupt"] == 1 and c["failed_hits"] == 1
    assert c["hits"] == 1 and c["hit_tokens"] == 100 and c["ssd_hit_tokens"] == 100
    pc.close()
