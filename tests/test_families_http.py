"""A sliding-window model (gemma3_text; the real Gemma 3 270M in the slow run) and a
hybrid recurrent one (qwen3_next) serve a
tool-calling session through `jumpahead serve --model DIR` (the default exact methods,
policy fit on) in all three protocols, with the real openai and anthropic SDKs.

The models are tiny random-weight ones (tests/families.py), so the call is forced
(tool_choice) and its one argument is an enum: the grammar settles everything but the
model's choice, and the call always completes. Before this engine knew the layer
kinds, every one of these requests was a 500.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from jumpahead.bench.family_models import build
from tests.serving import start_serve

UNITS = ["celsius", "fahrenheit"]
REAL = "gemma3-270m"  # the real Gemma 3 270M (slow: downloaded and converted once)
TOOL = {"name": "get_weather", "description": "The weather in Paris.",
        "parameters": {"type": "object", "properties": {"unit": {"enum": UNITS}}, "required": ["unit"]}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """fam -> a running `jumpahead serve --model ... --policy fit`, started on first use."""
    from jumpahead.engine.model.default_model import ensure_default_model

    root = tmp_path_factory.mktemp("families-http")
    tok = ensure_default_model(progress=lambda s: None)
    procs = {}

    def get(fam: str):
        if fam not in procs:
            model = fam if fam == REAL else str(build(fam, root, tok))
            procs[fam] = start_serve(["--model", model, "--policy", "fit"], root)
            procs[fam].wait_healthy(1200)
        return procs[fam]

    try:
        yield get
    finally:
        for p in procs.values():
            p.stop()


@pytest.mark.parametrize("fam", ["gemma3_text", "qwen3_next", pytest.param(REAL, marks=pytest.mark.slow)])
def test_tool_session_in_three_protocols(servers, fam):
    url = servers(fam).url
    health = httpx.get(f"{url}/health", timeout=30).json()
    assert "echo" in json.dumps(health["methods"])
    kinds = health["layers"]["layers"]
    assert ("recurrent" if fam == "qwen3_next" else "sliding") in kinds

    chat = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": TOOL}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    r = chat.chat.completions.create(model="local", messages=messages, tools=tools, tool_choice=forced,
                                     max_tokens=60, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["unit"] in UNITS
    # the session goes on: the tool result, then a second forced call, streamed
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"},
                 {"role": "user", "content": "And in the other unit?"}]
    stream = chat.chat.completions.create(model="local", messages=messages, tools=tools, tool_choice=forced,
                                          max_tokens=60, temperature=0, stream=True,
                                          stream_options={"include_usage": True})
    args, usage = "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                args += tc.function.arguments or ""
    assert json.loads(args)["unit"] in UNITS
    assert usage.prompt_tokens_details.cached_tokens > 0  # the first turn's prefix was reused

    resp = chat.responses.create(model="local", input="What is the weather in Paris?", max_output_tokens=60,
                                 tools=[{"type": "function", **TOOL}], tool_choice={"type": "function", "name": "get_weather"},
                                 temperature=0)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls and json.loads(calls[0].arguments)["unit"] in UNITS

    msgs = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=300)
    m = msgs.messages.create(model="local", max_tokens=60, messages=[{"role": "user", "content": "Weather in Paris?"}],
                             tools=[{"name": TOOL["name"], "description": TOOL["description"],
                                     "input_schema": TOOL["parameters"]}],
                             tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses[0].input["unit"] in UNITS
    metrics = httpx.get(f"{url}/metrics.json", timeout=30).json()
    assert metrics.get("errors", 0) == 0
