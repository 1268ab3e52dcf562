"""MTP drafted for every row of a round at once (engine/methods/mtp_group.py MtpGroup), on the
tiny random-weight qwen3_next / qwen3_5 folders of tests/test_mtp.py.

Oracles: with rows joining and leaving (more requests than slots, different lengths)
the output equals ordinary decoding and the telemetry adds up; every grouped row's
draft equals the per-row path's draft for the same row (MtpProposer, run beside it on
the same target states); after rejections a row's entries in the batched cache equal
a fresh forward; the group runs one chain forward per step for all rows, fewer than
the per-row path's forwards for the same drafts.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import mlx.core as mx

from jumpahead.bench.family_models import MTP_FAMILIES
from jumpahead.engine.methods.mtp import MtpProposer
from jumpahead.engine.methods.mtp_group import GroupedMtpProposer
from jumpahead.engine.types import GenerationRequest
from tests.serving import chat_prompt, run_rows
from tests.test_mtp import TEXTS, cache_engine, check_entries_are_the_targets, folders, served, two_turns  # noqa: F401

LENGTHS = [10, 30, 18, 40, 12, 24]


def six_prompts(tok) -> list[list[int]]:
    texts = TEXTS + [TEXTS[0] + " " + TEXTS[3], TEXTS[2] + " Then " + TEXTS[1]]
    return [chat_prompt(tok, t) for t in texts]


class Shadowed(GroupedMtpProposer):
    """A grouped proposer with the per-row path beside it on the same target states:
    records (grouped draft, per-row draft) pairs, and the row's batched cache entries
    before it leaves the group."""

    def __init__(self, group) -> None:
        super().__init__(group)
        self.alone = MtpProposer(group.mtp)
        self.pairs: list[tuple[list[int], list[int]]] = []
        self.drafted_at: list[int] = []
        self.entries = None

    def observe_hidden(self, position, hidden) -> None:
        super().observe_hidden(position, hidden)
        self.alone.observe_hidden(position, hidden)

    def propose(self, view, max_len):
        prop = super().propose(view, max_len)
        if prop is not None:
            self.alone.cooldown = 0
            self.alone.k = len(prop.tokens)
            solo = self.alone.propose(view, len(prop.tokens))
            self.pairs.append((prop.tokens, None if solo is None else solo.tokens))
            self.drafted_at.append(len(view.tokens) - 1)
        return prop

    def release_row(self) -> None:
        group = self.round_group
        b = group.index(self)
        if b is not None:
            layer = group.cache.layers[0]
            n = group.cache.ends[b]
            # read on the scheduler thread (its stream): numpy from here on
            self.entries = (self.base, *(np.array(a[b, :, :n].astype(mx.float32)) for a in (layer.keys, layer.values)))
        super().release_row()


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_rows_joining_and_leaving_equal_ordinary_and_the_rows_drafted_alone(served, fam):
    eng = served(fam, predictable=True)
    ps = six_prompts(eng.tokenizer)
    plain = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=n, methods=["none"]) for p, n in zip(ps, LENGTHS)])
    group = eng.method_state("mtp").group
    before = dict(group.stats())
    metrics = dict(eng.metrics().get("methods", {}).get("mtp", {"proposals": 0, "accepted": 0}))
    shadows = [Shadowed(group) for _ in ps]
    drafted = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=n, methods=["none"], proposers=[s])
                             for p, n, s in zip(ps, LENGTHS, shadows)])
    assert [o["tokens"] for o in drafted] == [o["tokens"] for o in plain]
    pairs = [pair for s in shadows for pair in s.pairs]
    assert len(pairs) > 20
    assert all(g == a for g, a in pairs), [pair for pair in pairs if pair[0] != pair[1]][:3]
    # telemetry adds up per row and in /metrics
    for o in drafted:
        m = o["fill"]["methods"]["mtp"]
        assert sum(m["accepted_histogram"]) == m["proposals"] > 0
        assert m["accepted"] == o["kinds"].count("mtp")
    after = eng.metrics()
    total = sum(o["fill"]["methods"]["mtp"]["proposals"] for o in drafted)
    assert after["methods"]["mtp"]["proposals"] - metrics["proposals"] == total
    # every row joined once and left: the group is empty again (the scheduler thread
    # retires a row just after its last chunk is out)
    for _ in range(200):
        if not group.members:
            break
        time.sleep(0.01)
    stats = eng.metrics()["mtp_group"]
    assert stats["rows"] == 0 and group.members == []
    assert stats["join_forwards"] - before["join_forwards"] == len(ps)
    assert sum(o["fill"]["methods"]["mtp"]["accepted"] for o in drafted) > 0


@pytest.mark.parametrize("fam", MTP_FAMILIES)
def test_grouped_cache_holds_the_entries_of_the_targets_states(served, fam):
    """After accepted and rejected drafts in a batch of 3, each row's entries in the
    batched cache at every committed position equal a fresh forward of the MTP layer
    over (mlx-lm's own hidden state of the target at t, embedding of x_{t+1})."""
    eng = served(fam, predictable=True)
    ps = six_prompts(eng.tokenizer)[:3]
    shadows = [Shadowed(eng.method_state("mtp").group) for _ in ps]
    out = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=40, methods=["none"], proposers=[s])
                         for p, s in zip(ps, shadows)])
    for p, o, s in zip(ps, out, shadows):
        m = o["fill"]["methods"]["mtp"]
        assert m["accepted"] > 0 and m["proposed"] > m["accepted"] and len(s.drafted_at) > 3
        base, keys, values = s.entries
        assert base == 0
        n = s.drafted_at[-1]  # entries 0..n-1 are the target's (n..: the last draft's guesses)
        check_entries_are_the_targets(eng, p + o["tokens"], n, keys, values)


def test_one_chain_forward_per_step_for_all_rows(served):
    """Four rows drafting together: the group's forwards are one catch-up and one per
    chain step a round, for all rows; the per-row path runs a forward per drafted token
    per row for the same drafts (equal drafts: the rows drafted alone are the oracle)."""
    eng = served("qwen3_next", predictable=True)
    ps = six_prompts(eng.tokenizer)[:4]
    alone = [MtpProposer(eng.method_state("mtp")) for _ in ps]
    drafts0 = eng.method_state("mtp").drafts
    solo = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=32, methods=["none"], proposers=[a])
                          for p, a in zip(ps, alone)])
    per_row = eng.method_state("mtp").drafts - drafts0
    group = eng.method_state("mtp").group
    before = dict(group.stats())
    grouped = run_rows(eng, [GenerationRequest(prompt=p, max_tokens=32, methods=["mtp"]) for p in ps])
    assert [o["tokens"] for o in grouped] == [o["tokens"] for o in solo]
    d = {k: group.stats()[k] - before[k] for k in before}
    assert d["row_forwards"] == per_row  # the same drafts, counted as the per-row path runs them
    batched = d["forwards"] + d["join_forwards"]
    assert d["join_forwards"] == len(ps) and d["chains"] >= d["catch_ups"]
    assert batched * 2 < per_row, d
    print(f"\nMTP forwards, 4 rows x 32 tokens: grouped {batched} ({d['catch_ups']} catch-ups, "
          f"{d['forwards'] - d['catch_ups']} chain steps, {d['join_forwards']} joins) vs per-row {per_row}; "
          f"{d['chains']} chains, {d['rows_drafted']} row drafts")


def retired(shadow: "Shadowed") -> tuple:
    """The shadow row's entries, once the scheduler thread has retired it."""
    for _ in range(200):
        if shadow.entries is not None:
            break
        time.sleep(0.01)
    return shadow.entries


def test_prompt_cache_hit_rows_draft_at_their_absolute_positions(folders, tmp_path):  # noqa: F811
    """A warm turn's row joins the group at the first position the target runs (base >
    0): its rope reads absolute positions, so its drafts equal the per-row path's."""
    eng = cache_engine(folders, tmp_path)
    try:
        shadow = Shadowed(eng.method_state("mtp").group)
        second, _ = two_turns(eng, lambda e: shadow)
        assert 0 < retired(shadow)[0] < len(second), "the second turn did not hit the cache"
        assert shadow.pairs and all(g == a for g, a in shadow.pairs)
    finally:
        eng.close()


@pytest.mark.parametrize("restart", [False, True])
def test_warm_turn_restores_the_mtp_state_from_the_prefix_cache(folders, tmp_path, restart):  # noqa: F811
    """Turn 1 drafts with MTP and retires; its MTP entries are kept beside the target's
    KV (in RAM; with `restart`, read back from the SSD tier by a new engine). Turn 2
    (turn 1's prompt and answer, then more) hits the cache there: the MTP layer is fed
    only the positions the target runs (plus the states after turn 1's last draft),
    its entries from position 0 equal a fresh forward over the whole sequence, and the
    output is ordinary decoding's."""
    from jumpahead.engine.methods.mtp_companion import MtpCompanion

    engines = [cache_engine(folders, tmp_path, ssd=restart)]

    def reopen(eng):
        if not restart:
            return eng
        eng.close()
        engines.append(cache_engine(folders, tmp_path, ssd=True))
        return engines[-1]

    shadows = []
    try:
        assert any(isinstance(h, MtpCompanion) for h in engines[0].prefix_cache.hooks)
        second, drafted = two_turns(engines[0], lambda e: shadows.append(Shadowed(e.method_state("mtp").group)) or shadows[-1],
                                    first_method="mtp", between=reopen)
        eng, shadow = engines[-1], shadows[0]
        base, keys, values = retired(shadow)
        assert base == 0, "the warm turn's MTP context did not start from the restored state"
        new = len(second) + len(drafted["tokens"]) - (len(second) - len(chat_prompt(eng.tokenizer, TEXTS[1])))
        # the new positions, and the states of turn 1's last round or two (after its last draft)
        assert 0 < shadow.fed <= new + 8 < len(second), (shadow.fed, new)
        print(f"\nwarm turn: MTP fed {shadow.fed} states for a {len(second)}-token prompt + "
              f"{len(drafted['tokens'])} tokens")
        check_entries_are_the_targets(eng, second + drafted["tokens"], shadow.drafted_at[-1], keys, values)
    finally:
        engines[-1].close()
