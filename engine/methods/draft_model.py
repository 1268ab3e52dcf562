"""The draft-model method: a second, smaller mlx-lm model proposes the next tokens.

`DraftModel` holds the draft's weights (shared by every row) and refuses, when it is
built, a draft whose tokenizer is not the target's: proposals are token ids, so both
models must give every id the same meaning. Each row gets a `DraftProposer`; every
row's draft state lives in the model's one `DraftModelGroup`: one batched cache of
the draft model (the engine's own RowKVCache, run by a ModelRunner of the draft, as
the target's group is; not mlx-lm's BatchKVCache, whose left-padded rows share one
write pointer and so cannot roll back one row alone), a row per proposer with its own
end pointer. Each round the rows offered to the group (the scheduler's
`_offer_round_groups`, as for the learned drafter) roll back to their committed
tokens by pointer, catch up on what they lack in one ragged forward, and draft k
greedy tokens in a chain of batched width-1 forwards: at B>1 the draft model runs one
forward per step for all rows, not one per row. The target verifies the tokens like
any verified proposal, so the row's output is the same as without the draft, at any
temperature. k adapts to the row's acceptance.

The prefix cache keeps a row's draft KV beside the target's (`DraftCompanion`, a
CompanionHook: RAM and SSD), so a warm turn feeds the draft model only the tokens
after the stored state instead of the whole prompt.

No second real model can be downloaded here: `ensure_draft_model(n_layers)` writes a
layer-truncated copy of the default model (same tokenizer, first blocks plus the
shared head) into the cache directory, once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

from ..kv.cache_layout import single_row
from ..kv.model_runner import ModelRunner
from .proposal import DraftsInGroup, Proposal, ReleasesRow, RowView
from .round_group import RoundGroup, group_member
from ..kv.row_cache import STEP

DRAFT_VERSION = 1
FEED_CHUNK = 512  # most tokens one draft forward consumes while catching up


class DraftModelError(ValueError):
    """A draft model that cannot serve this target (tokenizer family, cache kind)."""


# --- tokenizer family check ----------------------------------------------------------


def _hf(tok: Any) -> Any:
    return getattr(tok, "_tokenizer", tok)


PROBE_TEXT = "def f(x):\n    return x + 1  # héllo, 世界 <|im_end|>\n\t{\"key\": [1, 2.5e-3]}"


def tokenizer_differences(target: Any, draft: Any) -> list[str]:
    """Why `draft`'s tokenizer is not `target`'s family ([] when they agree).

    Compares the vocabularies (size and every token -> id), the special tokens, and
    how a probe text is encoded (merges). EOS ids are not compared: the target alone
    decides where a row stops.
    """
    a, b = _hf(target), _hf(draft)
    out: list[str] = []
    na, nb = len(a), len(b)
    if na != nb:
        out.append(f"vocabulary size {nb} != target's {na}")
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        bad = [(t, i, vb.get(t)) for t, i in va.items() if vb.get(t) != i]
        shown = ", ".join(f"{t!r}: {j} vs {i}" for t, i, j in sorted(bad, key=lambda x: x[1])[:3])
        out.append(f"{len(bad)} of {len(va)} tokens map to other ids ({shown})")
    sa, sb = set(a.all_special_tokens), set(b.all_special_tokens)
    if sa != sb:
        out.append(f"special tokens differ (draft only: {sorted(sb - sa)[:3]}, target only: {sorted(sa - sb)[:3]})")
    if not out and a.encode(PROBE_TEXT) != b.encode(PROBE_TEXT):
        out.append("the same text encodes to other ids (merges differ)")
    return out


# --- the model, its group and the per-row proposers ----------------------------------


class DraftModel:
    """A loaded draft model; `proposer()` makes one DraftProposer per row, all of them
    members of the model's one DraftModelGroup (a DraftModel serves one engine: its
    group is driven from that engine's thread)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        info: Any = None,
        target_tokenizer: Any = None,
        k: int = 4,
        max_k: int = 8,
    ) -> None:
        if not can_trim_prompt_cache(make_prompt_cache(model)):
            raise DraftModelError(
                "the draft model's cache cannot be trimmed (recurrent layers): "
                "a draft needs to roll back rejected tokens"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.k = k
        self.max_k = max_k
        # The engine's own runner over the draft: batched, ragged forwards over a
        # RowKVCache whose rows roll back by their end pointers (engine/kv/row_cache.py).
        self.runner = ModelRunner(model)
        if single_row(self.runner.layout):
            raise DraftModelError("the draft model has chunked-attention layers, which run one row per forward: "
                                  "a draft must batch its rows")
        self.split, self.head = self.runner.split, self.runner.head
        if target_tokenizer is not None:
            self.check_compatible(target_tokenizer)
        self.group = DraftModelGroup(self)

    @property
    def name(self) -> str:
        return self.info.name or "draft"

    def check_compatible(self, target_tokenizer: Any) -> None:
        """Raise DraftModelError when the draft's tokenizer is not the target's family."""
        diffs = tokenizer_differences(target_tokenizer, self.tokenizer)
        if diffs:
            raise DraftModelError(
                f"draft model {self.name!r} has another tokenizer than the target model: "
                + "; ".join(diffs)
                + ". A draft must share the target's tokenizer (same family)."
            )

    @classmethod
    def load(
        cls,
        path: str | Path,
        target_tokenizer: Any = None,
        progress: Callable[[str], None] = print,
        **kwargs: Any,
    ) -> "DraftModel":
        from ..model.loader import load_model

        model, tokenizer, info = load_model(str(path), progress=progress)
        return cls(model, tokenizer, info, target_tokenizer, **kwargs)

    def proposer(self) -> "DraftProposer":
        return DraftProposer(self.group, self.k, self.max_k)

    @property
    def fingerprint(self) -> str:
        """The draft's weights' identity (names its prefix-cache companion: a stored
        state is restored only into the draft model that computed it)."""
        found = self.__dict__.get("_fingerprint")
        if found is None:
            from ..model.fingerprint import model_fingerprint

            found = self.__dict__["_fingerprint"] = model_fingerprint(self.model, self.name, extra="draft")
        return found


def _common(a: Sequence[int], b: Sequence[int], start: int, limit: int) -> int:
    """Length of the common prefix of a and b, known equal up to `start`, at most `limit`."""
    n = max(0, min(start, limit))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class DraftModelGroup(RoundGroup):
    """Every row's draft state in one batched cache; drafts for all offered rows at once.

    Row b of `cache` (the draft model's RowKVCache) belongs to `members[b]`, whose
    `consumed` lists the tokens at positions [0, cache.ends[b]) (committed tokens,
    then the draft's own guesses from its last chain). The scheduler calls
    `start_round`, then `offer(proposer, view)` for each row whose verified tokens can
    pay this round; the first proposer that asks (`draft`) drafts for every offered
    row together:

    1. a row seen for the first time catches up alone in a single-row cache (from a
       prefix-cache state where one was restored, else from nothing) and joins the
       group (RowKVCache.append_rows), as the target's rows join after prefill;
    2. every other row rolls back to its longest common prefix with its committed
       tokens by moving its end pointer (rejected guesses are masked and overwritten),
       and what it lacks (the last accepted guess, the target's own token, the tokens
       of rounds it was not offered) is fed for all rows in one ragged forward
       (ModelRunner.forward_ragged; chunks of FEED_CHUNK where a row lags far);
    3. the chain: width-1 forwards over the whole batch, each row's greedy token fed
       back, `width - 1` times (lazy: one host read at the end).

    Rows of the cache that draft nothing this round still sit in the batch (a forward
    covers every row of a RowKVCache); they get one throwaway token written at their
    end and are not advanced, exactly like a rejected proposal token. A row leaves with
    `release` (DraftProposer.release_row, from Scheduler._retire), after the prefix
    cache captured its state (DraftCompanion)."""

    def __init__(self, draft: DraftModel) -> None:
        super().__init__()
        self.draft_model = draft
        self.runner = draft.runner
        self.cache = self.runner.new_cache()
        self.fed = 0  # tokens fed catching up (the other counters: RoundGroup)

    def stats(self) -> dict[str, int]:
        """/metrics "draft_model": how the group's forwards were shared."""
        return {"rows": len(self.members), "forwards": self.forwards, "catch_ups": self.catch_ups,
                "row_forwards": self.row_forwards, "join_forwards": self.joins, "chains": self.chains,
                "rows_drafted": self.rows_drafted, "fed_tokens": self.fed}

    # --- membership ---------------------------------------------------------------------
    def release(self, proposer: "DraftProposer") -> None:
        """The row is gone: its slot leaves the batch."""
        b = self.index(proposer)
        proposer.consumed, proposer.settled, proposer.restored = [], 0, None
        if b is None:
            return
        self.members.pop(b)
        self.cache.remove_rows([b])

    def reset(self) -> None:
        """Drop every row's state (after an error); rows catch up again when they next draft."""
        for p in self.members:
            p.consumed, p.settled = [], 0
        self.members = []
        self.cache = self.runner.new_cache()

    # --- drafting -------------------------------------------------------------------------
    def _run(self, batch: list[tuple["DraftProposer", RowView]], widths: list[int]) -> None:
        """Draft widths[i] tokens for batch[i] (the chain runs to the widest; a row
        gets the tokens of all its steps, the proposer takes what it asked for)."""
        width = max(widths)
        last: dict[int, mx.array] = {}  # id(proposer) -> lazy logits [V] after its last committed token
        feeds: dict[int, list[int]] = {}  # cache row -> tokens to feed
        for p, v in batch:
            tokens, n = v.tokens, len(v.tokens)
            b = self.index(p)
            if b is None:
                last[id(p)] = self._join(p, tokens)
                p.settled = n
                continue
            keep = _common(p.consumed, tokens, p.settled, min(len(p.consumed), n - 1))  # feed >= 1 token
            self.cache.ends[b] = keep  # roll back by pointer
            del p.consumed[keep:]
            feeds[b] = list(tokens[keep:])
            p.settled = n  # the row's tokens up to its pending one are committed
        if feeds:
            by_row = self._feed(feeds)
            for p, _ in batch:
                b = self.index(p)
                if b in by_row:
                    last[id(p)] = by_row[b]
        rows = [self.index(p) for p, _ in batch]
        zero = mx.array(0, dtype=mx.int32)
        firsts = {b: mx.argmax(last[id(p)], axis=-1).astype(mx.int32) for (p, _), b in zip(batch, rows)}
        B = len(self.members)
        current = mx.stack([firsts.get(b, zero) for b in range(B)])
        steps = [current]
        drafting = [1 if b in firsts else 0 for b in range(B)]
        self._grow_rings(width)
        for _ in range(width - 1):
            logits = self.runner.forward(current[:, None], self.cache, slice(-1, None))
            self.cache.advance(drafting)
            current = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
            steps.append(current)
            self.forwards += 1
        # row by row, each row's chain would be a forward per token it wants after the first
        self.row_forwards += sum(w - 1 for w in widths)
        table = mx.stack(steps, axis=1)
        mx.eval(table, *self.cache.arrays())
        table = table.tolist()
        self.chains += 1
        self.rows_drafted += len(batch)
        for (p, _), b in zip(batch, rows):
            p.consumed += table[b][: width - 1]  # fed back in the chain (the last one was not)
            self.results[id(p)] = table[b]

    def _grow_rings(self, width: int) -> None:
        """Sliding-window layers keep a ring of window + the widest forward (RowKVCache):
        enough to roll back one forward's rejected tokens. The chain writes its guesses
        in `width - 1` forwards of one token, rolled back together next round, so the
        ring must hold window + width - 1 before it starts (else a guess would overwrite
        a key the row's next queries still see)."""
        for layer in self.cache.windowed:
            need = layer.rounded(layer.window + width - 1)
            if layer.keys is not None and layer.capacity < need:
                layer.resize(need, self.cache.ends)

    def _join(self, p: "DraftProposer", tokens: Sequence[int]) -> mx.array:
        """Catch a new row up alone in a single-row cache and add it to the batch;
        the logits after its last token."""
        one = self.runner.new_cache()
        one.ends = [0]
        start = 0
        if p.restored is not None:  # a prefix-cache hit's draft state (DraftCompanion.restore)
            kv, n = p.restored
            n = _common(p.consumed, tokens, 0, min(n, len(p.consumed), len(tokens) - 1))
            if n > 0:
                capacity = ((len(tokens) + STEP) // STEP) * STEP
                one.install_segments([kv], int(kv.shape[3]), capacity)
                one.ends = [n]
                start = n
        p.restored = None
        logits = None
        feed = list(tokens[start:])
        for i in range(0, len(feed), FEED_CHUNK):
            part = feed[i : i + FEED_CHUNK]
            final = i + FEED_CHUNK >= len(feed)
            logits = self.runner.forward([part], one, slice(-1, None) if final else None)
            one.advance([len(part)])
            mx.eval(one.arrays() if not final else [logits, *one.arrays()])
            self.joins += 1
        self.fed += len(feed)
        p.fed += len(feed)
        p.consumed = list(tokens)
        self.cache.append_rows(one)
        self.members.append(p)
        return logits[0, -1]

    def _feed(self, feeds: dict[int, list[int]]) -> dict[int, mx.array]:
        """Feed each row b its tokens feeds[b] (all rows in each forward, at most
        FEED_CHUNK tokens per row per forward); the logits after each one's last."""
        out: dict[int, mx.array] = {}
        at = dict.fromkeys(feeds, 0)
        while any(at[b] < len(f) for b, f in feeds.items()):
            inputs, counts, wants = [], [], []
            for b in range(len(self.members)):
                f = feeds.get(b)
                if f is None or at[b] >= len(f):
                    inputs.append([0])  # a throwaway token at the row's end, not advanced
                    counts.append(0)
                    wants.append(0)
                    continue
                part = f[at[b] : at[b] + FEED_CHUNK]
                at[b] += len(part)
                inputs.append(part)
                counts.append(len(part))
                wants.append(1 if at[b] == len(f) else 0)
            logits, offsets = self.runner.forward_ragged(inputs, self.cache, wants)
            self.cache.advance(counts)
            for b, want in enumerate(wants):
                if want:
                    out[b] = logits[offsets[b]]
            self.forwards += 1
            self.catch_ups += 1
            self.row_forwards += sum(1 for c in counts if c)
            if any(at[b] < len(f) for b, f in feeds.items()):
                mx.eval(self.cache.arrays())
        for b, f in feeds.items():
            self.members[b].consumed += f
            self.members[b].fed += len(f)
            self.fed += len(f)
        return out

    # --- the prefix cache's view (DraftCompanion) -----------------------------------------
    def capture(self, p: "DraftProposer", tokens: Sequence[int], length: int) -> dict[str, mx.array] | None:
        """Row p's draft KV over the first `length` committed tokens, or its longest
        part the draft holds: {"kv": [L, 2|1, H, n, D], "length": [n]}; None where it
        holds none or its layers do not pack into one segment (sliding windows would
        need snapshots: such a draft re-prefills on a hit)."""
        b = self.index(p)
        if b is None or self.cache.snapshots or self.cache.segment_packing() not in ("pair", "concat"):
            return None
        n = _common(p.consumed, tokens, min(p.settled, length), min(length, len(p.consumed), self.cache.ends[b]))
        if n <= 0:
            return None
        return {"kv": self.cache.segment(b, 0, n), "length": mx.array([n], dtype=mx.int32)}


class DraftProposer(DraftsInGroup, ReleasesRow):
    """Per-row draft proposals (verified, kind "draft"); the row's draft state lives in
    the shared DraftModelGroup. k adapts to the row's acceptance, and a row the draft
    keeps missing rests a few rounds."""

    name = "draft"

    def __init__(self, group: DraftModelGroup, k: int = 4, max_k: int = 8) -> None:
        self.round_group = group
        self.consumed: list[int] = []  # tokens in the row's slot of the group's cache, in order
        self.settled = 0  # consumed[:settled] are committed tokens of the row: never trimmed
        # (kv, n): a prefix-cache hit's draft state for the first n prompt tokens,
        # installed when the row first drafts (DraftModelGroup._join)
        self.restored: tuple[mx.array, int] | None = None
        self.k = k
        self.max_k = max_k
        self.cooldown = 0
        self.misses = 0
        self.fed = 0  # tokens the draft model consumed catching this row up (tests)

    @property
    def draft(self) -> DraftModel:
        return self.round_group.draft_model

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self.cooldown > 0:
            self.cooldown -= 1
            return None
        k = min(self.k, max_len)
        if k <= 0:
            return None
        return Proposal(self.round_group.draft(self, view, k), "draft")

    def release_row(self) -> None:
        """The row left the group (engine/schedule/scheduler.py _retire): free its slot."""
        self.round_group.release(self)

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        k = len(proposal.tokens)
        if accepted == k:
            self.k = min(self.max_k, self.k + 2)
            self.misses = 0
        elif accepted == 0:
            self.k = max(1, self.k // 2)
            self.misses += 1
            if self.misses >= 3:  # the draft keeps missing here: stop paying for it a while
                self.cooldown = 2 * self.misses
        else:
            self.k = max(1, accepted + 1)
            self.misses = 0


class DraftCompanion:
    """The draft model's KV stored with the target's in the prefix cache (RAM and SSD;
    engine/prefix/prefix_cache.py CompanionHook): when a row's tokens are published, its
    draft state over them is captured beside the target's KV, and a hit hands the
    deepest one to the new row's proposer, which then feeds the draft only the tokens
    after it. The state is the whole prefix's draft KV (not the node's part: a
    companion is restored from one node), named by the draft's fingerprint."""

    def __init__(self, draft: DraftModel) -> None:
        self.group = draft.group
        self.name = f"draft-{draft.fingerprint[:16]}"

    def capture(self, row: Any, length: int) -> dict[str, mx.array] | None:
        p = group_member(row, self.group)
        return None if p is None else self.group.capture(p, list(row.prompt) + list(row.output), length)

    def restore(self, row: Any, state: dict[str, mx.array], length: int) -> None:
        p = group_member(row, self.group)
        if p is None or "kv" not in state or "length" not in state:
            return
        n = int(state["length"].reshape(-1)[0].item())
        kv = state["kv"]
        if not 0 < n <= min(length, len(row.prompt)) or kv.ndim != 5 or int(kv.shape[3]) != n:
            return
        p.restored = (kv, n)
        p.consumed = list(row.prompt[:n])
        p.settled = 0


# --- producing a draft: a truncated copy of the default model -------------------------


def ensure_draft_model(
    n_layers: int = 4,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """The default model's first `n_layers` blocks plus its head, as an mlx-lm folder.

    Built once in the cache directory (beside the default model) with the default
    model's conversion code (`truncate_layers`); same tokenizer, so it passes the
    family check. Returns the folder, for `DraftModel.load` or `serve --draft-model`.
    """
    from ..model.default_model import (
        MODEL_NAME,
        _install,
        _remove_stale_temps,
        default_cache_dir,
        ensure_default_model,
        is_complete,
        truncate_layers,
    )

    src = ensure_default_model(cache_dir, progress=progress)
    name = f"{MODEL_NAME}-draft-{n_layers}L"
    target = Path(cache_dir or default_cache_dir()) / "models" / name
    marker = target / "jumpahead.json"
    if is_complete(target):
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
        if info.get("draft_version") == DRAFT_VERSION and info.get("n_layers") == n_layers:
            return target
    _remove_stale_temps(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        progress(f"writing draft model {name} (first {n_layers} layers of {MODEL_NAME})")
        truncate_layers(src, tmp, n_layers)
        src_marker = json.loads((src / "jumpahead.json").read_text())
        src_marker.update({"model": name, "draft_of": MODEL_NAME, "n_layers": n_layers,
                           "draft_version": DRAFT_VERSION})
        (tmp / "jumpahead.json").write_text(json.dumps(src_marker, indent=2) + "\n")
        _install(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def draft_model_folder(spec: str, progress: Callable[[str], None] = print) -> str:
    """A `--draft-model` value as a folder: `truncated[:N]` builds (once) the default
    model's first N blocks (default 4); anything else is a folder path as given.
    ValueError names a bad N."""
    if spec != "truncated" and not spec.startswith("truncated:"):
        return spec
    raw = spec.partition(":")[2] or "4"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"truncated:N needs a positive number of layers, not {raw!r}")
    return str(ensure_draft_model(int(raw), progress=progress))


# --- method "draft"'s lifecycle (engine/methods/registry.py Lifecycle) ---------------------------


def load_draft(engine: Any, spec: str) -> DraftModel:
    """The draft model a `--draft-model` spec names (a folder, or truncated[:N]), for
    `engine`'s tokenizer (DraftModelError: another family)."""
    say = logging.getLogger("jumpahead.engine").info
    return DraftModel.load(draft_model_folder(spec, progress=say), engine.tokenizer, progress=say)


def attach_draft(engine: Any, draft: DraftModel) -> DraftModel:
    """Method "draft"'s state on `engine`: `draft`, refused where its tokenizer is another family."""
    draft.check_compatible(engine.tokenizer)
    return draft


def main(argv: list[str] | None = None) -> int:
    """`python -m jumpahead.engine.methods.draft_model [--layers N]`: build the draft, print its path."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m jumpahead.engine.methods.draft_model", description=main.__doc__)
    p.add_argument("--layers", type=int, default=4, help="blocks of the default model to keep (default 4)")
    args = p.parse_args(argv)
    print(ensure_draft_model(args.layers, progress=lambda s: print(s, flush=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
