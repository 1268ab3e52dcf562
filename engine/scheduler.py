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
from collections import Counter, deque
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .model_runner import ModelRunner
from .row import Row

log = logging.getLogger("jumpahead.engine")


@dataclass
class SchedulerConfig:
    max_batch: int = 8
    prefill_chunk: int = 512  # tokens per prefill forward when nothing else runs
    prefill_chunk_busy: int = 128  # ... while other rows are decoding (bounds their stall)


class Scheduler:
    def __init__(self, runner: ModelRunner, config: SchedulerConfig) -> None:
        self.runner = runner
        self.config = config
        self.group = runner.new_cache()
        self.running: list[Row] = []
        self.waiting: deque[Row] = deque()
        self.inbox: queue.SimpleQueue[Row] = queue.SimpleQueue()
        self.counters: Counter[str] = Counter()

    # --- called from other threads ----------------------------------------------------
    def submit(self, row: Row) -> None:
        self.inbox.put(row)

    # --- engine thread -------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and self.inbox.empty()

    def step(self) -> bool:
        """Do one unit of work. Returns False when there was nothing to do."""
        while True:
            try:
                row = self.inbox.get_nowait()
            except queue.Empty:
                break
            self.waiting.append(row)
        self._reap()
        busy = False
        if self.waiting and len(self.running) < self.config.max_batch:
            self._prefill_chunk(self.waiting[0])
            busy = True
        if self.running:
            self._decode_round()
            busy = True
        return busy

    def fail_all(self, message: str) -> None:
        """After an engine error: end every row with an error and start clean."""
        for row in list(self.running) + list(self.waiting):
            row.finish("error", message)
        self.running.clear()
        self.waiting.clear()
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

    def _retire(self, indices: list[int]) -> None:
        self.group.remove_rows(indices)
        drop = set(indices)
        self.running = [r for i, r in enumerate(self.running) if i not in drop]

    def _prefill_chunk(self, row: Row) -> None:
        t0 = time.perf_counter()
        if row.prefill_cache is None:
            row.timings.queued_s = t0 - row.submitted_at
            row.prefill_cache = self.runner.new_cache()
            row.prefill_cache.ends = [0]
        size = self.config.prefill_chunk_busy if self.running else self.config.prefill_chunk
        chunk = row.prompt[row.prefilled : row.prefilled + size]
        final = row.prefilled + len(chunk) == len(row.prompt)
        logits = self.runner.forward([chunk], row.prefill_cache, slice(-1, None) if final else None)
        row.prefill_cache.advance([len(chunk)])
        row.prefilled += len(chunk)
        self.counters["forwards"] += 1
        self.counters["prefill_tokens"] += len(chunk)
        if not final:
            mx.eval(row.prefill_cache.arrays())
            row.timings.prefill_s += time.perf_counter() - t0
            return
        token = self._choose([row], logits[:, 0, :])[0]
        row.timings.prefill_s += time.perf_counter() - t0
        self.waiting.popleft()
        row.commit([token], ["sampled"])
        self.counters["tokens_sampled"] += 1
        if row.finish_reason is None:
            self.group.append_rows(row.prefill_cache)
            self.running.append(row)
        row.prefill_cache = None

    def _decode_round(self) -> None:
        rows = self.running
        logits = self.runner.forward([[r.pending] for r in rows], self.group)[:, 0, :]
        chosen = self._choose(rows, logits)
        self.group.advance([1] * len(rows))
        self.counters["forwards"] += 1
        self.counters["rounds"] += 1
        self.counters["tokens_sampled"] += len(rows)
        done = []
        for i, (row, token) in enumerate(zip(rows, chosen)):
            row.timings.rounds += 1
            row.commit([token], ["sampled"])
            if row.finish_reason is not None:
                done.append(i)
        if done:
            self._retire(done)

    def _choose(self, rows: list[Row], logits: mx.array) -> list[int]:
        """Each row's token at its next position from logits [B, V]."""
        argmax = mx.argmax(logits, axis=-1)
        need = [i for i, r in enumerate(rows) if r.sampler.needs_logits]
        if not need:
            mx.eval(argmax)
            return argmax.tolist()
        host_logits = logits if len(need) == len(rows) else logits[mx.array(need)]
        mx.eval(argmax, host_logits)
        out = argmax.tolist()
        host = np.array(host_logits.astype(mx.float32), copy=False)
        for j, i in enumerate(need):
            out[i] = rows[i].sampler.pick(host[j], rows[i].position)
        return out
