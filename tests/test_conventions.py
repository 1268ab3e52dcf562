"""Conventions clients and operators expect, checked through the real server.

- An Anthropic stream's message_start and message_delta report the same input and
  cache-read counts (also when the prefix cache served part of the prompt).
- /metrics is Prometheus text (parsed back with prometheus_client's own parser) and
  carries the same numbers as the JSON view at /metrics.json.
- The tokenizer prints no "sequence longer than the specified maximum" warning for a
  prompt longer than the model's window (the server fits or refuses it itself).
"""

from __future__ import annotations

import httpx
import pytest

from jumpahead.core.script import Script, ScriptTurn

from .serving import engine_of, serve

anthropic = pytest.importorskip("anthropic")


@pytest.fixture(scope="module")
def engine(loaded_model, tmp_path_factory):
    with engine_of(loaded_model, max_batch=2, max_asserted=1024,
                   prefix_cache_dir=str(tmp_path_factory.mktemp("pc"))) as eng:
        yield eng


def _usages(client, messages) -> tuple[dict, dict]:
    raw = client.messages.create(model="m", max_tokens=50, messages=messages, stream=True)
    start = delta = None
    for event in raw:
        if event.type == "message_start":
            start = event.message.usage
        elif event.type == "message_delta":
            delta = event.usage
    assert start is not None and delta is not None
    return start, delta


def test_anthropic_stream_usage_agrees_between_start_and_delta(engine):
    messages = [{"role": "user", "content": "Summarize: the cache keeps the prompt's KV for the next turn. " * 8}]
    with serve(engine, script=Script([ScriptTurn(text="It reuses work."), ScriptTurn(text="It reuses work.")])) as url:
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=600)
        first = _usages(client, messages)
        second = _usages(client, messages)  # the same prompt again: served from the prefix cache
    for start, delta in (first, second):
        assert start.input_tokens == delta.input_tokens
        assert (start.cache_read_input_tokens or 0) == (delta.cache_read_input_tokens or 0)
    assert (second[0].cache_read_input_tokens or 0) > 0  # the second really hit the cache
    assert (first[0].cache_read_input_tokens or 0) < (second[0].cache_read_input_tokens or 0)


def test_metrics_are_prometheus_text_with_the_json_numbers(engine):
    from prometheus_client.parser import text_string_to_metric_families

    with serve(engine, script=Script([ScriptTurn(text="ok")])) as url:
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=600)
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        httpx.post(f"{url}/v1/messages", json={"messages": "not a list"}, timeout=30)  # one 400
        text = httpx.get(f"{url}/metrics", timeout=60)
        report = httpx.get(f"{url}/metrics.json", timeout=60).json()
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text.text)}
    samples = {s.name: s.value for f in families.values() for s in f.samples}
    assert families["jumpahead_server_http_400"].type == "counter"
    assert samples["jumpahead_server_http_400_total"] == report["server"]["http_400"] == 1
    assert samples["jumpahead_server_finish_stop_total"] == report["server"]["finish_stop"] >= 1
    gauges = [f for f in families.values() if f.name.startswith("jumpahead_engine_")]
    assert gauges and all(f.type == "gauge" for f in gauges)


def test_no_tokenizer_length_warning_on_long_prompts(loaded_model, capfd):
    from jumpahead.core.prompt import render_prompt
    from jumpahead.core.turn import Message, Turn

    _, tokenizer, _ = loaded_model
    ids = render_prompt(tokenizer, Turn(messages=[Message("user", "word " * 12000)]))
    assert len(ids) > 8192  # longer than the tokenizer's model_max_length
    captured = capfd.readouterr()
    assert "longer than the specified maximum" not in captured.err + captured.out

