"""Script mode: file formats, rendering a turn in the model's format, the scripted proposer,
and a scripted turn run through the real engine (provenance `scripted`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.engine.methods.proposal import RowView
from jumpahead.core.errors import APIError
from jumpahead.core.turn_runner import complete_turn, prepare_turn
from jumpahead.core.script import (
    Script,
    ScriptedCall,
    ScriptedProposer,
    ScriptError,
    ScriptTurn,
    fit_prompt,
    message_start_ids,
    parse_script,
    render_turn,
    turn_tokens,
)
from jumpahead.core.turn import Message, Tool, Turn, TurnOutput

from .serving import script_engine

WRITE = Tool("write", "Write a file", {"type": "object", "properties": {"path": {"type": "string"},
                                                                        "content": {"type": "string"}}})
TURN = ScriptTurn(text="I will write it.", reasoning="The user wants a file.",
                  tool_calls=[ScriptedCall("write", {"path": "/tmp/x/hello.txt", "content": "hello world\n"})])


# --- file formats --------------------------------------------------------------------


def test_parse_jsonl_list_and_object_forms():
    lines = ['{"text": "a"}', "", '{"reasoning": "r", "tool_calls": [{"name": "f", "arguments": "{\\"x\\": 1}"}]}']
    jsonl = parse_script("\n".join(lines))
    assert [t.text for t in jsonl] == ["a", ""]
    assert jsonl[1].reasoning == "r" and jsonl[1].tool_calls == [ScriptedCall("f", {"x": 1})]
    as_list = parse_script(json.dumps([{"text": "a"}, {"text": "b", "comment": "ignored"}]))
    as_obj = parse_script(json.dumps({"turns": [{"text": "a"}, {"text": "b"}]}))
    assert [t.text for t in as_list] == [t.text for t in as_obj] == ["a", "b"]
    assert parse_script('{"text": "only"}')[0].text == "only"


@pytest.mark.parametrize("text, message", [
    ('{"txt": "typo"}', "unknown keys"),
    ('{"text": 5}', "text must be a string"),
    ('{"tool_calls": [{"arguments": {}}]}', "non-empty string name"),
    ('{"tool_calls": [{"name": "f", "arguments": "{bad"}]}', "not valid JSON"),
    ('{"text": "a"}\n{oops', "line 2: not JSON"),
    ('[1]', "must be a JSON object"),
])
def test_parse_errors_name_the_turn(text, message):
    with pytest.raises(ScriptError, match=message):
        parse_script(text, "s.jsonl")


def test_load_and_claim_in_order(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "one"}\n{"text": "two"}\n')
    script = Script.load(path)
    with script.claim() as (i, turn):
        assert (i, turn.text) == (0, "one")
    with pytest.raises(RuntimeError), script.claim():  # a failed request does not consume its turn
        raise RuntimeError("request failed")
    with script.claim() as (i, turn):
        assert (i, turn.text) == (1, "two")
    with pytest.raises(APIError) as exc, script.claim():
        pass
    assert exc.value.status == 400 and exc.value.code == "script_exhausted"
    assert script.status() == {"file": str(path), "turns": 2, "served": 2}
    with pytest.raises(ScriptError, match="no turns"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        Script.load(empty)
    with pytest.raises(ScriptError, match="cannot read"):
        Script.load(tmp_path / "missing.jsonl")


# --- rendering -----------------------------------------------------------------------


def test_render_turn_in_the_model_format_parses_back(loaded_model):
    from jumpahead.core.output_parser import OutputParser

    tokenizer = loaded_model[1]
    text = render_turn(tokenizer, TURN, tools=[WRITE])
    assert text.startswith("<think>\nThe user wants a file.\n</think>\n\nI will write it.\n<tool_call>\n")
    assert text.endswith("\n</tool_call>")
    parser = OutputParser.for_tokenizer(tokenizer, [WRITE])
    out = TurnOutput()
    for event in parser.feed(text) + parser.finish():
        out.add(event)
    assert out.reasoning.strip() == TURN.reasoning and out.content == TURN.text
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("write", TURN.tool_calls[0].arguments)]
    # a prompt that already opened the reasoning block: only the close marker is written
    opened = render_turn(tokenizer, ScriptTurn(text="hi"), in_reasoning=True)
    assert opened == "\n</think>\n\nhi"
    ids = turn_tokens(tokenizer, "hi")
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids[:-1]) == "hi"
    assert turn_tokens(tokenizer, "") == [tokenizer.eos_token_id]


def test_fit_prompt_keeps_a_fixed_head_and_drops_whole_blocks():
    prompt = list(range(100))
    assert fit_prompt(prompt, 200) is prompt and fit_prompt(prompt, 100) is prompt
    # a quarter of the limit for the head, the middle in blocks of a quarter: 90 over, 45 blocks of 2
    assert fit_prompt(prompt, 10) == [0, 1, *range(92, 100)]
    assert fit_prompt(prompt, 9) == [0, 1, *range(94, 100)]  # 91 over: 46 blocks, a token of slack
    # the grid comes from the window (the same every turn) when the limit is near it
    assert fit_prompt(prompt, 10, window=12) == [0, 1, 2, *range(93, 100)]
    assert fit_prompt(prompt, 10, window=40) == [0, 1, *range(92, 100)]  # a window far over: the limit's own
    assert fit_prompt(prompt, 0) == []
    # message starts (-1 here) within a quarter block of the grid (head 10, cut 170): the
    # head ends before one and the tail begins at one; farther ones are not used
    chat = list(range(200))
    for i in (5, 9, 171, 175):
        chat[i] = -1
    assert fit_prompt(chat, 40) == chat[:10] + chat[170:]
    assert fit_prompt(chat, 40, starts={-1}) == chat[:9] + chat[171:]


def _grow(tokens: list[int], start: int, steps: list[int], limit: int,
          **kw) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts of a history that only grows (`start` tokens of `tokens`, then `steps`
    more each turn: each prompt a prefix of the next) and their fits."""
    prompts, n = [], start
    for step in [0, *steps]:
        n += step
        prompts.append(tokens[:n])
    return prompts, [fit_prompt(p, limit, **kw) for p in prompts]


def _moves(fits: list[list[int]]) -> list[int]:
    """Turns whose fitted prompt does not start with the previous one (the prefix cache misses after the head)."""
    return [k for k in range(1, len(fits)) if fits[k][:len(fits[k - 1])] != fits[k - 1]]


def test_fit_prompt_of_a_growing_history_extends_the_previous_fit():
    """Agents resend the history with each turn appended. The fitted prompt of turn n+1
    starts with turn n's, except where the cut moves: at most once per block of growth,
    by a whole block (the old half/half cut moved on every turn)."""
    import random

    rng = random.Random(38)
    base = [rng.randrange(2, 30000) for _ in range(6000)]
    steps = [rng.randrange(5, 60) for _ in range(120)]  # tokens a turn adds: 32 on average
    limit, block = 1024, 256
    prompts, fits = _grow(base, 600, steps, limit)
    assert len(prompts[0]) < limit < len(prompts[-1])
    moves = _moves(fits)
    growth = len(prompts[-1]) - len(prompts[0])
    assert 1 <= len(moves) <= growth // block + 1, (len(moves), growth)
    assert len(moves) <= len(fits) // 5  # most turns extend the previous prompt exactly
    for k, (p, f) in enumerate(zip(prompts, fits)):
        assert len(f) <= limit and f[-limit // 2:] == p[-limit // 2:]  # the newest tokens, the end of the prompt
        if len(p) > limit:
            assert f[:block] == p[:block] and len(f) > limit - block  # the fixed head; a block of slack at most
        if k in moves and len(prompts[k - 1]) > limit:  # a move drops a whole block more
            assert len(f) == len(fits[k - 1]) + len(p) - len(prompts[k - 1]) - block
    # a restarted server cuts each prompt the same way
    assert [fit_prompt(list(p), limit) for p in prompts] == fits


def test_fit_prompt_cuts_at_message_starts_and_still_extends():
    """With the template's message start token, the kept head ends before a message and
    the tail begins with one (within a quarter block of the grid); the grid, and so the
    prefix, still does not move while the history grows by less than a block."""
    import random

    rng = random.Random(7)
    START = 1
    base: list[int] = []
    while len(base) < 4000:  # messages of 4..30 tokens: a start within any 32 tokens
        base += [START, *(rng.randrange(2, 30000) for _ in range(rng.randrange(3, 30)))]
    limit, block = 512, 128
    prompts, fits = _grow(base, 400, [rng.randrange(5, 60) for _ in range(100)], limit, starts={START})
    moves = _moves(fits)
    assert 1 <= len(moves) <= (len(prompts[-1]) - len(prompts[0])) // block + 1
    for p, f in zip(prompts, fits):
        if len(p) <= limit:
            continue
        # the head ends before a message start (within a quarter block of its grid
        # position), and the tail, the rest of the fit, begins with one
        (head,) = [h for h in range(block - block // 4 + 1, block + 1)
                   if f[:h] == p[:h] and f[h:] == p[len(p) - (len(f) - h):] and p[h] == START]
        assert f[head] == START
        assert limit // 2 <= len(f) <= limit


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(limit=st.integers(4, 600), over=st.one_of(st.none(), st.integers(0, 900)), start=st.integers(0, 900),
       steps=st.lists(st.integers(1, 90), min_size=1, max_size=25), with_starts=st.booleans(),
       seed=st.integers(0, 2**16))
def test_fit_prompt_properties(limit, over, start, steps, with_starts, seed):
    """Any limit, window and growing history: at most `limit` tokens; a head and a tail
    of the prompt (the newest quarter of the limit at least); a pure function; each fit
    extends the previous one but at most once per block of growth; a move drops a block."""
    import random

    rng = random.Random(seed)
    total = start + sum(steps)
    base = [1 if with_starts and rng.random() < 0.1 else rng.randrange(2, 500) for _ in range(total)]
    window = None if over is None else limit + over
    kw = {"window": window, "starts": {1} if with_starts else ()}
    prompts, fits = _grow(base, start, steps, limit, **kw)
    grid = max(limit, window or limit)
    grid = limit if 4 * limit < 3 * grid else grid
    block, reach = max(1, grid // 4), max(1, grid // 4) // 4
    for p, f in zip(prompts, fits):
        assert len(f) <= limit and fit_prompt(list(p), limit, **kw) == f
        if len(p) <= limit:
            assert f == p
            continue
        h = next((i for i in range(len(f)) if f[i] != p[i]), len(f))
        assert f[h:] == p[len(p) - (len(f) - h):]  # a head and a tail of the prompt
        assert len(f) - h > limit // 4 and len(f) > limit - block - 2 * reach  # the newest tokens; a block of slack
    moves = _moves(fits)
    assert len(moves) <= (len(prompts[-1]) - len(prompts[0])) // block + 1
    for k in moves:
        if len(prompts[k - 1]) > limit:  # the cut skips a whole block (a snap may take back a quarter)
            assert len(fits[k]) <= len(fits[k - 1]) + len(prompts[k]) - len(prompts[k - 1]) - block + reach


def test_message_start_ids_of_the_default_template(loaded_model):
    tokenizer = loaded_model[1]
    (start,) = message_start_ids(tokenizer)
    assert tokenizer.convert_ids_to_tokens(start) == "<|im_start|>"


def test_scripted_proposer_follows_the_row_and_counts_strays():
    script = [10, 11, 12, 13, 2]
    p = ScriptedProposer(script)
    prompt = [7, 7, 7]
    view = RowView(prompt + [10], 3, 100)  # the first token was forced by the logit bias
    assert p.propose(view, 2).tokens == [11, 12]
    # the engine capped the slice at 2 and sampled a stray token after it
    view = RowView(prompt + [10, 11, 12, 99], 3, 100)
    prop = p.propose(view, 64)
    assert prop.tokens == [13, 2] and prop.kind == "scripted" and prop.asserted and p.strays == 1
    view = RowView(prompt + [10, 11, 12, 99, 13, 2], 3, 100)
    assert p.propose(view, 64) is None


# --- through the real engine ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = script_engine(loaded_model, max_batch=2)
    yield eng
    eng.close()


def test_scripted_turn_runs_through_the_model(engine):
    script = Script([TURN, ScriptTurn(text="Done.")], prompt_limit=48)
    turn = Turn(messages=[Message("system", "You are helpful. " * 40), Message("user", "create hello.txt")],
                tools=[WRITE])
    prepared = prepare_turn(engine, turn, hooks=[script])
    assert 24 < len(prepared.request.prompt) <= 36 and prepared.script_turn == 0  # sticky_fit: a quarter of room
    kinds: list[str] = []

    async def run() -> TurnOutput:
        stream = engine.stream(prepared.request)
        async for chunk in stream:
            kinds.extend(chunk.kinds)
            for event in prepared.parser.feed(chunk.text):
                out.add(event)
        for event in prepared.parser.finish():
            out.add(event)
        return out

    out = TurnOutput()
    asyncio.run(run())
    assert set(kinds) == {"scripted"}  # the first token too: the engine takes it from the script
    assert out.content == "I will write it." and out.reasoning.strip() == "The user wants a file."
    (call,) = out.tool_calls
    assert call.name == "write" and json.loads(call.arguments) == TURN.tool_calls[0].arguments
    assert prepared.scripted.strays == 0

    second = asyncio.run(complete_turn(engine, prepare_turn(engine, turn, hooks=[script])))
    assert (second.content, second.finish_reason, second.tool_calls) == ("Done.", "stop", [])
    assert second.usage.completion_tokens == len(turn_tokens(engine.tokenizer, "Done."))
    with pytest.raises(APIError, match="script exhausted"):
        prepare_turn(engine, turn, hooks=[script])


def test_long_prompt_is_cut_to_fit_and_invalid_requests_keep_their_turn(engine):
    script = Script([ScriptTurn(text="x")])
    bad = Turn(messages=[Message("user", "hi")], max_tokens=0)
    with pytest.raises(APIError) as exc:
        prepare_turn(engine, bad, hooks=[script])
    assert exc.value.status == 400 and script.served == 0
    huge = Turn(messages=[Message("user", "word " * (engine.context_length + 10))])
    prepared = prepare_turn(engine, huge, hooks=[script])  # script mode: the prompt is cut to fit the context
    assert len(prepared.request.prompt) <= engine.context_length - 2 and script.served == 1


def test_growing_prompts_over_the_limit_hit_the_prefix_cache(loaded_model):
    """The real server in script mode, three chat requests of an agent's growing history
    (each resends the one before, the answer and a new user message appended), all over
    the 512-token prompt limit, turn 2 past the block boundary where a cut that is a pure
    function of the length would move: the cut stays where turn 1 put it (a block below
    the limit, core/script.py sticky_fit), so turns 2 and 3 find
    the whole previous prompt in the prefix cache (usage cached_tokens) and prefill only
    what the turn added. (The old half/half cut moved every turn: about half the limit
    cached, the other half prefilled again.)"""
    import httpx

    from jumpahead.core.prompt import render_prompt

    from .serving import SCRIPT_SLICE, engine_of, serve

    limit, block = 512, 128
    answers = ["Step 1 done.", "Step 2 done.", "Step 3 done."]

    def requests(pad: int) -> list[list[Message]]:
        rules = " ".join(f"Rule {i}: module {i * 37 % 101} keeps test {i * 53 % 97} green." for i in range(40))
        history = [Message("system", f"You are a coding agent. {rules}"),  # no period a shifted cut could match
                   Message("user", "Fix the failing test in the parser module." + " please" * pad)]
        out = [list(history)]
        for n, answer in enumerate(answers[:-1]):
            history += [Message("assistant", answer), Message("user", f"Now run the tests again, round {n + 1}.")]
            out.append(list(history))
        return out

    with engine_of(loaded_model, max_batch=2, max_asserted=SCRIPT_SLICE, prefix_cache_ssd=False) as eng:
        tokenizer = eng.tokenizer
        # padding that puts turn 1 just below a block boundary and turn 2 past it: the worst
        # case for a cut that is a pure function of the length (it would move at turn 2)
        for pad in range(block):
            sizes = [len(render_prompt(tokenizer, Turn(messages=m))) for m in requests(pad)]
            if sizes[0] > limit and -(-(sizes[0] - limit) // block) != -(-(sizes[1] - limit) // block):
                break
        assert sizes[0] > limit, sizes
        pure = [fit_prompt(list(range(n)), limit) for n in sizes]
        assert pure[1][: len(pure[0])] != pure[0], "the padding must put a pure cut's move at turn 2"
        script = Script([ScriptTurn(text=a) for a in answers], prompt_limit=limit)
        usages = []
        with serve(eng, script=script) as url:
            for messages in requests(pad):
                body = {"model": "local", "max_tokens": 32,
                        "messages": [{"role": m.role, "content": m.content} for m in messages]}
                r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
                assert r.status_code == 200, r.text[:500]
                usages.append(r.json()["usage"])
    prompts = [u["prompt_tokens"] for u in usages]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    print(f"\nprompt tokens {sizes} cut to {prompts}; cached {cached}")
    assert all(limit - 2 * block - block // 2 < p <= limit - block + 64 for p in prompts), prompts  # room to grow
    for k in (1, 2):  # the previous prompt (and its answer) came from the cache; the new turn's tokens did not
        assert cached[k] >= prompts[k - 1] and prompts[k] - cached[k] < sizes[k] - sizes[k - 1], (prompts, cached)
        assert cached[k] >= 0.9 * prompts[k], (prompts, cached)


def test_sticky_fit_keeps_its_cut_while_the_history_grows_and_moves_it_far():
    """script mode's memory (sticky_fit): a growing history keeps turn 1's cut until it no
    longer fits, then the cut moves once, far enough that a block of turns fit again;
    a prompt that does not extend the previous one is cut afresh."""
    import random

    from jumpahead.core.script import sticky_fit

    rng = random.Random(7)
    limit, block = 1024, 256
    prompt = [rng.randrange(2, 30000) for _ in range(limit + block - 3)]  # just below a pure-rule boundary
    fitted, cut = sticky_fit(prompt, limit, window=limit)
    assert cut is not None and len(fitted) <= limit - block and fitted[:block] == prompt[:block]
    fits, moves, total_growth, prompts = [fitted], 0, 0, [prompt]
    for _ in range(60):
        step = [rng.randrange(2, 30000) for _ in range(rng.randrange(10, 60))]
        prompt = prompt + step
        total_growth += len(step)
        new, new_cut = sticky_fit(prompt, limit, window=limit, previous=cut)
        assert len(new) <= limit and new[-len(step):] == step
        if new[: len(fits[-1])] != fits[-1]:
            moves += 1
            assert new_cut != cut and len(new) <= limit - block  # a move leaves a block of room
        fits.append(new)
        prompts.append(prompt)
        cut = new_cut
    assert 1 <= moves <= total_growth // block + 1, (moves, total_growth)
    assert moves <= len(fits) // 8
    # the pure rule on the same prompts: it moves at the first step (turn 1 sat just
    # below its boundary) and more often overall
    pure = [fit_prompt(p, limit) for p in prompts]
    pure_moves = [k for k in range(1, len(pure)) if pure[k][: len(pure[k - 1])] != pure[k - 1]]
    assert pure_moves[0] == 1 and len(pure_moves) > moves, (pure_moves, moves)
    other = [rng.randrange(2, 30000) for _ in range(limit + 500)]
    fresh, fresh_cut = sticky_fit(other, limit, window=limit, previous=cut)
    assert fresh_cut is not None and fresh_cut.prompt == tuple(other) and len(fresh) <= limit - block
