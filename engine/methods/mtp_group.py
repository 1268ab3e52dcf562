"""Checkpoint-native MTP drafting for every row of a round at once.

Every row's MTP-layer KV lives in one batched RowKVCache of one full-attention layer
(row b of the cache belongs to `members[b]`), so one row rolls back alone by moving
its end pointer and the layer runs once per step for the whole batch, as the learned
drafter's and the two-model draft's groups do (engine/methods/drafter.py, engine/methods/draft_model.py).
The scheduler calls `start_round`, `offer(proposer, view)` for each row whose
verified tokens can pay, and the first proposer that asks (`draft`) drafts for all
offered rows:

1. each row takes the target's hidden states it has not written yet (MtpProposer.take:
   from the first position the target ran since its last draft, up to the pending
   token) and rolls its cache back to that position (the last chain's speculative
   entries go, accepted or not, exactly as the per-row path trims);
2. rows already in the group write those states in one padded forward (the catch-up;
   rows with nothing to write get throwaway columns past their end, not advanced);
   a row seen for the first time, or whose states do not continue its cache (a gap:
   the per-row path restarts there too), writes them alone in a one-row cache and
   joins the group (RowKVCache.append_rows), as the target's rows join after prefill;
3. the chain: width-1 forwards over the whole batch, each row's MTP hidden state and
   greedy token fed back, lazily, with one host read at the end.

A row's cache column c holds absolute position `base + c` (a prompt-cache hit starts
the MTP context where the target's states do); `_Shifted` gives the layer's rope the
absolute positions, so a grouped row computes what the per-row path (MtpProposer, the
oracle in tests/test_mtp.py) computes. The layer is the model's own full-attention
decoder layer (hybrid trunks' linear layers are not in it), so pointer rollback is exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx

from .proposal import DraftsInGroup, Proposal, ReleasesRow, RowView
from .round_group import RoundGroup
from ..kv.row_cache import LayerCache, RowKVCache

if TYPE_CHECKING:
    from .mtp import Mtp
from .mtp import MtpProposer


class _Shifted:
    """A group's MTP attention cache as the decoder layer calls it: rope at each row's
    absolute position (its cache column plus its base)."""

    def __init__(self, layer: LayerCache, bases: list[int]) -> None:
        self.layer = layer
        self.bases = mx.array(bases, dtype=mx.int32)

    @property
    def offset(self) -> mx.array:
        return self.layer.plan.offset + self.bases

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        return self.layer.update_and_fetch(keys, values)


class MtpGroup(RoundGroup):
    """Every row's MTP state in one batched cache; drafts for all offered rows at once
    (see the module docstring; the round protocol: engine/methods/round_group.py)."""

    def __init__(self, mtp: "Mtp") -> None:
        super().__init__()
        self.mtp = mtp
        self.cache = RowKVCache(1)

    def stats(self) -> dict[str, int]:
        """/metrics "mtp_group": how the group's forwards were shared."""
        return {"rows": len(self.members), "forwards": self.forwards, "catch_ups": self.catch_ups,
                "join_forwards": self.joins, "row_forwards": self.row_forwards, "chains": self.chains,
                "rows_drafted": self.rows_drafted}

    # --- membership ------------------------------------------------------------------------
    def release(self, proposer: "GroupedMtpProposer") -> None:
        """The row is gone: its slot leaves the batch."""
        b = self.index(proposer)
        if b is not None:
            self.members.pop(b)
            self.cache.remove_rows([b])

    def reset(self) -> None:
        """Drop every row's state (after an error); rows rejoin when they next draft."""
        self.members = []
        self.cache = RowKVCache(1)

    def capture(self, p: "GroupedMtpProposer", length: int, most: int) -> dict[str, mx.array] | None:
        """Row p's MTP state after its first `length` tokens: the entries the target's
        states wrote (positions base.. up to its last draft's pending token) and the
        target's states after them, up to position length - 1 (at most `most` of them);
        None where the row holds no such state."""
        b = self.index(p)
        if b is None or not p.pending or p.pending[0][0] != p.valid_end:
            return None
        hidden = mx.concatenate([h for _, h in p.pending], axis=0)
        if p.valid_end + hidden.shape[0] < length or length - p.valid_end > most or length <= p.valid_end:
            return None
        n = p.valid_end - p.base
        layer = self.cache.layers[0]
        state = {"keys": mx.contiguous(layer.keys[b, :, :n]), "values": mx.contiguous(layer.values[b, :, :n]),
                 "hidden": mx.contiguous(hidden[: length - p.valid_end]),
                 "base": mx.array([p.base], dtype=mx.int32)}
        mx.eval(list(state.values()))
        return state

    # --- drafting ----------------------------------------------------------------------------
    def _forward(self, cache: RowKVCache, bases: list[int], hidden: mx.array, tokens: mx.array,
                 explicit: bool) -> mx.array:
        """The MTP layer over hidden, tokens [B, W(, D)] written at each row's end."""
        plan = cache.begin(tokens.shape[1], explicit=explicit)
        return self.mtp.head(hidden, self.mtp.embed(tokens), _Shifted(cache.layers[0], bases), mask=plan.mask)

    def _run(self, batch: list[tuple["GroupedMtpProposer", RowView]], widths: list[int]) -> None:
        wanted = {id(p): w for (p, _), w in zip(batch, widths)}
        last: dict[int, mx.array] = {}  # id(proposer) -> its MTP hidden [D] at its pending token's predecessor
        feeds: dict[int, tuple[mx.array, list[int]]] = {}  # id(member) -> (states, tokens) to write
        joins: list[tuple[GroupedMtpProposer, int, mx.array, list[int]]] = []
        for p, v in batch:
            taken = p.take(v)
            if taken is None:
                self.results[id(p)] = None
                continue
            first, hidden, tokens = taken
            p.valid_end = first + len(tokens)  # entries before the pending token are the target's
            b = self.index(p)
            if b is not None and p.base <= first <= p.base + self.cache.ends[b]:
                self.cache.ends[b] = first - p.base  # the last chain's guesses roll back by pointer
                feeds[id(p)] = (hidden, tokens)
                continue
            if b is not None:
                self.release(p)  # a gap: the row's MTP context restarts at the states it has
            joins.append((p, first, hidden, tokens))
        if feeds:
            last.update(self._catch_up(feeds))
        for p, first, hidden, tokens in joins:
            last[id(p)] = self._join(p, first, hidden, tokens)
        if last:
            self._chain(last, [wanted[i] for i in last])

    def _catch_up(self, feeds: dict[int, tuple[mx.array, list[int]]]) -> dict[int, mx.array]:
        """Every fed member writes its states in one forward padded to the longest."""
        width = max(len(t) for _, t in feeds.values())
        hidden, tokens, counts = [], [], []
        dim, dtype = next(iter(feeds.values()))[0].shape[-1], next(iter(feeds.values()))[0].dtype
        for p in self.members:
            h, t = feeds.get(id(p), (None, []))
            counts.append(len(t))
            pad = mx.zeros((width - len(t), dim), dtype=dtype)
            hidden.append(pad if h is None else mx.concatenate([h.astype(dtype), pad]) if len(t) < width else h)
            tokens.append(t + [0] * (width - len(t)))
        g = self._forward(self.cache, [p.base for p in self.members], mx.stack(hidden),
                          mx.array(tokens, dtype=mx.int32), explicit=True)
        self.cache.advance(counts)
        self.forwards += 1
        self.catch_ups += 1
        for p, n in zip(self.members, counts):
            p.fed += n
        return {id(p): g[b, n - 1] for b, (p, n) in enumerate(zip(self.members, counts)) if n}

    def _join(self, p: "GroupedMtpProposer", first: int, hidden: mx.array, tokens: list[int]) -> mx.array:
        """Write a new row's states alone in a one-row cache and add it to the batch."""
        one = RowKVCache(1)
        one.ends = [0]
        if p.restored is not None:  # a prefix-cache hit's entries (engine/methods/mtp_companion.py)
            base, keys, values = p.restored
            if base + keys.shape[1] == first:
                one.layers[0].keys, one.layers[0].values = keys[None], values[None]
                one.ends = [keys.shape[1]]
                first = base
            p.restored = None
        g = self._forward(one, [first], hidden[None], mx.array([tokens], dtype=mx.int32),
                          explicit=self.mtp.head.array_mask)
        one.advance([len(tokens)])
        mx.eval(g, *one.arrays())
        self.cache.append_rows(one)
        self.members.append(p)
        p.base = first
        p.fed += len(tokens)
        self.joins += 1
        return g[0, -1]

    def _chain(self, last: dict[int, mx.array], widths: list[int]) -> None:
        """The widest row's count of greedy tokens for every drafting row: that many
        less one batched forwards (row by row: widths[i] forwards each, as Mtp.draft)."""
        width = max(widths)
        head = self.mtp.lm_head
        drafting = [1 if id(p) in last else 0 for p in self.members]
        some = next(iter(last.values()))
        g = mx.stack([last.get(id(p), mx.zeros_like(some)) for p in self.members])  # [B, D]
        tok = mx.argmax(head(g), axis=-1).astype(mx.int32)  # [B]
        steps = [tok]
        bases = [p.base for p in self.members]
        for _ in range(width - 1):  # speculative entries: rolled back at the row's next draft
            g = self._forward(self.cache, bases, g[:, None, :], tok[:, None], explicit=True)[:, 0, :]
            self.cache.advance(drafting)
            tok = mx.argmax(head(g), axis=-1).astype(mx.int32)
            steps.append(tok)
            self.forwards += 1
        table = mx.stack(steps, axis=1)
        mx.eval(table, *self.cache.arrays())
        rows = table.tolist()
        self.chains += 1
        self.rows_drafted += len(last)
        self.row_forwards += sum(widths)
        for b, p in enumerate(self.members):
            if drafting[b]:
                self.results[id(p)] = rows[b]


class GroupedMtpProposer(MtpProposer, DraftsInGroup, ReleasesRow):
    """A row's MTP proposals from the shared MtpGroup (the length adapts, a row the
    layer keeps missing rests, as MtpProposer's)."""

    def __init__(self, group: MtpGroup, k: int = 3, max_k: int = 6) -> None:
        super().__init__(group.mtp, k, max_k)
        self.round_group = group
        self.base = 0  # absolute position of the row's cache column 0 in the group
        self.valid_end = 0  # absolute position up to which its entries are from the target's states
        # (base, keys, values): a prefix-cache hit's entries, installed when the row joins
        self.restored: tuple[int, mx.array, mx.array] | None = None
        self.fed = 0  # target states this row wrote into the MTP cache (tests)

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self.resting():
            return None
        k = min(self.k, max_len)
        tokens = self.round_group.draft(self, view, k) if k > 0 else None
        return None if tokens is None else Proposal(tokens, "mtp")

    def release_row(self) -> None:
        self.round_group.release(self)
