"""Every model type mlx-lm ships is served exactly in the batch, or one row at a time,
or refused at load with the reason (issue 41): bench/model_sweep.py's sweep, each type
in its own process, on a fixed sample covering the outcomes (default suite) and on
every type (slow)."""

from __future__ import annotations

import json

import pytest

from jumpahead.bench.model_sweep import FAILURES, OUTCOMES, summary, sweep
from jumpahead.bench.model_zoo import SKIPPED, model_types, tiny_config

# full attention, learned positions, pure SSM, soft-capped sliding window, multi-query
# with np.arange positions, hybrid Mamba-2 + attention
SAMPLE = ["llama", "gpt2", "mamba", "gemma2", "gpt_bigcode", "nemotron_h"]


def _check(records: list[dict]) -> None:
    s = summary(records)
    bad = [r for r in records if r["outcome"] in FAILURES or r["outcome"] not in OUTCOMES]
    assert not bad, "\n".join([json.dumps(s["counts"])] + [f"{r['type']}: {r['outcome']}: {r.get('reason')}"
                                                          for r in bad])


def test_every_type_has_a_tiny_config_or_a_reason():
    for t in model_types():
        if t in SKIPPED:
            continue
        cfg = tiny_config(t)
        assert cfg["model_type"] == t or cfg.get("text_config"), t


def test_sample_of_types_served_exactly_or_refused(tmp_path_factory):
    records = sweep(SAMPLE, tmp_path_factory.mktemp("zoo"), timeout=400, jobs=2)
    assert [r["type"] for r in records] == SAMPLE
    _check(records)


@pytest.mark.slow
def test_every_type_served_exactly_or_refused(tmp_path_factory):
    records = sweep(model_types(), tmp_path_factory.mktemp("zoo-all"), timeout=600, jobs=2)
    _check([r for r in records if r["outcome"] != "skipped"])
