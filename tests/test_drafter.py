"""The learned drafter (engine/methods/drafter.py) on the real default model.

Oracles: a row's draft state (RowView.hidden) equals the target's hidden state at the
position that chose its pending token, recomputed by a fresh forward; drafted rows
equal ordinary decoding token for token at B=1 and 4 (greedy) and under seeded
sampling; the shipped drafter is accepted where the target agrees; the telemetry
adds up; a drafter trained for another model is refused with a clear message.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import mlx.core as mx

from jumpahead.engine.methods.drafter import Drafter, DrafterError, DrafterGroup, default_drafter_path, read_meta
from jumpahead.engine.types import GenerationRequest, SamplingParams
from tests.serving import chat_prompt, frozen_width_policy, run_rows

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
    "List the steps to make a cup of tea.",
    "What is 17 times 23? Show your work.",
]
SHIPPED = default_drafter_path()


@pytest.fixture(scope="module")
def dengine(loaded_model, tmp_path_factory):
    """An engine of its own with the shipped drafter attached (rows keep hidden states), its
    width policy at the default costs (tests/serving.py frozen_width_policy)."""
    from jumpahead.engine.engine import Engine, EngineConfig

    if not SHIPPED.is_dir():
        pytest.fail(f"the shipped drafter is missing at {SHIPPED} (jumpahead train-drafter writes it)")
    model, tokenizer, info = loaded_model
    cache_dir = str(tmp_path_factory.mktemp("drafter-prompt-cache"))
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=8, prefix_cache_dir=cache_dir, method_specs={"drafter": str(SHIPPED)}))
    eng.scheduler.width_policy = frozen_width_policy()  # which rounds draft must not hang on this machine's load
    yield eng
    eng.close()




class Recorder:
    """Proposes nothing; keeps each view's tokens and hidden state (evaluated)."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[list[int], np.ndarray | None]] = []

    def propose(self, view, max_len):
        if len(view.tokens) <= view.prompt_len:
            return None  # asked before the first token is chosen (asserted-only): no pending token yet
        h = None if view.hidden is None else np.array(view.hidden.astype(mx.float32))
        self.seen.append((list(view.tokens), h))
        return None

    def feedback(self, proposal, accepted):
        pass


def test_row_hidden_state_is_the_targets_at_the_pending_tokens_position(dengine):
    """Prefill, accepted and rejected drafts, B=3: every view's hidden equals a fresh
    forward's final hidden state at the last position before the pending token. (The
    reference is one causal forward over the row's whole sequence, read at each view's
    position: each position sees only the tokens before it, so that is the hidden state
    of a forward ending there, for every view at the cost of one prefill per row.)"""
    tok = dengine.tokenizer
    recorders = [Recorder() for _ in range(3)]
    reqs = [GenerationRequest(prompt=chat_prompt(tok, p), max_tokens=40, methods=["drafter"], proposers=[r])
            for p, r in zip(PROMPTS[:3], recorders)]
    out = run_rows(dengine, reqs)
    assert any("drafter" in o["kinds"] for o in out), "the drafter never got a token accepted"
    runner = dengine.runner
    checked = 0
    for req, o, rec in zip(reqs, out, recorders):
        assert rec.seen and all(h is not None for _, h in rec.seen)
        full = list(req.prompt) + list(o["tokens"])
        assert all(tokens == full[: len(tokens)] for tokens, _ in rec.seen)  # committed tokens never change
        cache = runner.new_cache()
        cache.ends = [0]
        runner.forward([full[:-1]], cache, slice(None))
        hidden = np.array(runner.last_hidden[0].astype(mx.float32))
        for tokens, h in rec.seen:
            want = hidden[len(tokens) - 2]
            # batched rounds and a one-row forward round differently: a near-tie, not a mismatch
            assert np.abs(h - want).max() <= 2e-3 * np.abs(want).max(), "hidden state of another position"
            checked += 1
    assert checked >= 30


def test_warm_turn_drafts_from_the_first_round(dengine):
    """A prompt-cache hit needs no drafter prefill: the draft state is the hidden state
    of the one prompt token the target still runs."""
    tok = dengine.tokenizer
    prompt = chat_prompt(tok, PROMPTS[3] + " Then add 5.")
    run_rows(dengine, [GenerationRequest(prompt=prompt, max_tokens=4, methods=["off"])])
    dengine.flush_prefix_cache()
    rec = Recorder()
    cached = []

    async def go():
        async for chunk in dengine.stream(GenerationRequest(prompt=prompt, max_tokens=16, methods=["drafter"],
                                                            proposers=[rec])):
            cached.append(chunk.cached_tokens)

    asyncio.run(go())
    assert max(cached) > len(prompt) // 2, "the second turn did not hit the prompt cache"
    tokens, h = rec.seen[0]
    assert len(tokens) == len(prompt) + 1 and h is not None
    cache = dengine.runner.new_cache()
    cache.ends = [0]
    dengine.runner.forward([tokens[:-1]], cache, slice(-1, None))
    want = np.array(dengine.runner.last_hidden[0, -1].astype(mx.float32))
    assert np.abs(h - want).max() <= 2e-3 * np.abs(want).max()


@pytest.mark.parametrize("batch", [1, 4])  # alone, and a batch whose rows draft in one chain (B=2 ran the same path)
def test_drafted_rows_equal_ordinary_greedy_decoding(dengine, batch):
    tok = dengine.tokenizer
    prompts = [chat_prompt(tok, p) for p in PROMPTS[:batch]]
    plain = run_rows(dengine, [GenerationRequest(prompt=p, max_tokens=48, methods=["off"]) for p in prompts])
    drafted = run_rows(dengine, [GenerationRequest(prompt=p, max_tokens=48, methods=["drafter"]) for p in prompts])
    assert [o["tokens"] for o in drafted] == [o["tokens"] for o in plain]
    methods = [o["fill"].get("methods", {}).get("drafter") for o in drafted]
    assert all(m is not None and m["proposals"] > 0 for m in methods), methods
    if batch == 1:  # alone, every round may draft: the shipped drafter must land tokens
        assert methods[0]["accepted"] > 0


def test_seeded_sampling_picks_the_targets_tokens(dengine):
    tok = dengine.tokenizer
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    p = chat_prompt(tok, PROMPTS[2])
    plain = run_rows(dengine, [GenerationRequest(prompt=p, max_tokens=48, methods=["off"], sampling=sampling)])
    drafted = run_rows(dengine, [GenerationRequest(prompt=p, max_tokens=48, methods=["drafter"], sampling=sampling)])
    assert drafted[0]["tokens"] == plain[0]["tokens"]


def test_telemetry_adds_up(dengine):
    """Per method: the histogram counts every proposal once, its weighted sum is the
    accepted count, and each accepted token is emitted with kind 'drafter' (an EOS
    inside a draft cuts the tokens after it: they never count as accepted)."""
    tok = dengine.tokenizer
    before = json.loads(json.dumps(dengine.metrics().get("methods", {}).get("drafter", {"proposals": 0})))
    out = run_rows(dengine, [GenerationRequest(prompt=chat_prompt(tok, p), max_tokens=64, methods=["drafter"])
                         for p in PROMPTS[:1]])
    m = out[0]["fill"]["methods"]["drafter"]
    hist = m["accepted_histogram"]
    assert sum(hist) == m["proposals"] > 0
    assert sum(i * n for i, n in enumerate(hist)) == m["accepted"] <= m["proposed"]
    assert out[0]["kinds"].count("drafter") == out[0]["fill"]["tokens"].get("drafter", 0) == m["accepted"]
    assert out[0]["fill"]["verified"]["accepted"] == m["accepted"]  # the row's own count agrees
    after = dengine.metrics()["methods"]["drafter"]
    assert after["proposals"] - before["proposals"] == m["proposals"]


def test_one_batched_chain_drafts_for_every_row(dengine):
    """Grouped drafting: rows of one round share one chain (fewer chains than drafts)."""
    group: DrafterGroup = dengine.method_state("drafter")
    tok = dengine.tokenizer
    chains, rows = group.chains, group.rows_drafted
    dengine.scheduler.config.objective = "latency"  # every row drafts (no throughput gating)
    try:
        run_rows(dengine, [GenerationRequest(prompt=chat_prompt(tok, p), max_tokens=24, methods=["drafter"])
                       for p in PROMPTS])
    finally:
        dengine.scheduler.config.objective = "throughput"
    assert group.rows_drafted - rows > group.chains - chains > 0


def test_drafter_for_another_model_is_refused(tmp_path, loaded_model):
    model = loaded_model[0]
    other = tmp_path / "other"
    shutil.copytree(SHIPPED, other)
    meta = read_meta(other)
    meta["target"]["embed_digest"] = "0" * 16
    (other / "drafter.json").write_text(json.dumps(meta))
    with pytest.raises(DrafterError, match="trained for another model.*embed_digest"):
        Drafter.load(other, target=model)
    with pytest.raises(DrafterError, match="not a drafter folder"):
        Drafter.load(tmp_path / "nothing", target=model)
    assert Drafter.load(SHIPPED, target=model).draft_vocab == meta["draft_vocab"]


def test_shipped_drafter_records_how_it_was_trained():
    meta = read_meta(SHIPPED)
    training = meta["training"]
    assert training["valid_step1"] > training["valid_step1_before"] and training["tokens"] > 10_000
    # small enough to ship in the repository (fp16; 2048-wide block, 8192-token head)
    assert (SHIPPED / "drafter.safetensors").stat().st_size < 20 << 20


def test_general_prompts_are_distinct_and_keep_the_benchmarks_subjects_out(loaded_model):
    """Greedy decoding continues a repeated prompt identically, so a repeat is wasted
    data and sits on both sides of the held-back split: every drawn request differs, and
    none is (or shares a subject with) a benchmark prompt."""
    import random

    from jumpahead.training.train_drafter import HELD_OUT_WORDS, NOTHING_TO_COPY, general_prompts

    tok = loaded_model[1]
    prompts = general_prompts(tok, 3000, random.Random(5))
    assert len(prompts) == 3000 and len({tuple(p) for p in prompts}) == 3000
    texts = [tok.decode(p).split("<|im_start|>user")[-1] for p in prompts]  # the request (not the system text)
    assert not [t for t in texts if any(w in t.lower() for w in HELD_OUT_WORDS)]
    assert all(any(w in b.lower() for w in HELD_OUT_WORDS) for b in NOTHING_TO_COPY)
    kinds = {t.split()[0] for t in texts}  # the opening words vary
    assert len(kinds) > 15


def test_openai_sdk_sees_drafter_telemetry_and_metrics(dengine):
    openai = pytest.importorskip("openai")
    from .serving import serve

    with serve(dengine) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        kw = dict(model="m", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=32, temperature=0)
        plain = client.chat.completions.create(**kw, extra_body={"jumpahead": {"methods": ["none"]}})
        drafted = client.chat.completions.create(**kw, extra_body={"jumpahead": {"methods": ["drafter"]}})
        assert drafted.choices[0].message.content == plain.choices[0].message.content
        fill = drafted.model_extra["usage"]["fill"] if "usage" in (drafted.model_extra or {}) else \
            drafted.usage.model_extra["fill"]
        assert fill["methods"]["drafter"]["proposals"] > 0
        import httpx

        assert httpx.get(f"{url}/metrics.json").json()["engine"]["methods"]["drafter"]["proposals"] > 0
        assert httpx.get(f"{url}/health").json()["drafter"] == str(SHIPPED.resolve())  # which head serves


def test_serve_refuses_a_drafter_path_that_is_not_one(tmp_path, tiny_model_dir):
    import subprocess
    import sys

    # the tiny llama (conftest.py): serve loads the model before it reads the drafter folder
    proc = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", "--drafter", str(tmp_path),
                           "--model", str(tiny_model_dir), "--no-prefix-cache", "--port", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert f"cannot use drafter {tmp_path}" in proc.stderr and "not a drafter folder" in proc.stderr


@pytest.mark.slow
def test_train_drafter_writes_a_drafter_the_engine_loads(tmp_path, loaded_model):
    """The real command in a new process, on a tiny budget: it writes a drafter for the
    served model, which learned something (held-back agreement above the untrained head's)."""
    import subprocess
    import sys

    out = tmp_path / "drafter"
    proc = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "train-drafter", "--out", str(out),
                           "--world-tasks", "3", "--code-prompts", "8", "--session-turns", "4",
                           "--generate-minutes", "0.2", "--train-minutes", "0.3", "--continue-tokens", "32"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["tokens"] > 100 and summary["steps"] > 0
    assert summary["valid_step1"] > summary["valid_step1_before"]
    drafter = Drafter.load(out, target=loaded_model[0])
    assert read_meta(out)["training"]["tokens"] == summary["tokens"]
    assert drafter.draft_vocab == summary["draft_vocab"]


def test_turn_major_batches_put_each_turn_after_the_one_it_extends(loaded_model):
    """--reuse-prefixes: a task-world turn's prompt extends the turn before it token for
    token, and the batches put every turn in a later batch than the one it extends (its
    prefix is published by then), none wider than the rows asked for, none lost."""
    from jumpahead.training.train_drafter import turn_major, world_turns

    tasks = world_turns(loaded_model[1], 9)
    pairs = [(a, b) for turns in tasks for a, b in zip(turns, turns[1:])]
    assert len(pairs) >= 9 and all(b[: len(a)] == a and len(b) > len(a) for a, b in pairs)
    batches = turn_major(tasks, 4)
    where = {tuple(p): i for i, b in enumerate(batches) for p in b}
    assert all(where[tuple(a)] < where[tuple(b)] for a, b in pairs)
    assert max(map(len, batches)) <= 4
    assert sorted(tuple(p) for b in batches for p in b) == sorted(tuple(p) for t in tasks for p in t)


@pytest.mark.slow
def test_train_drafter_for_an_adapter_reuses_prefixes_and_serve_loads_it(tmp_path, loaded_model):
    """`train-drafter --adapter DIR --reuse-prefixes` in a new process: it trains for the
    adapted model, writes DIR/drafter (where `--drafter auto` looks when that adapter is
    served), and the prefix cache served most of the turns' prompt tokens."""
    import subprocess
    import sys

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.lora import resolve_adapter

    adapter = tmp_path / "agent"
    shutil.copytree(resolve_adapter("smol-agent"), adapter)
    proc = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "train-drafter", "--adapter", str(adapter),
                           "--reuse-prefixes", "--world-tasks", "8", "--code-prompts", "0", "--sessions", "none",
                           "--batch-rows", "4", "--generate-minutes", "0.6", "--train-minutes", "0.2",
                           "--draft-vocab", "512", "--ffn", "256"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["out"] == str(adapter / "drafter") and summary["adapter"]["name"] == "agent"
    from jumpahead.training.train_drafter import world_turns

    turns = sum(map(len, world_turns(loaded_model[1], 8)))  # prompts counted, not their batches
    assert summary["prompts"]["task_world"] == turns and summary["prompts"]["repeats_dropped"] >= 0
    assert summary["valid_step1"] > summary["valid_step1_before"]
    assert summary["prefill"]["cached_tokens"] > summary["prefill"]["prompt_tokens"] / 2, summary["prefill"]
    auto = EngineConfig(prefix_cache=False, method_specs={"drafter": "auto"}, measured_defaults=True)
    eng = Engine.load(None, auto, progress=lambda s: None, adapter=str(adapter))
    try:
        assert eng.method_state("drafter").drafter.draft_vocab == 512  # the adapter's, not the shipped one
    finally:
        eng.close()
    plain = Engine.load(None, EngineConfig(prefix_cache=False, method_specs={"drafter": "auto"}, measured_defaults=True),
                        progress=lambda s: None)
    try:
        assert plain.method_state("drafter").drafter.draft_vocab == read_meta(SHIPPED)["draft_vocab"]  # no adapter: the shipped one
    finally:
        plain.close()


@pytest.mark.slow
def test_torch_trainer_reproduces_the_engine_and_its_weights_import(tmp_path, loaded_model, engine):
    """training/train_drafter_torch.py, the CUDA path of the same recipe, run here on the CPU:
    its forward (the checkpoint's quantized weights dequantized) continues left-padded
    rows of different lengths exactly as the engine decodes them, token for token; the
    weights it writes, split into parts, become a drafter folder the engine loads, whose
    drafted rows equal ordinary decoding."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import resolve_model
    from jumpahead.training import train_drafter_torch as gpu

    exported = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "train-drafter", "--export-prompts",
                           str(exported), "--world-tasks", "2", "--sessions", "", "--code-prompts", "3",
                           "--general-prompts", "6"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["prompts"]["general"] == 6
    data = np.load(exported / "prompts.npz")
    prompts = [data["tokens"][a:b] for a, b in zip(data["starts"][:-1], data["starts"][1:])]
    folder, _ = resolve_model(None, lambda s: None)
    config = json.loads((Path(folder) / "config.json").read_text())
    target = gpu.Target(gpu.load_weights(str(Path(folder) / "model.safetensors"), config), config, "cpu")
    picked = sorted(prompts, key=len)[:: max(1, len(prompts) // 3)][:3]  # three lengths: left padding
    assert len({len(p) for p in picked}) > 1
    eos = {int(t) for t in data["eos"]}
    rows = gpu.continue_batch(target, picked, 24, eos)
    for p, (_, tokens) in zip(picked, rows):  # a left-padded row equals the same row alone
        assert gpu.continue_batch(target, [p], 24, eos)[0][1].tolist() == tokens.tolist()
    want = run_rows(engine, [GenerationRequest(prompt=[int(t) for t in p], max_tokens=24, methods=["off"])
                         for p in picked])
    exact = 0
    for p, (_, tokens), w in zip(picked, rows, want):
        mine = tokens.tolist()
        theirs = [t for t in w["tokens"] if t not in eos]  # the end-of-turn token is not a recorded pending token
        d = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if d is None:
            assert mine == theirs
            exact += 1
            continue
        # Float32 in another library sums in another order: where the two pick different
        # tokens, the engine's own logits must show a near-tie between the two choices.
        logits = np.array(loaded_model[0](mx.array([int(t) for t in p] + theirs[:d])[None])[0, -1])
        gap = float(logits[theirs[d]] - logits[mine[d]])
        assert 0 <= gap < 0.05, f"token {d}: the engine prefers {theirs[d]} by {gap:.4f} logits, not a near-tie"
    assert exact >= 2, "most rows must reproduce the engine exactly"

    out = tmp_path / "gpu-out"
    assert gpu.main(["--model", str(Path(folder) / "model.safetensors"), "--config", str(Path(folder) / "config.json"),
                     "--prompts", str(exported / "prompts.npz"), "--out", str(out), "--continue-tokens", "16",
                     "--rows", "8", "--generate-minutes", "0.5", "--train-minutes", "0.05", "--batch", "64",
                     "--variant", "128:256:2", "--max-file-mb", "0.2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["forward_check"]["argmax_agreement"] >= 0.98
    # measured on the benchmark's held-out prompts (exported apart, never trained on)
    assert len(data["heldout_starts"]) == 5
    assert len(summary["variants"]["drafter-128-256-2"]["heldout_agreement"]) == 4
    files = summary["variants"]["drafter-128-256-2"]["files"]
    assert len(files) > 1  # split under the size cap
    drafter_dir = tmp_path / "drafter"
    proc = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "train-drafter", "--out", str(drafter_dir),
                           "--import-weights", *[str(out / f) for f in files], "--summary", str(out / "summary.json")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = read_meta(drafter_dir)
    assert meta["ffn"] == 128 and meta["draft_vocab"] == 256 and meta["training"]["tokens"] == summary["tokens"]
    model, tokenizer, info = loaded_model
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=4, prefix_cache=False, method_specs={"drafter": str(drafter_dir)}))
    try:
        reqs = [GenerationRequest(prompt=chat_prompt(tokenizer, t), max_tokens=32, methods=m)
                for t in PROMPTS[:2] for m in (["off"], ["drafter"])]
        got = run_rows(eng, reqs)
        assert got[0]["tokens"] == got[1]["tokens"] and got[2]["tokens"] == got[3]["tokens"]
    finally:
        eng.close()


def _ab_summary(folder: Path, adapter: dict | None, saved: list[float], differ: int = 0, fail: int = 0) -> dict:
    """The summary of a made-up live A/B of `default+drafter` against `default` whose
    server loaded the drafter in `folder`: per seed, the drafter arm `saved[i]` s faster;
    `differ` seeds with another output; `fail` seeds the drafter arm does not solve."""
    from jumpahead.live.summary import summarize

    def rec(arm: str, seed: int, model_s: float, content: str, success: bool = True) -> dict:
        turn = {"wall_s": model_s, "completion_tokens": 10, "content": content, "calls": [],
                "fill": {"tokens": {"sampled": 10}}, "timings": {"prefill_s": 0.1, "decode_s": model_s - 0.1,
                                                                 "rounds": 1, "round_ms": [[100.0, 1]]}}
        return {"arm": arm, "seed": seed, "success": success, "status": "answered", "wall_s": model_s,
                "turns": [turn]}

    records = []
    for seed, gain in enumerate(saved):
        records += [rec("ordinary", seed, 9.0, "x"), rec("default", seed, 5.0, f"said {seed}"),
                    rec("default+drafter", seed, 5.0 - gain, f"said {seed}" + ("!" if seed < differ else ""),
                        success=seed >= fail)]
    summary = summarize(records, ["ordinary", "default", "default+drafter"])
    served = {"model": "SmolLM2-135M-Instruct", "adapter": adapter, "drafter": str(folder), "device": "cpu"}
    summary["run"] = {"served_by_arm": {"default+drafter": served}, "command": "jumpahead live ...",
                      "tasks_per_arm": len(saved), "concurrency": 2}
    return summary


def test_a_drafter_joins_the_defaults_only_where_its_measurement_says_it_pays(tmp_path):
    """`live --record-drafter` writes the A/B into the drafter's folder; `serve` reads
    the figures: on only with the whole CI above zero, every seed's output equal, enough
    tasks, no fewer solved, and the same adapter."""
    from jumpahead.engine.methods.drafter import MIN_PAIRED_TASKS, measured_pays, read_measurement
    from jumpahead.live.drafter_measurement import DrafterMeasurementError, record_measurement

    adapter = {"name": "agent", "digest": "0123456789abcdef"}
    folder = tmp_path / "drafter"
    folder.mkdir()
    assert measured_pays(read_measurement(folder), "0123456789abcdef")[0] is False  # nothing recorded
    gains = [1.0 + 0.1 * (i % 5) for i in range(MIN_PAIRED_TASKS)]
    path = record_measurement(_ab_summary(folder, adapter, gains), "heldout")
    record = read_measurement(folder)
    assert path == folder / "measured.json" and record["versus"]["paired_tasks"] == MIN_PAIRED_TASKS
    pays, why = measured_pays(record, "0123456789abcdef")
    assert pays and "over 30 tasks" in why, why
    assert not measured_pays(record, None)[0] and not measured_pays(record, "fedcba9876543210")[0]  # another model
    # each condition alone turns it off
    noisy = [(-3.0 if i % 2 else 3.5) for i in range(MIN_PAIRED_TASKS)]  # mean > 0, the CI straddles zero
    cases = {"not above zero": _ab_summary(folder, adapter, noisy),
             "outputs differed on 1 seeds": _ab_summary(folder, adapter, gains, differ=1),
             "paired tasks measured": _ab_summary(folder, adapter, gains[:MIN_PAIRED_TASKS - 1]),
             # one more seed, so that the unsolved one leaves enough pairs and only this condition fails
             "solved 30 against 31": _ab_summary(folder, adapter, gains + [1.0], fail=1)}
    for reason, summary in cases.items():
        record_measurement(summary, "heldout")
        pays, why = measured_pays(read_measurement(folder), "0123456789abcdef")
        assert not pays and reason in why, (reason, why)
    with pytest.raises(DrafterMeasurementError, match="held-out"):
        record_measurement(_ab_summary(folder, adapter, gains), "train")
    (folder / "measured.json").write_text("{not json")
    assert read_measurement(folder) is None


def test_serve_adds_the_adapters_drafter_to_its_defaults_where_it_pays(tmp_path):
    """The real engine with the shipped adapter fused (a copy, whose drafter/ folder this
    test writes the measurement into): `--drafter auto` (engine/methods/registry.py attach_methods)
    adds method 'drafter' to the defaults only with a paying measurement for this
    adapter, never over --methods."""
    import hashlib

    from jumpahead.engine.methods.drafter import MIN_PAIRED_TASKS, adapter_drafter_path, measured_pays, read_measurement
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.methods.registry import attach_methods
    from jumpahead.engine.model.lora import resolve_adapter
    from jumpahead.live.drafter_measurement import record_measurement

    shipped = resolve_adapter("smol-agent")
    if not adapter_drafter_path(shipped).is_dir():
        pytest.fail(f"the shipped adapter has no drafter at {adapter_drafter_path(shipped)}")
    adapter = tmp_path / "agent"
    shutil.copytree(shipped, adapter)
    (adapter / "drafter" / "measured.json").unlink(missing_ok=True)
    eng = Engine.load(None, EngineConfig(prefix_cache=False), progress=lambda s: None, adapter=str(adapter))
    try:
        digest = eng.info.adapter_digest
        base = tuple(eng.config.default_methods)

        def attach(explicit: bool = False) -> tuple:
            eng.config.default_methods = base
            attach_methods(eng, {"drafter": "auto"}, measured_defaults=not explicit)
            assert eng.method_state("drafter").drafter.folder == str((adapter / "drafter").resolve())
            return tuple(eng.config.default_methods)

        assert "drafter" not in attach()  # no measurement: off
        gains = [1.5] * MIN_PAIRED_TASKS
        record_measurement(_ab_summary(adapter / "drafter", {"name": "agent", "digest": digest}, gains), "heldout")
        assert attach() == (*base, "drafter")
        assert attach(explicit=True) == base  # --methods chose
        record_measurement(_ab_summary(adapter / "drafter", {"name": "agent", "digest": "another"}, gains), "heldout")
        assert "drafter" not in attach()  # measured on another adapter
    finally:
        eng.close()
    # the shipped adapter's drafter carries its own measurement, made for exactly that adapter
    shipped_digest = hashlib.sha256((shipped / "adapters.safetensors").read_bytes()).hexdigest()[:16]
    assert digest == shipped_digest
    pays, why = measured_pays(read_measurement(adapter_drafter_path(shipped)), shipped_digest)
    assert pays, f"the shipped smol-agent drafter's measurement: {why}"
    # the default model's shipped drafter has none: off for the base model
    assert not measured_pays(read_measurement(SHIPPED), None)[0]
