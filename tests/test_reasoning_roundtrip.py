"""Reasoning the server hands out comes back and hits the prefix cache.

Unit level: signatures verify only for this server's key and the exact text; an
Anthropic thinking block or a Responses reasoning item that does not verify is left
out of the history. Through the real server and the anthropic SDK: a multi-turn
session with thinking (script mode, the default model with a template that renders
reasoning back) caches the previous prompt plus its whole answer when the client
sends the signed thinking back, and only the previous prompt when it does not.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from jumpahead.proxy.anthropic_messages import message_object, parse_messages_request
from jumpahead.bench.thinking_cache import TURNS, reasoning_template_folder, session
from jumpahead.proxy.openai_responses import parse_responses_request, reasoning_item
from jumpahead.core.script import Script
from jumpahead.proxy.signing import Signer
from jumpahead.core.turn import TurnOutput

from .serving import serve


def _history(signature: str | None, signer: Signer) -> dict:
    block = {"type": "thinking", "thinking": "plan: read a.py"}
    if signature is not None:
        block["signature"] = signature
    return {"max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": "next"}]}


def test_thinking_signatures_verify_only_for_this_server_and_this_text():
    signer, other = Signer(b"k" * 32), Signer(b"x" * 32)
    out = TurnOutput(reasoning="plan: read a.py", content="ok")
    signature = message_object(out, id="m", model="m", signer=signer)["content"][0]["signature"]
    assert signer.verify("plan: read a.py", signature)
    assert not signer.verify("plan: read b.py", signature) and not other.verify("plan: read a.py", signature)
    kept = parse_messages_request(_history(signature, signer), signer=signer)
    assert kept.messages[1].reasoning == "plan: read a.py" and "thinking_dropped" not in kept.extra
    for bad in (None, "", other.sign("plan: read a.py"), signature[:-4] + "AAA="):
        turn = parse_messages_request(_history(bad, signer), signer=signer)
        assert turn.messages[1].reasoning is None and turn.messages[1].content == "ok"
        assert turn.extra["thinking_dropped"] == 1
    # without a signer (offline readers: importers, fit) nothing is dropped
    assert parse_messages_request(_history(None, signer)).messages[1].reasoning == "plan: read a.py"


def test_responses_encrypted_content_comes_back_only_when_sealed_here():
    signer = Signer(b"k" * 32)
    _, ctx = parse_responses_request({"input": "x", "include": ["reasoning.encrypted_content"]}, signer=signer)
    item = reasoning_item("think \u00e9 twice", ctx)
    assert item["encrypted_content"] != "think \u00e9 twice"

    def back(encrypted: str):
        body = {"input": [{"role": "user", "content": "go"},
                          {"type": "reasoning", "summary": [], "encrypted_content": encrypted},
                          {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                          {"role": "user", "content": "next"}]}
        return parse_responses_request(body, signer=signer)

    turn, ctx = back(item["encrypted_content"])
    assert turn.messages[1].reasoning == "think \u00e9 twice" and ctx.reasoning_dropped == 0
    for bad in (item["encrypted_content"][:-3] + "AA=", Signer(b"x" * 32).seal("think \u00e9 twice"), "gAAAAopaque"):
        turn, ctx = back(bad)
        assert turn.messages[1].reasoning is None and ctx.reasoning_dropped == 1


# --- a multi-turn Anthropic session through the SDK -------------------------------


@pytest.fixture(scope="module")
def reasoning_engine(loaded_model, tmp_path_factory):
    pytest.importorskip("anthropic")
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    folder = reasoning_template_folder(Path(info.path), tmp_path_factory.mktemp("reasoning-template"))
    engines = []

    def make() -> Engine:
        eng = Engine(model, load_tokenizer(folder), info, EngineConfig(
            max_batch=2, max_asserted=1024, prefix_cache_dir=str(tmp_path_factory.mktemp("pc"))))
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


def test_signed_thinking_keeps_the_session_on_the_cached_prefix(reasoning_engine):
    arms = {}
    for signed in (True, False):
        with serve(reasoning_engine(), script=Script(list(TURNS))) as url:
            arms[signed] = session(url, TURNS, signed=signed)
            dropped = httpx.get(f"{url}/metrics.json", timeout=60).json()["server"].get("thinking_dropped", 0)
        assert dropped == (0 if signed else len(TURNS) * (len(TURNS) - 1) // 2)
    signed, unsigned = arms[True], arms[False]
    print("\nturn prompt cached (signed) | prompt cached (unsigned)")
    for a, b in zip(signed, unsigned):
        print(f"{a['turn']:>4} {a['prompt']:>6} {a['cached']:>6}          | {b['prompt']:>6} {b['cached']:>6}")
    assert signed[0]["cached"] == unsigned[0]["cached"] == 0  # a fresh cache
    for n in range(1, len(TURNS)):
        prev_s, cur_s, prev_u, cur_u = signed[n - 1], signed[n], unsigned[n - 1], unsigned[n]
        assert cur_s["thinking_chars_sent"] > 0 and cur_u["thinking_chars_sent"] > 0  # both clients sent it
        # signed: the previous prompt and the previous answer, reasoning included, are all cached
        assert cur_s["cached"] > prev_s["prompt"] + 15, (prev_s, cur_s)
        # unsigned: thinking dropped, the prompt departs where the previous answer began
        assert prev_u["prompt"] - 2 <= cur_u["cached"] <= prev_u["prompt"] + 5, (prev_u, cur_u)
        assert cur_s["cached"] > cur_u["cached"]
