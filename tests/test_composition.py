"""Composition of proposals in one round (engine/schedule/scheduler.py `_propose`), on the real
default model with the shipped drafter.

A row asks every verified proposer and carries the proposal with the most expected
accepted tokens (the width policy's per-proposer acceptance rate, `expected_accepted`);
asserted proposals still win outright. Oracles: outputs equal ordinary greedy decoding
token for token; the per-method telemetry counts only carried proposals (each one fed
back exactly once), the unchosen ones under `outranked`, and rounds a later proposer
won under `usage.fill` `verified.later_won`.
"""

from __future__ import annotations


import pytest

from jumpahead.engine.methods.drafter import DrafterProposer, default_drafter_path
from jumpahead.engine.methods.echo import EchoProposer
from jumpahead.engine.methods.proposal import Proposal
from jumpahead.engine.types import GenerationRequest
from tests.oracle import assert_same_or_near_tie
from tests.test_proposals import CODE, CONFIG
from tests.serving import chat_prompt, frozen_width_policy, run_rows

SHIPPED = default_drafter_path()
PROMPTS = [
    f"Here is config.py:\n```python\n{CONFIG}```\nRewrite config.py with PORT = 9090. Show the whole file.",
    f"Repeat this code exactly:\n```python\n{CODE}```",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the steps to make a cup of tea.",
]
N = 40


@pytest.fixture(scope="module")
def ceng(loaded_model, tmp_path_factory):
    """An engine of its own with the shipped drafter; the width policy keeps this CPU's
    default costs (not refitted from the rounds it times: a fit on a loaded machine can
    price every proposal out, and these tests check which proposal a round carries)."""
    from jumpahead.engine.engine import Engine, EngineConfig
    model, tokenizer, info = loaded_model
    cache_dir = str(tmp_path_factory.mktemp("composition-prompt-cache"))
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=8, prefix_cache_dir=cache_dir, method_specs={"drafter": str(SHIPPED)}))
    eng.scheduler.width_policy = frozen_width_policy()
    yield eng
    eng.close()




def _plain(eng, prompt: list[int], n: int = N) -> list[int]:
    return run_rows(eng, [GenerationRequest(prompt=prompt, max_tokens=n, methods=["off"])])[0]["tokens"]


class Counting:
    """Counts a proposer's non-empty proposals and its feedback calls (one per carried
    proposal: the scheduler feeds back only what a round verified or asserted)."""

    def __init__(self) -> None:
        self.proposed = 0
        self.fed_back = 0

    def counted(self, prop):
        if prop is not None and prop.tokens:
            self.proposed += 1
        return prop


class Script(Counting):
    """Proposes the next tokens of a known continuation while the output follows it
    (`kind` verified: an oracle draft; asserted: as a jump or a script would)."""

    def __init__(self, name: str, continuation: list[int], kind: str, span: int = 4, until: int | None = None,
                 match: int = 0) -> None:
        super().__init__()
        self.name, self.kind, self.span, self.match = name, kind, span, match
        self.continuation = continuation[:until] if until is not None else continuation

    def propose(self, view, max_len):
        done = len(view.tokens) - view.prompt_len
        if list(view.tokens[view.prompt_len:]) != self.continuation[:done]:
            return None
        nxt = self.continuation[done : done + min(self.span, max_len)]
        return self.counted(Proposal(list(nxt), self.kind, match=self.match) if nxt else None)

    def feedback(self, proposal, accepted):
        self.fed_back += 1


class Wrong(Counting):
    """A short copy-like proposal the target rejects: one token after a 2-token match
    (acceptance prior 0.35, expected 0.35 accepted tokens)."""

    def __init__(self, name: str = "weak") -> None:
        super().__init__()
        self.name = name

    def propose(self, view, max_len):
        return self.counted(Proposal([(view.tokens[-1] + 1) % 1000], "echo", match=2))

    def feedback(self, proposal, accepted):
        self.fed_back += 1


def counting(proposer):
    """`proposer` with its proposals and feedback calls counted in `proposer.c`."""
    c = proposer.c = Counting()
    propose, feedback = proposer.propose, proposer.feedback

    def counted_propose(view, max_len):
        return c.counted(propose(view, max_len))

    def counted_feedback(proposal, accepted):
        c.fed_back += 1
        feedback(proposal, accepted)

    proposer.propose, proposer.feedback = counted_propose, counted_feedback
    return proposer


def _settle(eng, timeout: float = 30.0) -> None:
    """Wait until the engine thread has retired every row (its round is done)."""
    import time

    end = time.monotonic() + timeout
    while not eng.scheduler.idle:
        assert time.monotonic() < end, "the engine did not go idle"
        time.sleep(0.01)


def _methods(fill: dict) -> dict:
    return fill.get("methods", {})


@pytest.mark.parametrize("cost_aware", [True, False])
def test_a_later_proposal_expected_to_land_more_is_carried(ceng, cost_aware):
    """The first proposer offers one token at a low rate, the second the target's own
    next tokens: the second is carried every round, the first never (and never fed
    back), the counter shows it, and the output is ordinary greedy decoding."""
    tok = ceng.tokenizer
    prompt = chat_prompt(tok, PROMPTS[2])
    plain = _plain(ceng, prompt)
    weak, oracle = Wrong(), Script("oracle", plain, "draft")
    config = ceng.scheduler.config
    config.cost_aware = cost_aware
    before = ceng.scheduler.counters["verified_later_won"]
    try:
        out = run_rows(ceng, [GenerationRequest(prompt=prompt, max_tokens=N, methods=["off"], proposers=[weak, oracle])])[0]
    finally:
        config.cost_aware = True
    assert out["tokens"] == plain
    fill, m = out["fill"], _methods(out["fill"])
    assert m["oracle"]["proposals"] == oracle.fed_back > 0
    assert m["oracle"]["accepted"] == out["kinds"].count("draft") > N // 2
    assert m.get("weak", {}).get("proposals", 0) == 0 and weak.fed_back == 0
    # every round both proposed (and at the first token, where no verified proposal is
    # carried or compared), and the later one won
    assert m["weak"]["outranked"] == fill["verified"]["later_won"] == m["oracle"]["proposals"] \
        == oracle.proposed - 1 == weak.proposed - 1
    _settle(ceng)
    assert ceng.scheduler.counters["verified_later_won"] - before == fill["verified"]["later_won"]
    assert m["oracle"].get("outranked", 0) == 0


def test_ties_go_to_proposer_order(ceng):
    """Two proposers offering the same tokens at the same prior: the first is carried."""
    tok = ceng.tokenizer
    prompt = chat_prompt(tok, PROMPTS[3])
    plain = _plain(ceng, prompt, 24)
    first, second = Script("first", plain, "draft"), Script("second", plain, "draft")
    out = run_rows(ceng, [GenerationRequest(prompt=prompt, max_tokens=24, methods=["off"], proposers=[first, second])])[0]
    assert out["tokens"] == plain
    m = _methods(out["fill"])
    assert m["first"]["proposals"] == first.fed_back > 0 and second.fed_back == 0
    assert m["second"]["outranked"] == second.proposed - 1 == m["first"]["proposals"]  # (- the first token)
    assert out["fill"]["verified"]["later_won"] == 0


@pytest.mark.parametrize("batch", [1, 4])
def test_echo_and_drafter_equal_ordinary_greedy_decoding(ceng, batch):
    """methods ["echo", "drafter"]: both asked every round, one carried, outputs are
    ordinary greedy decoding's token for token (copy-heavy and plain prompts mixed)."""
    tok = ceng.tokenizer
    prompts = [chat_prompt(tok, p) for p in (PROMPTS[:1] if batch == 1 else PROMPTS)]
    plain = run_rows(ceng, [GenerationRequest(prompt=p, max_tokens=N, methods=["off"]) for p in prompts])
    config = ceng.scheduler.config
    config.objective = "latency"  # every row of the batch proposes (no throughput gating)
    try:
        both = run_rows(ceng, [GenerationRequest(prompt=p, max_tokens=N, methods=["echo", "drafter"]) for p in prompts])
    finally:
        config.objective = "throughput"
    assert [o["tokens"] for o in both] == [o["tokens"] for o in plain]
    for o in both:
        v, m = o["fill"]["verified"], _methods(o["fill"])
        assert sum(x["proposed"] for x in m.values()) == v["proposed"]
        assert sum(x["accepted"] for x in m.values()) == v["accepted"]
    outranked = sum(x["outranked"] for o in both for x in _methods(o["fill"]).values())
    assert outranked > 0, [o["fill"] for o in both]  # rounds really had two proposals to choose from
    assert sum(o["kinds"].count("echo") for o in both) > 0


def test_unchosen_proposals_are_not_counted(ceng):
    """Echo and the drafter (counting how often each proposes and is fed back) on a
    copy-heavy turn: per method, `proposals` is the proposals carried (each fed back
    once), `outranked` the rest; counting an unchosen proposal would break the sums."""
    tok = ceng.tokenizer
    prompt = chat_prompt(tok, PROMPTS[1])
    plain = _plain(ceng, prompt, 48)
    echo, drafter = counting(EchoProposer()), counting(DrafterProposer(ceng.method_state("drafter")))
    totals_before = {k: dict(v) for k, v in ceng.scheduler.totals.methods.items()}
    out = run_rows(ceng, [GenerationRequest(prompt=prompt, max_tokens=48, methods=["off"], proposers=[echo, drafter])])[0]
    assert out["tokens"] == plain
    fill, m = out["fill"], _methods(out["fill"])
    carried = sum(x["proposals"] for x in m.values())
    outranked = sum(x["outranked"] for x in m.values())
    assert carried == echo.c.fed_back + drafter.c.fed_back <= fill["rounds"]
    for name, c in (("echo", echo.c), ("drafter", drafter.c)):
        assert m[name]["proposals"] == c.fed_back > 0  # both were carried in some rounds
        assert sum(m[name]["accepted_histogram"]) == m[name]["proposals"]
    # the rest of what they proposed was outranked (or capped out by the width policy)
    assert 0 < outranked <= echo.c.proposed + drafter.c.proposed - carried, (fill, echo.c.proposed, drafter.c.proposed)
    assert fill["verified"]["proposed"] == sum(x["proposed"] for x in m.values())
    assert fill["verified"]["accepted"] == sum(x["accepted"] for x in m.values())
    assert fill["verified"]["later_won"] > 0  # the drafter (asked second) beat echo somewhere
    _settle(ceng)  # the engine thread notes /metrics totals after the row's last chunk
    totals = ceng.scheduler.totals.methods
    for name in m:
        got = totals[name]["proposals"] - totals_before.get(name, {}).get("proposals", 0)
        assert got == m[name]["proposals"]
        assert totals[name]["outranked"] - totals_before.get(name, {}).get("outranked", 0) == m[name]["outranked"]


def test_asserted_proposal_wins_over_verified_before_or_after(ceng):
    """A verified oracle and an asserted script of the same continuation: whichever
    comes first in proposer order, the asserted one is carried while it proposes; a
    verified proposer after it is not even asked."""
    tok = ceng.tokenizer
    prompt = chat_prompt(tok, PROMPTS[3])
    plain = _plain(ceng, prompt, 32)
    for order in ("verified_first", "asserted_first"):
        oracle = Script("oracle", plain, "draft")
        script = Script("scripted", plain, "scripted", span=4, until=12)
        proposers = [oracle, script] if order == "verified_first" else [script, oracle]
        out = run_rows(ceng, [GenerationRequest(prompt=prompt, max_tokens=32, methods=["off"], proposers=proposers)])[0]
        assert_same_or_near_tie(ceng.model, prompt, out["tokens"], plain)
        fill, m = out["fill"], _methods(out["fill"])
        assert out["kinds"][:12].count("scripted") >= 9, out["kinds"]  # the script asserted its span
        assert m["oracle"]["proposals"] == oracle.fed_back > 0  # it is carried once the script ends
        # every asserted proposal carried (the first token's is taken, not fed back)
        assert script.fed_back == script.proposed - 1 > 0
        if order == "verified_first":
            # the oracle was asked and outranked in every round the script proposed
            # (the first token too, where verified proposals are never carried)
            assert m["oracle"]["outranked"] == fill["verified"]["later_won"] == script.proposed - 1
        else:
            assert m.get("oracle", {}).get("outranked", 0) == 0 and fill["verified"]["later_won"] == 0
            assert oracle.proposed == oracle.fed_back  # never asked while the script proposed


def test_a_row_whose_copy_outranks_the_draft_is_not_drafted_for(ceng):
    """On a copy-heavy turn echo's long matches are expected to land more than the
    drafter's draft could: with `compose_copies` those rounds the group drafts nothing
    for the row (`sat_out`), so the drafter's chain covers fewer rows than with it off,
    and the output is still ordinary greedy decoding's token for token. With it off no
    round sits out (the count would be wrong if sat-out rounds were also drafted)."""
    tok = ceng.tokenizer
    prompt = chat_prompt(tok, PROMPTS[1])
    plain = _plain(ceng, prompt, 48)
    config, group = ceng.scheduler.config, ceng.method_state("drafter")
    runs = {}
    config.objective = "latency"
    try:
        for compose in (True, False):
            config.compose_copies = compose
            before = group.rows_drafted
            out = run_rows(ceng, [GenerationRequest(prompt=prompt, max_tokens=48, methods=["echo", "drafter"])])[0]
            runs[compose] = (out, group.rows_drafted - before)
    finally:
        config.compose_copies = True
        config.objective = "throughput"
    (on, drafted_on), (off, drafted_off) = runs[True], runs[False]
    assert on["tokens"] == plain and off["tokens"] == plain
    sat_on = _methods(on["fill"])["drafter"]["sat_out"]
    assert _methods(off["fill"]).get("drafter", {}).get("sat_out", 0) == 0
    assert sat_on > 0, on["fill"]
    assert drafted_on < drafted_off, (drafted_on, drafted_off, on["fill"])
    # each sat-out round carried the copy that outranked the draft (or nothing wide)
    assert _methods(on["fill"])["echo"]["proposals"] >= sat_on - on["fill"]["verified"].get("capped", 0)
