"""The load-time check (engine/kv/model_check.py) on the model types it was written for,
each a tiny random-weight model from mlx-lm's own classes (bench/model_zoo.py):

- nemotron_h: its SSM update ignores per-row lengths, so a padded row's real tokens
  never reach the state; it is served in the batch at one token a row per round, and
  four staggered rows (the odd ones carrying proposals) equal each row alone.
- gpt_bigcode: positions from `cache[0].offset` fail once rows sit at different
  offsets; gemma2: its batched attention differs from alone. Both are served one row at
  a time, and two overlapping requests both answer what each answers alone.
- llama: everything batched (no limit invented where there is none).
- mamba: stores its state only into an mlx-lm ArraysCache; one row over the engine's
  cache equals mlx-lm's own (the load check compares them; it answered wrong tokens
  before), served in the batch at one token a row per round.
- gpt2 and mamba keep their embeddings outside `model.model`: `serve` with its default
  arguments (`--drafter auto`) serves them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlx_lm import stream_generate

from jumpahead.engine.types import GenerationRequest
from tests.oracle import assert_same_or_near_tie
from tests.test_families import N, TEXTS, staggered_four, tokens_of

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    from jumpahead.bench import model_zoo
    from jumpahead.engine.model.default_model import ensure_default_model

    root = tmp_path_factory.mktemp("zoo")
    tok = ensure_default_model(progress=lambda s: None)
    return lambda t: model_zoo.build(t, root, tok)


def _engine(folder: Path):
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    model, tok, info = load_model(str(folder), progress=lambda s: None)
    eng = Engine(model, tok, info, EngineConfig(max_batch=8, cost_aware=False, prefix_cache=False))
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in TEXTS]
    return {"model": model, "tokenizer": tok, "engine": eng, "prompts": prompts}


def _alone(f: dict) -> list[list[int]]:
    return [tokens_of(f["engine"].generate_sync(GenerationRequest(prompt=p, max_tokens=N))) for p in f["prompts"]]


@pytest.mark.parametrize("model_type, mode, padded, verifies", [
    ("llama", "batch", True, True),
    ("nemotron_h", "batch", False, False),
    ("gpt_bigcode", "one-row", False, True),
    ("gemma2", "one-row", False, True),
    ("mamba", "batch", False, False),  # its layers stored no state in the engine's cache before
])
def test_serving_mode_is_decided_by_running_the_model(zoo, model_type, mode, padded, verifies):
    f = _engine(zoo(model_type))
    try:
        layers = f["engine"].health()["layers"]
        assert (layers["serving"], layers["padded_rows"], layers["verifies"]) == (mode, padded, verifies), layers
        assert layers["one_row_per_forward"] is (mode == "one-row")
        assert f["engine"].health()["max_batch"] == (1 if mode == "one-row" else 8)
        assert bool(layers["limits"]) is (mode != "batch" or not padded)  # each limit says why
        alone = _alone(f)
        want = [r.token for r in stream_generate(f["model"], f["tokenizer"], f["prompts"][0], max_tokens=N)]
        assert_same_or_near_tie(f["model"], f["prompts"][0], alone[0], want)  # equal to mlx-lm itself
        together = staggered_four(f, alone)  # odd rows carry partly wrong proposals
        for i in range(4):
            assert_same_or_near_tie(f["model"], f["prompts"][i], together[i], alone[i])
        assert f["engine"].metrics().get("errors", 0) == 0
    finally:
        f["engine"].close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("model_type", ["gpt2", "mamba"])
def test_serve_with_default_arguments_on_embeddings_outside_model_model(zoo, model_type, tmp_path):
    """`jumpahead serve --model DIR` with its defaults (--drafter auto fingerprints the
    served model): it died at load with an AttributeError on these models before."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "jumpahead.app.cli", "serve", "--model", str(zoo(model_type)),
                             "--port", str(port), "--prefix-cache-dir", str(tmp_path / "pc")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        health = None
        while time.time() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert health is not None, proc.communicate(timeout=10)[0][-3000:] if proc.poll() is not None else "no answer"
        assert health["layers"]["serving"] == "batch"
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                       json={"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert json.loads(r.text)["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _poisoned(engine, poison: int, where: str):
    """The runner's forward raising where its input holds token `poison` (a fault put in
    one row's way: what is under test is what the scheduler does with the other rows)."""
    real = engine.runner.forward

    def forward(tokens, cache, *a, **k):
        rows = tokens.tolist() if hasattr(tokens, "tolist") else tokens
        if len(rows) > (1 if where == "batch" else 0) and any(poison in r for r in rows):
            raise RuntimeError(f"injected fault in a {where} forward")
        return real(tokens, cache, *a, **k)
    engine.runner.forward = forward


def test_a_failing_prefill_ends_only_its_row(tiny_model):
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tok, info = tiny_model
    eng = Engine(model, tok, info, EngineConfig(max_batch=8, cost_aware=False, prefix_cache=False))
    try:
        prompt = tok.apply_chat_template([{"role": "user", "content": TEXTS[0]}], add_generation_prompt=True)
        alone = tokens_of(eng.generate_sync(GenerationRequest(prompt=prompt, max_tokens=24)))
        _poisoned(eng, 4242, "prefill")

        async def both():
            import asyncio

            async def run(req, delay):
                await asyncio.sleep(delay)
                return [c async for c in eng.stream(req)]
            return await asyncio.gather(run(GenerationRequest(prompt=prompt, max_tokens=24), 0),
                                        run(GenerationRequest(prompt=[4242] + prompt, max_tokens=24), 0.05))
        import asyncio

        healthy, bad = asyncio.run(both())
        assert bad[-1].finish_reason == "error" and "injected fault" in (bad[-1].error or "")
        assert tokens_of(healthy) == alone and healthy[-1].finish_reason in ("stop", "length")
        assert eng.health()["max_batch"] == 8 and eng.health()["one_row_reason"] is None
    finally:
        eng.close()


def test_a_failing_batched_round_goes_on_one_row_at_a_time(tiny_model):
    """A batched round that fails at run time (the load-time check passed): the engine
    serves one row at a time from then on, saying why, and the rows of that round go
    back to the queue with their output kept: the row at fault (its prompt holds the
    poisoned token) fails alone, the others finish with the tokens they get alone, and
    later requests are answered."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tok, info = tiny_model
    eng = Engine(model, tok, info, EngineConfig(max_batch=8, cost_aware=False, prefix_cache=False))
    try:
        prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                   for t in TEXTS[:3]]
        prompts[1] = [4242] + prompts[1]
        # long enough that the rows overlap however fast a step is (the host step: ~1 ms a token here)
        alone = [tokens_of(eng.generate_sync(GenerationRequest(prompt=p, max_tokens=64))) for p in prompts]
        state = {"batched_failed": False}
        real_ragged, real_forward = eng.runner.forward_ragged, eng.runner.forward

        def ragged(rows, cache, counts):  # a round of several rows fails once
            if len(rows) > 1 and not state["batched_failed"]:
                state["batched_failed"] = True
                raise RuntimeError("injected fault in a batched round")
            return real_ragged(rows, cache, counts)

        def forward(tokens, cache, *a, **k):  # after it, the row holding 4242 fails wherever it runs
            rows = tokens.tolist() if hasattr(tokens, "tolist") else tokens
            if state["batched_failed"] and any(4242 in r for r in rows):
                raise RuntimeError("injected fault in row 1")
            return real_forward(tokens, cache, *a, **k)
        eng.runner.forward_ragged, eng.runner.forward = ragged, forward
        import asyncio

        async def together(ps):
            async def run(p, delay):
                await asyncio.sleep(delay)
                return [c async for c in eng.stream(GenerationRequest(prompt=p, max_tokens=64))]
            return await asyncio.gather(*[run(p, 0.002 * i) for i, p in enumerate(ps)])

        first = asyncio.run(together(prompts))
        assert state["batched_failed"] and eng.metrics()["rows_requeued"] >= 2
        assert first[1][-1].finish_reason == "error" and "row 1" in first[1][-1].error
        for i in (0, 2):
            assert first[i][-1].finish_reason in ("stop", "length") and tokens_of(first[i]) == alone[i]
        health = eng.health()
        assert health["max_batch"] == 1 and "injected fault in a batched round" in health["one_row_reason"]
        again = asyncio.run(together([prompts[0], prompts[2]]))  # one row at a time now
        assert [tokens_of(r) for r in again] == [alone[0], alone[2]]
    finally:
        eng.close()


def test_a_restarted_process_reads_the_verdict_instead_of_running_the_check(tmp_path):
    """The check's verdict is kept on disk per weights, KV format and versions: a second
    process over the same folder reads it (the log says which); another KV format or
    a cache turned off runs it again."""
    script = ("import logging, sys; logging.basicConfig(level='INFO', stream=sys.stdout)\n"
              "import jumpahead.engine\n"
              "from jumpahead.engine.model.loader import load_model\n"
              "from jumpahead.engine.kv.model_runner import ModelRunner\n"
              "from jumpahead.engine.kv.kv_format import parse_kv_format\n"
              "m, t, i = load_model(sys.argv[1], progress=lambda s: None)\n"
              "fmt = parse_kv_format(int(sys.argv[2]) if sys.argv[2] != '0' else None, None, 64)\n"
              "print('MODE', ModelRunner(m, fmt).serving.mode)\n")
    from jumpahead.bench.family_models import build
    from jumpahead.engine.model.default_model import ensure_default_model

    folder = build("llama", tmp_path, ensure_default_model(progress=lambda s: None), size="kv")  # 64-wide heads
    file = tmp_path / "checks.json"

    def run(bits: str, cache: str) -> str:
        env = {**os.environ, "JUMPAHEAD_MODEL_CHECK_CACHE": cache}
        out = subprocess.run([sys.executable, "-c", script, str(folder), bits], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "MODE batch" in out.stdout
        return out.stdout

    assert "ran in" in run("0", str(file)) and file.exists()
    assert "kept verdict" in run("0", str(file))
    assert "ran in" in run("8", str(file))  # another KV format: its own verdict
    assert "kept verdict" in run("8", str(file))
    assert "ran in" in run("0", "off")
