"""The engine loop's unit of work: one prefill chunk and/or one decode Round.

Rows in `running` own consecutive batch indices of the group's RowKVCache (index i
is running[i]). A new row prefills into a private single-row cache in chunks, one
chunk per step, so running rows wait at most one chunk; when its prompt is in, it
samples its first token and joins the group. Rows retire between rounds.
"""

from __future__ import annotations

import logging
import queue
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from ..kv.model_runner import ModelRunner
from ..methods.proposal import ObservesHidden, ProposalStats, ReleasesRow, unwrapped
from .arbitration import Arbiter
from .row import Row
from .verification import RowOutcome, verify_round
from .width_policy import WidthPolicy

if TYPE_CHECKING:
    from ..kv.row_cache import RowKVCache

log = logging.getLogger("jumpahead.engine")

OBJECTIVES = ("latency", "throughput")


class RowHooks(Protocol):
    """What the scheduler tells a cache of rows' KV about its rows. The prefix cache
    (engine/prefix/prefix_cache.py) implements it; the scheduler room sits below the prefix
    room and imports nothing of it (tests/test_layering.py)."""

    def poll(self) -> None: ...  # index finished background work (mlx work stays on this thread)
    def on_prefill_start(self, row: Row) -> None: ...  # before a row's prefill: install a cached prefix
    def on_prompt_done(self, row: Row) -> None: ...  # the row's prompt is in its cache and its first token out
    def on_retire(self, row: Row, cache: RowKVCache, index: int) -> None: ...  # before the row's slot goes


@dataclass
class SchedulerConfig:
    max_batch: int = 8
    prefill_chunk: int = 512  # tokens per prefill forward when nothing else runs
    prefill_chunk_busy: int = 128  # ... while other rows are decoding (bounds their stall)
    max_proposal: int = 16  # most verified proposal tokens one row carries into a round
    max_asserted: int = 64  # most asserted tokens (strict, jump, scripted) in one round
    cost_aware: bool = True  # cap verified proposals by expected gain (engine/schedule/width_policy.py)
    # A row whose copy (echo) is expected to land at least what a grouped drafter's
    # draft could is not drafted for that round (`_offer_round_groups`): on copy-heavy
    # agent turns the drafter's chain was paid and then set aside. Off: the ablation.
    compose_copies: bool = True
    # Queue each plain greedy round before reading the last one (mlx-lm's generate_step
    # does). None = on a GPU only: on this 2-core CPU the overlap thread competes with
    # the compute threads, and unpipelined rounds measured 2% faster at B=1 and 10% at
    # B=4 (BENCHMARKS.md).
    pipeline_greedy: bool | None = None
    # What an accepted verified token is worth (engine/schedule/width_policy.py).
    # "throughput" (default): a round sooner for its row while requests wait for a
    # slot (the slot goes to them), and a whole round for the row the batch waits on
    # last (by forecast: engine/schedule/forecast.py); otherwise finishing sooner only makes
    # the remaining rounds one row smaller, which on a compute-bound CPU never pays
    # for verifying, so rows with nothing to propose do not pay for their
    # neighbours' proposals.
    # "latency": always a round sooner for its row, so every row's proposals are
    # sized for that row's own speed (its neighbours pay a few percent).
    objective: str = "throughput"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")


def _release(row: Row) -> None:
    """The row leaves: proposers that keep per-row state in a group of their own (a
    draft model's batched cache, engine/methods/draft_model.py DraftModelGroup) free its slot there."""
    for proposer in map(unwrapped, row.proposers):
        if isinstance(proposer, ReleasesRow):
            proposer.release_row()


class Scheduler:
    def __init__(self, runner: ModelRunner, config: SchedulerConfig) -> None:
        self.runner = runner
        self.config = config
        self.group = runner.new_cache()
        # why rows are served one at a time after a batched round failed (None: they are not)
        self.one_row_reason: str | None = None
        self.running: list[Row] = []
        self.waiting: deque[Row] = deque()
        self.inbox: queue.SimpleQueue[Row] = queue.SimpleQueue()
        self.counters: Counter[str] = Counter()
        self.totals = ProposalStats()  # per-method verified telemetry over every row (/metrics "methods")
        self.prefix_cache: RowHooks | None = None  # set by the Engine (engine/prefix/prefix_cache.py)
        self._ahead: tuple[list[Row], mx.array] | None = None  # queued greedy round
        self.width_policy = WidthPolicy()
        self.arbiter = Arbiter(self)  # which proposal each row carries (engine/schedule/arbitration.py)
        pipeline = config.pipeline_greedy
        self.pipeline = mx.default_device() == mx.gpu if pipeline is None else pipeline
        # A queued round advances recurrent state past the rows' ends; only attention
        # can drop it by pointer.
        self.pipeline = self.pipeline and not runner.recurrent

    # --- called from other threads ----------------------------------------------------
    def submit(self, row: Row) -> None:
        self.inbox.put(row)

    # --- engine thread -------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and self.inbox.empty()

    def step(self) -> bool:
        """Do one unit of work. Returns False when there was nothing to do."""
        if self.prefix_cache is not None:
            self.prefix_cache.poll()  # index finished SSD writes (mlx work stays on this thread)
        while True:
            try:
                row = self.inbox.get_nowait()
            except queue.Empty:
                break
            self.waiting.append(row)
        self._reap()
        busy = False
        if self.waiting and len(self.running) < self.config.max_batch:
            row = self.waiting[0]
            try:
                self._prefill_chunk(row)
            except Exception as exc:  # a row's prefill runs in its own cache: it fails alone
                if row in self.running:  # it had joined the group: the group's state is in question
                    raise
                log.error("prefill failed:\n%s", traceback.format_exc())
                self._fail_waiting(row, f"engine error: {type(exc).__name__}: {exc}")
            busy = True
        if self.running:
            try:
                self._decode_round()
            except Exception as exc:
                log.error("decoding round failed:\n%s", traceback.format_exc())
                self._round_failed(exc)
            busy = True
        return busy

    def _round_failed(self, exc: Exception) -> None:
        """A decoding round raised. One row: that row ends with the error. Several: the
        load-time check (engine/kv/model_check.py) ran this model's rows together, so a
        batched round failing anyway would fail every later batch too; the engine serves
        one row at a time from here on and the rows go back to the queue with their
        output kept (`_requeue`), so the row at fault fails alone and the others go on.
        Waiting rows are untouched either way."""
        rows, self.running = self.running, []
        self._ahead = None
        self.group = self.runner.new_cache()
        message = f"engine error: {type(exc).__name__}: {exc}"
        if len(rows) > 1 and self.config.max_batch > 1:
            self.config.max_batch = 1
            self.one_row_reason = (f"a round of {len(rows)} rows failed ({type(exc).__name__}: "
                                   f"{str(exc)[:200]}): rows are served one at a time")
            log.error("%s", self.one_row_reason)
        if len(rows) > 1:
            for row in reversed(rows):
                self._requeue(row)
            return
        for row in rows:
            self._fail_waiting(row, message)

    def _requeue(self, row: Row) -> None:
        """Put a running row back at the front of the queue to be prefilled again from its
        prompt and committed output (Row.resume). Proposers that keep state in a group
        of their own (draft model, drafter, MTP) leave it; the row goes on without them,
        which decodes the same tokens."""
        try:
            _release(row)
        except Exception:  # noqa: BLE001
            log.exception("releasing a row's proposer state failed")
        row.proposers = [p for p in row.proposers if not isinstance(unwrapped(p), ReleasesRow)]
        row.cut_by = None
        row.hidden = None
        row.prefill_cache = None
        row.prefilled = 0
        row.resume = True
        self.waiting.appendleft(row)
        self.counters["rows_requeued"] += 1

    def _fail_waiting(self, row: Row, message: str) -> None:
        """End one waiting row with an error; the group and the other rows are untouched."""
        if row in self.waiting:
            self.waiting.remove(row)
        row.prefill_cache = None
        if row.finish_reason is None:
            row.finish("error", message)
        try:
            _release(row)
        except Exception:  # noqa: BLE001
            log.exception("releasing a row's proposer state failed")
        self.counters["errors"] += 1

    def fail_all(self, message: str) -> None:
        """After an engine error: end every row with an error and start clean."""
        for row in list(self.running) + list(self.waiting):
            row.finish("error", message)
            try:
                _release(row)
            except Exception:  # a group left inconsistent by the error resets itself when next used
                log.exception("releasing a row's proposer state failed")
        self.running.clear()
        self.waiting.clear()
        self._ahead = None
        self.group = self.runner.new_cache()
        self.counters["errors"] += 1

    # --- internals ---------------------------------------------------------------------
    def _reap(self) -> None:
        """Drop cancelled rows (their consumer went away) from the queue and group."""
        for row in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(row)
            row.finish("cancelled")
            self.counters["cancelled"] += 1
        gone = [i for i, r in enumerate(self.running) if r.cancelled]
        if gone:
            for i in gone:
                self.running[i].finish("cancelled")
                self.counters["cancelled"] += 1
            self._retire(gone)

    def _account(self, row: Row) -> None:
        """Add a finished row's telemetry to the aggregate counters (/metrics)."""
        c = self.counters
        c["rows_finished"] += 1
        for kind, n in row.stats.by_kind.items():
            c[f"tokens_{kind}"] += n
        c["propose_us"] += int(row.stats.propose_s * 1e6)

    def _retire(self, indices: list[int]) -> None:
        for i in indices:
            self._account(self.running[i])
        if self.prefix_cache is not None:  # publish what each row consumed before its slot goes
            for i in indices:
                self.prefix_cache.on_retire(self.running[i], self.group, i)
        for i in indices:  # after the publish: a draft model's state is captured beside the target's
            _release(self.running[i])
        self.group.remove_rows(indices)
        drop = set(indices)
        self.running = [r for i, r in enumerate(self.running) if i not in drop]

    def _prefill_chunk(self, row: Row) -> None:
        t0 = time.perf_counter()
        if row.resume:
            self._resume_chunk(row)
            return
        if row.prefill_cache is None:
            row.timings.queued_s = t0 - row.submitted_at
            row.prefill_cache = self.runner.new_cache()
            row.prefill_cache.ends = [0]
            if self.prefix_cache is not None:  # start from the longest cached prefix
                self.prefix_cache.on_prefill_start(row)
        size = self.config.prefill_chunk_busy if self.running else self.config.prefill_chunk
        chunk = row.prompt[row.prefilled : row.prefilled + size]
        final = row.prefilled + len(chunk) == len(row.prompt)
        logits = self.runner.forward([chunk], row.prefill_cache, slice(-1, None) if final else None)
        self._observe_hidden(row, 0, row.prefilled, len(chunk))
        row.prefill_cache.advance([len(chunk)])
        row.prefilled += len(chunk)
        self.counters["forwards"] += 1
        self.counters["prefill_tokens"] += len(chunk)
        if not final:
            mx.eval(row.prefill_cache.arrays())
            row.timings.prefill_s += time.perf_counter() - t0
            return
        if self.runner.keep_hidden:
            row.hidden = self.runner.last_hidden[0, -1]
        token, kind, logprob = self._pick_first(row, logits[:, 0, :])
        row.timings.prefill_s += time.perf_counter() - t0
        self.waiting.popleft()
        row.commit([token], [kind], logprobs=None if row.req.logprobs is None else [logprob])
        if self.prefix_cache is not None:  # publish the prompt (after the first token is out)
            self.prefix_cache.on_prompt_done(row)
        if row.finish_reason is None:
            self.group.append_rows(row.prefill_cache)
            self.running.append(row)
        else:
            self._account(row)
            _release(row)
        row.prefill_cache = None

    def _resume_chunk(self, row: Row) -> None:
        """One chunk of a requeued row's cache rebuilt (`_requeue`): its prompt and every
        committed token but `pending`; then it joins the group with `pending` as its
        next input, as after a round."""
        tokens = row.prompt + row.output[:-1]
        if row.prefill_cache is None:
            row.prefill_cache = self.runner.new_cache()
            row.prefill_cache.ends = [0]
        size = self.config.prefill_chunk_busy if self.running else self.config.prefill_chunk
        chunk = tokens[row.prefilled : row.prefilled + size]
        self.runner.forward([chunk], row.prefill_cache, None)
        row.prefill_cache.advance([len(chunk)])
        row.prefilled += len(chunk)
        mx.eval(row.prefill_cache.arrays())
        self.counters["forwards"] += 1
        if row.prefilled < len(tokens):
            return
        self.waiting.popleft()
        row.resume = False
        self.group.append_rows(row.prefill_cache)
        row.prefill_cache = None
        self.running.append(row)

    def _greedy_round(self) -> bool:
        """Plain greedy decoding, pipelined the way mlx-lm's generate_step is: the next
        round's forward is built from this round's lazy argmax and queued before this
        round's tokens are read, so graph building and host work overlap the compute.
        If the rows change (a row finishes, joins or is cancelled) the queued round is
        dropped: its cache writes lie past the rows' ends, which are masked and
        overwritten. Returns False when the rows need the general path."""
        rows = self.running
        if not self.pipeline or not all(
            not r.proposers and r.constraint is None and not r.sampler.needs_logits and r.req.logprobs is None
            for r in rows
        ):
            self._ahead = None
            return False
        ahead = self._ahead
        if ahead is not None and len(ahead[0]) == len(rows) and all(a is b for a, b in zip(ahead[0], rows)):
            current = ahead[1]
            self.counters["pipelined_queued_used"] += 1  # the round queued last time is this one
        else:
            logits = self.runner.forward([[r.pending] for r in rows], self.group)
            current = mx.argmax(logits[:, -1, :], axis=-1)
            mx.async_eval(current)
        ends = self.group.ends
        logits = self.runner.forward(current[:, None], self.group, starts=[e + 1 for e in ends])
        upcoming = mx.argmax(logits[:, -1, :], axis=-1)
        mx.async_eval(upcoming)
        chosen = current.tolist()
        self.group.advance([1] * len(rows))
        self.counters["forwards"] += 1
        self.counters["rounds"] += 1
        self.counters["round_width_sum"] += 1
        self.counters["pipelined_rounds"] += 1
        done = []
        for i, (row, tok) in enumerate(zip(rows, chosen)):
            row.timings.rounds += 1
            row.stats.rounds += 1
            row.stats.forwards += 1
            row.sampler.observe(tok)
            row.commit([tok], ["sampled"])
            if row.finish_reason is not None:
                done.append(i)
        self._ahead = (list(rows), upcoming)
        if done:
            self._ahead = None
            self._retire(done)
        return True

    def _decode_round(self) -> None:
        if self._greedy_round():
            return
        rows = self.running
        props = self.arbiter.round(rows)  # schedule: each row's carried proposal
        t0 = time.perf_counter()  # the width policy fits forward cost, not proposing time
        inputs = [[r.pending] + (p.tokens if p else []) for r, p in zip(rows, props)]
        width = max(len(x) for x in inputs)
        # Logit positions per row: verified proposals need one at every input; asserted
        # ones only after the last; an asserted run cut here needs none (it continues
        # next round). A round of cut runs only skips the vocabulary projection.
        n_logits = [
            0 if p is not None and p.asserted and p.cut else len(x) if p is not None and not p.asserted else 1
            for p, x in zip(props, inputs)
        ]
        checkpoint = self.group.states()  # recurrent checkpoint (free: arrays are values)
        logits, offsets = self.runner.forward_ragged(inputs, self.group, n_logits)
        if logits is None:
            mx.eval(self.group.arrays())
            self.counters["head_skipped_rounds"] += 1
        where = list(zip(offsets, n_logits))
        picks = verify_round(rows, props, logits, where, self.counters)
        if self.runner.keep_hidden:
            self._keep_hidden(rows, where, picks)
        counts = []
        done = []
        firsts = [r.position - 1 for r in rows]  # each row's pending token: its first input's position
        for i, (row, prop, outcome) in enumerate(zip(rows, props, picks)):
            tokens, consumed, accepted = outcome.tokens, outcome.consumed, outcome.accepted
            row.timings.rounds += 1
            row.stats.rounds += 1
            row.stats.forwards += 1
            before = len(row.output)
            # the verified method noted per method (Row.commit: before the final chunk's usage.fill)
            method = None if prop is None or prop.asserted else \
                prop.proposer.name
            row.commit(tokens, outcome.kinds, accepted, outcome.sources, outcome.logprobs,
                       proposed=len(prop.tokens) if prop else 0,
                       method=method, totals=self.totals)
            taken = len(row.output) - before
            if taken < len(tokens):
                # EOS or a stop string inside the span: the tokens after it never
                # happened. The cache keeps only the inputs before the last taken
                # token; Row.commit counts cut-off accepted tokens as rejected.
                consumed = min(consumed, taken)
                self.counters["verified_accepted"] -= max(0, accepted - taken)
            counts.append(consumed)
            if row.finish_reason is not None:
                done.append(i)
            # every consumed input, a finishing row's too (its MTP state goes to the prefix
            # cache at retire: engine/methods/mtp_companion.py)
            self._observe_hidden(row, i, firsts[i], consumed)
        if self.runner.replay(self.group, inputs, counts, checkpoint):
            self.counters["replays"] += 1
        self.group.advance(counts)
        self.counters["forwards"] += 1
        self.counters["rounds"] += 1
        self.counters["round_width_sum"] += width
        round_tokens = sum(len(x) for x in inputs)
        self.counters["round_tokens_sum"] += round_tokens
        self.width_policy.observe_round(round_tokens, width, time.perf_counter() - t0)
        if done:
            self._retire(done)

    def _observe_hidden(self, row: Row, b: int, position: int, count: int) -> None:
        """Hand the target's hidden states of the `count` inputs row `b` of the last
        forward consumed (from absolute `position`) to the row's proposers that keep a
        state of their own over them (engine/methods/mtp.py MtpProposer). Every consumed input
        is covered, proposal or not, so such a proposer never misses a committed
        position: the smallest way to give it the target's states of accepted tokens."""
        hidden = self.runner.row_hidden
        if not self.runner.keep_all_hidden or hidden is None or count <= 0:
            return
        for proposer in map(unwrapped, row.proposers):
            if isinstance(proposer, ObservesHidden):
                proposer.observe_hidden(position, hidden[b][:count])

    def _keep_hidden(self, rows: list[Row], where: list[tuple[int, int]], picks: list[RowOutcome]) -> None:
        """Each row's hidden state at the input whose logits chose its new pending token
        (the last one it consumed); None where it got no logits (an asserted run cut)."""
        hidden = self.runner.last_hidden
        for row, (first, count), pick in zip(rows, where, picks):
            consumed = pick.consumed
            row.hidden = None if count == 0 or hidden is None else hidden[first + (consumed - 1 if count > 1 else 0)]

    def _pick_first(self, row: Row, logits: mx.array) -> tuple[int, str, object]:
        """The first token after the prompt, from logits [1, V], its kind and its
        TokenLogprob (None: not asked, or asserted).

        A row whose proposer asserts from the very start (script mode, a forced tool
        call) takes that token instead of sampling; verified proposals start next round.
        """
        if row.proposers:
            prop = self.arbiter.propose(row, asserted_only=True)
            if prop is not None and prop.tokens:
                tok = prop.tokens[0]
                row.sampler.observe(tok)
                if row.constraint is not None:
                    row.constraint.accept(tok)
                return tok, prop.kind, None
        outcome = verify_round([row], [None], logits, [(0, 1)], self.counters)[0]
        return outcome.tokens[0], "sampled", outcome.logprobs[0] if outcome.logprobs else None
