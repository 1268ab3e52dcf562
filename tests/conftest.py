"""Shared fixtures: the real default model, loaded once per test session; an engine served
and an openai client of it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx)

# The load-time serving checks (engine/kv/model_check.py) kept for this test session only:
# processes the tests start reuse a verdict, and no verdict from older code is read.
os.environ.setdefault("JUMPAHEAD_MODEL_CHECK_CACHE",
                      str(Path(tempfile.mkdtemp(prefix="jumpahead-checks-")) / "serving-checks.json"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test with a clear reason if it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent: these tests read the project's shared fixtures from ../shared")
    return p


@pytest.fixture(scope="session")
def loaded_model():
    from jumpahead.engine.model.loader import load_model

    return load_model(None, progress=lambda s: None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An mlx-lm folder of a tiny random-weight llama (bench/family_models.py) with the
    default model's tokenizer and chat template: for tests where the tokens are forced
    or the model's answers are not the point (forced replay, process plumbing), at a
    small fraction of the default model's cost per token."""
    from jumpahead.bench.family_models import build
    from jumpahead.engine.model.default_model import ensure_default_model

    return build("llama", tmp_path_factory.mktemp("tiny-model"), ensure_default_model(progress=lambda s: None))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """tiny_model_dir loaded: (model, tokenizer, info), as loaded_model."""
    from jumpahead.engine.model.loader import load_model

    return load_model(str(tiny_model_dir), progress=lambda s: None)


@pytest.fixture(scope="session")
def engine(loaded_model, tmp_path_factory):
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    # A prompt-cache directory of this session's own, so runs never hit entries that
    # earlier runs (or a server on this machine) wrote.
    cache_dir = str(tmp_path_factory.mktemp("prompt-cache"))
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=8, prefix_cache_dir=cache_dir))
    # The width policy at this CPU's default costs, not refitted from rounds timed while
    # the suite shares the machine: a fit under load prices every proposal out, and the
    # tests that check what rounds carry (forecast, registry) then see none verified.
    from .serving import frozen_width_policy

    eng.scheduler.width_policy = frozen_width_policy()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def base_url(engine) -> Iterator[str]:
    """`engine` (the session's, or the module's own where it defines one) served by uvicorn
    in a thread (tests/serving.py serve): its base URL."""
    from .serving import serve

    with serve(engine) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    """An openai SDK client of base_url (no retries); its tests are skipped without the openai package."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="dummy", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def live_run(tmp_path_factory, tiny_model_dir):
    """A `jumpahead live` run of 2 held-out tasks in the ordinary and oracle-jump arms
    through real servers of the tiny random-weight llama (`--model`; the tasks fail;
    short turns): its output folder and summary. What the tests check is the runner's
    accounting and the write-up, not the answers. Shared by tests/test_live_command.py
    and tests/test_writeup.py, so a session that runs both runs it once."""
    from jumpahead.live.agent import AgentOptions
    from jumpahead.live.arms import parse_live_arms
    from jumpahead.live.command import LiveOptions, run_live
    from jumpahead.live.world import split_seeds

    out = tmp_path_factory.mktemp("live") / "run"
    summary = run_live(LiveOptions(arms=parse_live_arms("oracle-jump"), seeds=split_seeds("heldout", 2), out=out,
                                   model=str(tiny_model_dir), quiet=True,
                                   agent=AgentOptions(max_steps=2, max_tokens=6, timeout_s=60)))
    return out, summary
