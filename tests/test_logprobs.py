"""logprobs / top_logprobs on the real default model.

Oracles: a greedy answer's logprobs equal the log-softmax of one independent
full-sequence mlx-lm forward over prompt + answer (within 1e-4; the engine decodes
one token at a time with a KV cache, so float32 rounding differs slightly); the chosen
token is the argmax and the first of top_logprobs; a copy-heavy prompt under echo gives
the same tokens and logprobs as plain decoding; the wire forms (chat completions
streaming and not, Responses) carry the same numbers; bad values are a 400.
"""

from __future__ import annotations

import httpx
import mlx.core as mx
import numpy as np
import pytest

from jumpahead.engine.methods.proposal import Proposal
from jumpahead.engine.types import GenerationRequest, SamplingParams
from tests.serving import engine_of

openai = pytest.importorskip("openai")

TOL = 1e-4
N = 8  # tokens per answer: enough to cover several rounds, fast on 2 cores
CONFIG = 'HOST = "127.0.0.1"\nPORT = 8080\nDEBUG = True\nWORKERS = 4\nLOG_LEVEL = "info"\n'
COPY = f"Here is config.py:\n```python\n{CONFIG}```\nRewrite config.py with PORT = 9090. Show the whole file."
PLAIN = "Say hello in one short sentence."


@pytest.fixture(scope="module")
def engine(loaded_model):
    """This module's engine, served by conftest's base_url and client."""
    # cost_aware off: echo's proposals are always verified, so the accept path runs
    with engine_of(loaded_model, max_batch=4, cost_aware=False) as eng:
        yield eng


def _prompt(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


def _run(eng, prompt: list[int], methods: list[str], top: int = 5, max_tokens: int = N, proposers=()) -> tuple:
    req = GenerationRequest(prompt=prompt, sampling=SamplingParams(), max_tokens=max_tokens, methods=methods,
                            logprobs=top, proposers=list(proposers))
    chunks = eng.generate_sync(req)
    tokens = [t for c in chunks for t in c.tokens]
    lps = [lp for c in chunks for lp in (c.logprobs or [])]
    assert len(lps) == len(tokens)
    return tokens, lps, chunks


def _reference(model, prompt: list[int], answer: list[int]) -> np.ndarray:
    """Log-softmax [len(answer), V] at the answer's positions, one full forward."""
    logits = model(mx.array([prompt + answer], dtype=mx.int32))[0].astype(mx.float32)
    mx.eval(logits)
    x = np.array(logits, dtype=np.float64)[len(prompt) - 1 : len(prompt) - 1 + len(answer)]
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def test_greedy_logprobs_match_full_forward(engine, loaded_model):
    model, tokenizer, _ = loaded_model
    prompt = _prompt(tokenizer, PLAIN)
    tokens, lps, _ = _run(engine, prompt, ["none"])
    ref = _reference(model, prompt, tokens)
    for i, (tok, lp) in enumerate(zip(tokens, lps)):
        assert lp.token == tok
        assert abs(lp.logprob - ref[i, tok]) < TOL, (i, lp.logprob, ref[i, tok])
        assert tok == int(np.argmax(ref[i])) and lp.top[0][0] == tok and lp.top[0][1] == lp.logprob
        assert len(lp.top) == 5 and [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        for alt, value in lp.top:
            assert abs(value - ref[i, alt]) < TOL


def test_echo_gives_the_same_logprobs(engine, loaded_model):
    _, tokenizer, _ = loaded_model
    prompt = _prompt(tokenizer, COPY)
    plain, plain_lps, _ = _run(engine, prompt, ["none"], max_tokens=24)
    echo, echo_lps, chunks = _run(engine, prompt, ["echo"], max_tokens=24)
    assert chunks[-1].fill["verified"]["accepted"] > 0, chunks[-1].fill  # echo really accepted tokens
    assert echo == plain
    for a, b in zip(plain_lps, echo_lps):
        assert abs(a.logprob - b.logprob) < TOL
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


class _Jump:
    """Asserts two tokens once, after the first: they are never scored."""

    name = "jump"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.done = tokens, False

    def propose(self, view, max_len: int) -> Proposal | None:
        if self.done or len(view.tokens) == view.prompt_len:
            return None
        self.done = True
        return Proposal(list(self.tokens), "jump")

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass


def test_asserted_tokens_have_no_logprob(engine, loaded_model):
    model, tokenizer, _ = loaded_model
    prompt = _prompt(tokenizer, PLAIN)
    jump = tokenizer.encode(" there", add_special_tokens=False)[:2]
    tokens, lps, chunks = _run(engine, prompt, ["none"], top=0, max_tokens=6, proposers=[_Jump(jump)])
    kinds = [k for c in chunks for k in c.kinds]
    assert "jump" in kinds
    ref = _reference(model, prompt, tokens)
    for i, (kind, lp) in enumerate(zip(kinds, lps)):
        if kind == "jump":
            assert lp is None
        else:
            assert lp.top == [] and abs(lp.logprob - ref[i, tokens[i]]) < TOL


def test_chat_sdk_stream_and_not(client, engine, loaded_model):
    _, tokenizer, _ = loaded_model
    tokens, lps, _ = _run(engine, _prompt(tokenizer, COPY), ["none"], top=3)
    args = dict(model="m", messages=[{"role": "user", "content": COPY}], max_tokens=N, temperature=0,
                logprobs=True, top_logprobs=3, extra_body={"jumpahead": {"methods": ["echo"]}})
    whole = client.chat.completions.create(**args)
    content = whole.choices[0].logprobs.content
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    streamed, text = [], ""
    for chunk in client.chat.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            streamed += chunk.choices[0].logprobs.content
    assert text == whole.choices[0].message.content
    assert len(streamed) == len(content) == N  # the answer is cut by max_tokens: no end token
    for got, want, ref in zip(streamed, content, lps):
        assert got.token == want.token and bytes(want.bytes) == tokenizer.decode([ref.token]).encode()
        assert abs(got.logprob - want.logprob) < TOL and abs(want.logprob - ref.logprob) < TOL
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
        assert len(want.top_logprobs) == 3 and want.top_logprobs[0].token == want.token


def test_no_logprobs_unless_asked(client):
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PLAIN}], max_tokens=2,
                                         temperature=0)
    assert out.choices[0].logprobs is None


def test_responses_sdk(client):
    args = dict(model="m", input=PLAIN, max_output_tokens=N, temperature=0, top_logprobs=2,
                include=["message.output_text.logprobs"])
    resp = client.responses.create(**args)
    part = resp.output[-1].content[0]
    assert part.type == "output_text" and len(part.logprobs) > 0
    assert "".join(e.token for e in part.logprobs) == part.text
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in part.logprobs)
    deltas = []
    for event in client.responses.create(**args, stream=True):
        if event.type == "response.output_text.delta":
            deltas += event.logprobs
        elif event.type == "response.output_text.done":
            assert [e.logprob for e in event.logprobs] == [e.logprob for e in deltas]
    assert [e.token for e in deltas] == [e.token for e in part.logprobs]
    for a, b in zip(deltas, part.logprobs):
        assert abs(a.logprob - b.logprob) < TOL


@pytest.mark.parametrize("body", [
    {"logprobs": True, "top_logprobs": 21},
    {"logprobs": True, "top_logprobs": -1},
    {"top_logprobs": 2},
    {"logprobs": False, "top_logprobs": 2},
    {"logprobs": "yes"},
])
def test_chat_bad_values(base_url, body):
    r = httpx.post(f"{base_url}/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] in ("logprobs", "top_logprobs")


def test_responses_bad_value(base_url):
    r = httpx.post(f"{base_url}/v1/responses", json={"model": "m", "input": "hi", "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def _aligned(pieces: list[str], **parser_kw) -> tuple[list[str], str]:
    """Content tokens and content text when each piece is one token in its own chunk."""
    import json
    from types import SimpleNamespace

    from jumpahead.engine.logprobs import TokenLogprob
    from jumpahead.core.logprobs import ContentLogprobs, TokenText
    from jumpahead.core.output_parser import OutputParser
    from jumpahead.core.turn import TurnOutput

    table = [p.encode() for p in pieces] + [b"<eos>"]
    fake = SimpleNamespace(tokenizer=None, token_bytes=lambda: table)
    aligner = ContentLogprobs(TokenText(fake), end_ids={len(pieces)})
    parser = OutputParser(tool_parser=lambda body, tools: json.loads(body), **parser_kw)
    out = TurnOutput()
    for i, piece in enumerate([*pieces, ""]):
        before = parser.state
        events = parser.feed(piece)
        aligner.chunk([i], [TokenLogprob(i, -0.5, [])], before, parser.state, events)
        for e in events:
            out.add(e)
    final = parser.finish()
    aligner.attach(final)
    for e in final:
        out.add(e)
    return [e["token"] for e in out.logprobs or []], out.content


def test_only_content_tokens_carry_logprobs():
    call = ["<tool_call>", '{"name": "f", ', '"arguments": {}}', "</tool_call>"]
    tokens, text = _aligned(["Hi", " there", " ", *call], tool_start="<tool_call>", tool_end="</tool_call>")
    assert text == "Hi there" and tokens == ["Hi", " there"]  # the call and the layout before it: none
    tokens, text = _aligned(["<think>", "hmm", "</think>", "Yes", "."])
    assert text == "Yes." and tokens == ["Yes", "."]  # reasoning: none
    tokens, text = _aligned(["<", "b", ">", " ok"])  # held back as a possible "<think>", then shown
    assert text == "<b> ok" and tokens == ["<", "b", ">", " ok"]
