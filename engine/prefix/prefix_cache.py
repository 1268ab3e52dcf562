"""Prefix reuse across requests: a radix tree over token ids whose nodes hold KV.

An agent resends its whole conversation every turn. Each node of the tree is one
segment of some earlier sequence (its edge label: token ids at absolute positions
[start, end)) and holds that segment's keys/values, in RAM (`kv`, one array
[layers, 2, kv_heads, n, head_dim]) and/or in a file of the SSD tier (`disk`). The KV
at position j depends only on tokens 0..j, so any request that shares the first m
tokens with a path of the tree can start from those m positions: a new row copies the
path's segments into its private prefill cache and prefills only the rest (always at
least one prompt token, so it has logits to sample from).

Entries are published from the tokens the model actually consumed: at the prompt
boundary (the row's prefill cache holds the whole prompt) and when a row leaves the
group (its slot holds prompt + output up to its end pointer: accepted and asserted
tokens included, rolled-back ones never). Publishing stores only the part the tree
does not have yet, as a new leaf; that leaf is also queued for the SSD tier.

Memory rules: a node's `kv` is always a fresh buffer (a stack/contiguous copy), never
a view of a row's cache or of a larger array, so an entry neither aliases a buffer a
running row still writes nor keeps a whole batch buffer alive; a hit is installed by
concatenating into new buffers, so a row never writes into an entry. RAM is bounded
by `ram_bytes` (least recently used nodes go first; a node that is also on disk keeps
its place in the tree as an SSD entry), disk by the store's cap.

Every mlx operation runs on the thread that calls `lookup`/`insert`/`poll` (the
engine thread); the SSD writer thread only reads evaluated buffers and queues the
finished files, which `poll` indexes.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import mlx.core as mx
import numpy as np

from ..kv.row_cache import STEP, DiskPiece, RowKVCache
from .ssd_cache import CorruptEntry, SsdFile, SsdStore

if TYPE_CHECKING:
    from ..schedule.row import Row

log = logging.getLogger("jumpahead.engine.cache")

# The companion name of exact snapshots (RowKVCache.row_states: recurrent state and
# sliding layers' windows): unlike a method's companion, a hit is cut back to the
# deepest one.
RECURRENT = "recurrent"


class CompanionHook(Protocol):
    """A method that keeps its own per-row state (a draft model's cache, an echo index)
    and wants it checkpointed beside the target's KV, so a hit restores both.

    `capture(row, length)` is called when the row's first `length` tokens are published;
    it returns arrays describing the method's state after exactly those tokens (real
    copies: they are kept and written to disk as they are), or None. On a hit of m
    tokens, `restore(row, state, length)` gets the deepest captured state with
    `length <= m`; the method catches up on tokens [length, m) itself.
    """

    name: str

    def capture(self, row: "Row", length: int) -> dict[str, mx.array] | None: ...

    def restore(self, row: "Row", state: dict[str, mx.array], length: int) -> None: ...


@dataclass
class Companion:
    length: int
    arrays: dict[str, mx.array] | None  # None: only in `file` (load it to use)
    file: SsdFile | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) if self.arrays else 0


class Node:
    __slots__ = ("label", "start", "parent", "children", "kv", "disk", "tick", "companions")

    def __init__(self, label: np.ndarray, start: int, parent: "Node | None") -> None:
        self.label = label  # int32 token ids at positions [start, start + len)
        self.start = start
        self.parent = parent  # None once detached (and for the root)
        self.children: dict[int, Node] = {}
        self.kv: mx.array | None = None  # [L, 2, H, len, D], a buffer of its own
        self.disk: tuple[SsdFile, int] | None = None  # (file, offset of label[0] in it)
        self.tick = 0
        self.companions: dict[str, Companion] = {}

    @property
    def end(self) -> int:
        return self.start + len(self.label)

    @property
    def ram_bytes(self) -> int:
        kv = self.kv.nbytes if self.kv is not None else 0
        return kv + sum(c.nbytes for c in self.companions.values())


@dataclass
class Hit:
    """The longest cached prefix of a request: `length` tokens, KV in `pieces`."""

    length: int = 0
    # covering [0, length): [L,2,H,n,D] arrays, or DiskPieces (read into the row at install)
    pieces: list[mx.array | DiskPiece] = field(default_factory=list)
    companions: dict[str, tuple[int, dict[str, mx.array]]] = field(default_factory=dict)
    ssd_tokens: int = 0  # of `length`, tokens whose KV was read from disk for this hit


def _fresh(x: mx.array) -> mx.array:
    """A copy of a (strided) slice in a buffer of its own."""
    y = mx.contiguous(x)
    mx.eval(y)
    return y


class PrefixCache:
    def __init__(
        self,
        ram_bytes: int,
        ssd: SsdStore | None = None,
        wake: Callable[[], None] | None = None,
        exact: bool = False,
        read_in_place: bool = True,
    ) -> None:
        self.ram_budget = int(ram_bytes)
        # A hit on a file not yet in RAM reads it straight into the row (ssd `read_kv_into`);
        # False promotes it to RAM first, as a hit on part of a file always does.
        self.read_in_place = read_in_place
        self.ssd = ssd
        self.root = Node(np.zeros(0, np.int32), 0, None)
        self.hooks: list[CompanionHook] = []
        # The model keeps recurrent state or sliding windows: a hit must end at one of
        # its snapshots.
        self.exact = exact
        self.counters: Counter[str] = Counter()
        self.ram_bytes = 0
        self.ssd_bytes = 0
        self.files: dict[Path, SsdFile] = {}
        self._ram_nodes: set[Node] = set()
        self._tick = 0
        self._lock = threading.RLock()
        self._done: list[SsdFile] = []  # written by the SSD worker, not yet indexed
        self._done_cv = threading.Condition()
        self._wake = wake or (lambda: None)
        if ssd is not None:
            self._index_disk()

    def register_companion(self, hook: CompanionHook) -> None:
        self.hooks.append(hook)

    # --- scheduler glue (engine thread) ------------------------------------------------
    def on_prefill_start(self, row: "Row") -> None:
        """Start `row` from the longest cached prefix of its prompt (fresh prefill cache)."""
        cache = row.prefill_cache
        hit = Hit()
        try:
            prompt = row.prompt
            self.counters["prompt_tokens"] += len(prompt)
            capacity = ((len(prompt) + STEP) // STEP) * STEP
            for _ in range(8):  # a file found bad while read in place is dropped: look again
                hit = self.lookup(prompt, limit=len(prompt) - 1)
                if hit.length == 0:
                    return
                try:
                    self.install(hit, cache, capacity)
                    break
                except CorruptEntry:
                    self._not_a_hit(hit)
                    hit = Hit()
                    self._reset(cache)
            else:
                return
            state = hit.companions.get(RECURRENT)
            if cache.snapshots:  # exact: the hit ends where this snapshot was taken
                if state is None or state[0] != hit.length:
                    raise ValueError(f"a hit of {hit.length} tokens without its snapshot")
                cache.set_row_states(state[1], capacity)
            row.prefilled = hit.length
            row.cached_tokens = hit.length
            for hook in self.hooks:
                state = hit.companions.get(hook.name)
                if state is not None:
                    hook.restore(row, state[1], state[0])
        except Exception:  # the cache is an optimization: fall back to a full prefill
            log.exception("prompt cache: lookup failed; prefilling from scratch")
            self._not_a_hit(hit)
            self._reset(cache)
            row.prefilled = row.cached_tokens = 0

    def _not_a_hit(self, hit: Hit) -> None:
        """Take back what `lookup` counted for a hit that was not installed."""
        if not hit.length:
            return
        with self._lock:
            self.counters["hits"] -= 1
            self.counters["hit_tokens"] -= hit.length
            if hit.ssd_tokens:
                self.counters["ssd_hits"] -= 1
                self.counters["ssd_hit_tokens"] -= hit.ssd_tokens
            self.counters["failed_hits"] += 1

    @staticmethod
    def _reset(cache: RowKVCache) -> None:
        fresh = type(cache)(cache.layout, cache.fmt)
        cache.__dict__.update({k: v for k, v in fresh.__dict__.items() if k != "key_widths"})
        cache.ends = [0]

    def on_prompt_done(self, row: "Row") -> None:
        """Publish the prompt once it is all in the row's prefill cache."""
        self._publish(row, row.prompt, row.prefill_cache, 0)

    def on_retire(self, row: "Row", cache: RowKVCache, index: int) -> None:
        """Publish what row `index` of `cache` consumed, before its slot is removed."""
        if row.finish_reason == "error":
            return
        n = cache.ends[index]
        tokens = list(row.prompt) + list(row.output)
        if n > len(tokens):  # a slot holding tokens we cannot name: never publish it
            log.warning("prompt cache: row end %d beyond its %d tokens; not published", n, len(tokens))
            return
        self._publish(row, tokens[:n], cache, index)

    def _publish(self, row: "Row", tokens: Sequence[int], cache: RowKVCache, index: int) -> None:
        try:
            companions = {}
            if cache.snapshots:  # the state after exactly these tokens (an exact snapshot)
                companions[RECURRENT] = cache.row_states(index)
            for hook in self.hooks:
                state = hook.capture(row, len(tokens))
                if state:
                    companions[hook.name] = state
            self.insert(tokens, cache, index, companions)
        except Exception:
            self.counters["publish_errors"] += 1
            log.exception("prompt cache: publish failed")

    # --- lookup ------------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int], limit: int | None = None) -> Hit:
        """The longest prefix of `tokens[:limit]` the cache holds, read from SSD if needed."""
        q = np.asarray(tokens[:limit] if limit is not None else tokens, dtype=np.int32)
        self.poll()
        with self._lock:
            self.counters["lookups"] += 1
            ssd_tokens = 0
            for _ in range(64):  # each retry dropped a bad file
                path, m = self._match(q)
                files = sorted({n.disk[0] for n, _ in path if n.kv is None}, key=lambda f: f.start)
                in_place = {f for f in files if self._in_place(f, path)}
                ok = True
                for f in files:
                    if f in in_place:  # read straight into the row's buffers at install
                        ssd_tokens += f.end - f.start
                        continue
                    loaded = self._promote(f)
                    if loaded < 0:
                        ok = False
                        break
                    ssd_tokens += loaded
                if ok:
                    break
            else:
                return Hit()
            if self.exact and m:
                m = self._exact_length(path, m)
                path = self._cut_path(path, m)
            if m == 0:
                return Hit()
            pieces = []
            companions: dict[str, tuple[int, dict[str, mx.array]]] = {}
            for node, k in path:
                if node.kv is None:  # a file read in place (`_in_place`)
                    pieces.append(self._disk_piece(node.disk[0]))
                    continue
                pieces.append(node.kv if k == len(node.label) else node.kv[:, :, :, :k, :])
                if k == len(node.label):
                    for name, c in node.companions.items():
                        if c.arrays is not None and c.length <= m:
                            companions[name] = (c.length, c.arrays)
            self._touch(path[-1][0])
            self.counters["hits"] += 1
            self.counters["hit_tokens"] += m
            ssd_tokens = min(ssd_tokens, m)
            if ssd_tokens:
                self.counters["ssd_hits"] += 1
                self.counters["ssd_hit_tokens"] += ssd_tokens
            self._evict_ram()  # promotions may have pushed RAM over budget; pieces stay alive
            return Hit(m, pieces, companions, ssd_tokens)

    def _in_place(self, f: SsdFile, path: list[tuple[Node, int]]) -> bool:
        """Whether a hit may read file f straight into the row's buffers instead of
        promoting it to RAM first: the hit uses all of f, through one node, and f holds
        plain KV (no snapshots: exact hits keep the promote path)."""
        if not self.read_in_place or self.exact or not self.ssd.readable_in_place(f):
            return False
        used = [(n, k) for n, k in path if n.kv is None and n.disk is not None and n.disk[0] is f]
        if len(used) != 1:
            return False
        n, k = used[0]
        return n.disk[1] == 0 and k == len(n.label) == f.end - f.start

    def _disk_piece(self, f: SsdFile) -> DiskPiece:
        L, _, H, n, D = f.kv_shape
        self.ssd.prefetch(f)  # the device reads while the row's buffers are made

        def read(dest) -> None:
            try:
                self.ssd.read_kv_into(f, dest)
            except CorruptEntry as exc:
                log.warning("prompt cache: skipping %s: %s (deleted)", f.name, exc)
                with self._lock:
                    self.counters["ssd_corrupt"] += 1
                    self._drop_file(f)
                raise

        return DiskPiece(L, n, H, D, mx.float32 if f.kv_dtype == "F32" else mx.float16, read)

    def install(self, hit: Hit, cache: RowKVCache, capacity: int) -> None:
        """Write the hit into `cache` (a single-row cache) as new buffers of `capacity`."""
        cache.install_segments(hit.pieces, hit.length, capacity)
        mx.eval(cache.arrays())

    def _exact_length(self, path: list[tuple[Node, int]], m: int) -> int:
        """The longest hit not past m that ends where an exact snapshot (recurrent
        state) was taken: such state exists only at the token count it was taken at."""
        best = 0
        for node, k in path:
            if k == len(node.label):
                c = node.companions.get(RECURRENT)
                if c is not None and c.arrays is not None and c.length == node.end and c.length <= m:
                    best = c.length
        return best

    @staticmethod
    def _cut_path(path: list[tuple[Node, int]], m: int) -> list[tuple[Node, int]]:
        out = []
        for node, k in path:
            if node.start >= m:
                break
            out.append((node, min(k, m - node.start)))
        return out

    def _match(self, q: np.ndarray) -> tuple[list[tuple[Node, int]], int]:
        """Walk the tree along q: [(node, tokens of its label matched)], total matched."""
        node, pos, path = self.root, 0, []
        while pos < len(q):
            child = node.children.get(int(q[pos]))
            if child is None or (child.kv is None and child.disk is None):
                break
            lab = child.label
            n = min(len(lab), len(q) - pos)
            eq = lab[:n] == q[pos : pos + n]
            k = n if bool(eq.all()) else int(np.argmin(eq))
            path.append((child, k))
            pos += k
            if k < len(lab):
                break
            node = child
        return path, pos

    # --- insert ------------------------------------------------------------------------
    def insert(
        self,
        tokens: Sequence[int],
        cache: RowKVCache,
        index: int,
        companions: dict[str, dict[str, mx.array]] | None = None,
    ) -> int:
        """Store the KV of `tokens` (positions [0, len) of row `index` of `cache`).

        Copies only the part the tree lacks. Returns the number of new tokens stored.
        """
        n = len(tokens)
        if n == 0:
            return 0
        q = np.asarray(tokens, dtype=np.int32)
        self.poll()
        with self._lock:
            path, m = self._match(q)
            parent = self.root
            if path:
                node, k = path[-1]
                parent = node if k == len(node.label) else self._split(node, k)
            target, kv = parent, None
            if m < n:
                kv = cache.segment(index, m, n)
                target = Node(q[m:n].copy(), m, parent)
                parent.children[int(q[m])] = target
                target.kv = kv
                self._ram_nodes.add(target)
                self.ram_bytes += kv.nbytes
                self.counters["published"] += 1
                self.counters["published_tokens"] += n - m
            stored: dict[str, tuple[int, dict[str, mx.array]]] = {}
            if target is not self.root:
                for name, arrays in (companions or {}).items():
                    old = target.companions.get(name)
                    self.ram_bytes -= old.nbytes if old else 0
                    c = Companion(n, dict(arrays))
                    target.companions[name] = c
                    self.ram_bytes += c.nbytes
                    self._ram_nodes.add(target)  # holds RAM now, so it can be evicted
                    stored[name] = (n, c.arrays)
            if target is not self.root:
                self._touch(target)
            if kv is not None and self.ssd is not None:
                self.ssd.submit(q, m, kv, stored, self._written)
            self._evict_ram()
            return n - m

    def _split(self, node: Node, k: int) -> Node:
        """Cut node's label at k; returns the new upper node [start, start + k)."""
        upper = Node(node.label[:k].copy(), node.start, node.parent)
        upper.tick = node.tick
        node.parent.children[int(node.label[0])] = upper
        node.label = node.label[k:].copy()
        node.start += k
        node.parent = upper
        upper.children[int(node.label[0])] = node
        if node.kv is not None:
            old = node.kv
            upper.kv = _fresh(old[:, :, :, :k, :])
            node.kv = _fresh(old[:, :, :, k:, :])
            self._ram_nodes.add(upper)
        if node.disk is not None:
            f, off = node.disk
            upper.disk = (f, off)
            node.disk = (f, off + k)
            f.nodes.add(upper)
        return upper

    def _touch(self, node: Node) -> None:
        """Mark node and its ancestors used now (ancestors are never older than descendants)."""
        self._tick += 1
        t = self._tick
        while node is not None and node is not self.root:
            node.tick = t
            if node.disk is not None:
                node.disk[0].tick = t
            node = node.parent

    # --- eviction ----------------------------------------------------------------------
    def _release_ram(self, node: Node) -> None:
        """Drop node's RAM copy (KV and companion states); the disk copy, if any, stays."""
        self.ram_bytes -= node.ram_bytes
        node.kv = None
        for name, c in list(node.companions.items()):
            if c.file is not None:
                c.arrays = None
            else:
                del node.companions[name]
        self._ram_nodes.discard(node)

    def _evict_ram(self) -> None:
        while self.ram_bytes > self.ram_budget and self._ram_nodes:
            victim = min(self._ram_nodes, key=lambda n: (n.tick, -n.start))
            self.counters["ram_evictions"] += 1
            if victim.disk is not None:
                self._release_ram(victim)
            else:
                self._drop_subtree(victim)

    def _drop_subtree(self, node: Node) -> None:
        """Remove node and everything below it (their KV can no longer be reached)."""
        if node.parent is None:
            return
        siblings = node.parent.children
        if siblings.get(int(node.label[0])) is node:
            del siblings[int(node.label[0])]
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self._release_ram(n)
            n.companions.clear()
            n.parent = None
            if n.disk is not None:
                f = n.disk[0]
                n.disk = None
                f.nodes.discard(n)
                if not f.nodes and f.path in self.files:
                    self._delete_file(f)

    def _delete_file(self, f: SsdFile) -> None:
        if self.files.pop(f.path, None) is not None:
            self.ssd_bytes -= f.nbytes
        self.ssd.delete(f)

    def _drop_file(self, f: SsdFile) -> None:
        """Forget a file (evicted or bad): nodes it alone backed leave the tree."""
        self._delete_file(f)
        for n in list(f.nodes):
            if n.disk is not None and n.disk[0] is f:
                n.disk = None
            for name, c in list(n.companions.items()):
                if c.file is f:
                    c.file = None
                    if c.arrays is None:
                        del n.companions[name]
            if n.kv is None:
                self._drop_subtree(n)
        f.nodes.clear()

    def _evict_ssd(self) -> None:
        cap = self.ssd.cap_bytes
        while self.ssd_bytes > cap and self.files:
            victim = min(self.files.values(), key=lambda f: (f.tick, -f.start))
            self.counters["ssd_evictions"] += 1
            self._drop_file(victim)

    # --- SSD tier ------------------------------------------------------------------------
    def _promote(self, f: SsdFile) -> int:
        """Load a file into RAM for the nodes it backs. Tokens loaded, or -1 if unusable."""
        try:
            kv, comps = self.ssd.load(f)
        except CorruptEntry as exc:
            log.warning("prompt cache: skipping %s: %s (deleted)", f.name, exc)
            self.counters["ssd_corrupt"] += 1
            self._drop_file(f)
            return -1
        loaded = 0
        whole = kv.shape[3]
        for n in list(f.nodes):
            if n.disk is None or n.disk[0] is not f:
                continue
            off, ln = n.disk[1], len(n.label)
            if n.kv is None:
                n.kv = kv if (off == 0 and ln == whole) else _fresh(kv[:, :, :, off : off + ln, :])
                self.ram_bytes += n.kv.nbytes
                self._ram_nodes.add(n)
                loaded += ln
            for name, c in n.companions.items():
                if c.file is f and c.arrays is None and name in comps:
                    c.arrays = comps[name]
                    self.ram_bytes += c.nbytes
        return loaded

    def _written(self, f: SsdFile) -> None:
        """SSD worker thread: a file is on disk; index it on the owner thread."""
        with self._done_cv:
            self._done.append(f)
        self._wake()

    def poll(self) -> None:
        """Index files the writer finished (call on the thread that owns mlx work)."""
        if not self._done:
            return
        with self._done_cv:
            done, self._done = self._done, []
        with self._lock:
            for f in done:
                if f.path in self.files:
                    continue  # already indexed (the same segment was written before)
                self.files[f.path] = f
                self.ssd_bytes += f.nbytes
                if not self._attach(f) or not f.nodes:
                    self._delete_file(f)  # its prefix left the tree, or another file has it
                    continue
                self._tick += 1
                f.tick = self._tick
            self._evict_ssd()
        with self._done_cv:
            self._done_cv.notify_all()

    def _attach(self, f: SsdFile) -> bool:
        """Hang file f's segment [start, end) on the tree along its prefix tokens.

        False when positions before its start are not in the tree (an orphan).
        """
        tokens, start, end = f.tokens, f.start, f.end
        node, pos = self.root, 0
        last = None
        while pos < end:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                if pos < start:
                    return False
                child = Node(tokens[pos:end].copy(), pos, node)
                node.children[int(tokens[pos])] = child
                child.tick = f.tick
            lab = child.label
            n = min(len(lab), end - pos)
            eq = lab[:n] == tokens[pos : pos + n]
            k = n if bool(eq.all()) else int(np.argmin(eq))
            if pos < start < pos + k:
                k = start - pos
            if k < len(lab):
                child = self._split(child, k)
            if pos >= start and child.disk is None:
                child.disk = (f, pos - start)
                f.nodes.add(child)
            node, pos, last = child, pos + k, child
        if last is not None and last.disk is not None and last.disk[0] is f:
            for name, info in f.companions.items():
                c = last.companions.get(name)
                if c is None:
                    last.companions[name] = Companion(int(info["length"]), None, f)
                elif c.file is None:
                    c.file = f
        f.tokens = None  # the tree holds the labels now
        return True

    def _index_disk(self) -> None:
        """At start: rebuild the tree from the files on disk (no KV is read)."""
        files = self.ssd.scan()  # oldest first
        for rank, f in enumerate(files):
            f.tick = rank
        self._tick = len(files)
        with self._lock:
            for f in sorted(files, key=lambda f: f.start):  # prefixes before their extensions
                self.files[f.path] = f
                self.ssd_bytes += f.nbytes
                if not self._attach(f):
                    log.warning("prompt cache: skipping %s: the prefix it extends is not on disk (deleted)", f.name)
                    self.counters["ssd_orphans"] += 1
                    self._delete_file(f)
                elif not f.nodes:
                    self._delete_file(f)
            self._evict_ssd()

    # --- management ----------------------------------------------------------------------
    def flush(self, timeout: float | None = None, inline: bool = False) -> bool:
        """Wait until queued SSD writes are on disk and indexed.

        `inline=True` indexes them on the calling thread (only when no engine thread
        runs); otherwise the owner thread's `poll` does it.
        """
        if self.ssd is None:
            return True
        ok = self.ssd.flush(timeout)
        if inline:
            self.poll()
            return ok
        with self._done_cv:
            self._wake()
            return self._done_cv.wait_for(lambda: not self._done, timeout) and ok

    def close(self) -> None:
        if self.ssd is not None:
            self.ssd.close()

    def clear_ram(self) -> None:
        """Drop every RAM copy (disk-backed nodes stay as SSD entries)."""
        with self._lock:
            for n in list(self._ram_nodes):
                if n.disk is not None:
                    self._release_ram(n)
                else:
                    self._drop_subtree(n)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            nodes, stack = 0, list(self.root.children.values())
            while stack:
                n = stack.pop()
                nodes += 1
                stack.extend(n.children.values())
            c = self.counters
            out: dict[str, Any] = {
                "lookups": c["lookups"],
                "hits": c["hits"],
                "hit_rate": round(c["hits"] / c["lookups"], 4) if c["lookups"] else 0.0,
                "prompt_tokens": c["prompt_tokens"],
                "cached_tokens": c["hit_tokens"],
                "token_hit_rate": round(c["hit_tokens"] / c["prompt_tokens"], 4) if c["prompt_tokens"] else 0.0,
                "ssd_hits": c["ssd_hits"],
                "ssd_hit_tokens": c["ssd_hit_tokens"],
                "published": c["published"],
                "published_tokens": c["published_tokens"],
                "publish_errors": c["publish_errors"],  # logged; nonzero is a bug
                "nodes": nodes,
                "ram_bytes": self.ram_bytes,
                "ram_budget_bytes": self.ram_budget,
                "ram_evictions": c["ram_evictions"],
                "ssd_enabled": self.ssd is not None,
            }
            if self.ssd is not None:
                out.update({
                    "ssd_dir": str(self.ssd.dir),
                    "ssd_files": len(self.files),
                    "ssd_bytes": self.ssd_bytes,
                    "ssd_cap_bytes": self.ssd.cap_bytes,
                    "ssd_pending_bytes": self.ssd.pending_bytes,
                    "ssd_evictions": c["ssd_evictions"],
                    "ssd_corrupt": c["ssd_corrupt"],
                    "ssd_orphans": c["ssd_orphans"],
                    **self.ssd.counters,
                })
            return out
