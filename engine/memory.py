"""What the engine holds right now, for leak checks (disconnect storms, long load runs).

Counted from the live objects rather than from counters, so a leak shows up even where
the bookkeeping is wrong: rows still reachable after they finished, batch slots of
rows that left, prefix-cache RAM that the byte counter and the tree disagree on, nodes
that left the tree but still hold KV. The prefix cache pins nothing (a hit is copied
into the row's own buffers), so a leaked pin would show up as a leaked row or an
unaccounted node here.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import weakref
from typing import TYPE_CHECKING, Any, Iterator

import mlx.core as mx

log = logging.getLogger("jumpahead.engine")

if TYPE_CHECKING:
    from .engine import Engine
    from .prefix.prefix_cache import PrefixCache


class RowRegistry:
    """Every Row the engine made that is still reachable (weak references only)."""

    def __init__(self) -> None:
        self._rows: dict[int, weakref.ref] = {}  # rows are dataclasses (unhashable): keyed by id

    def add(self, row: Any) -> None:
        key = id(row)
        self._rows[key] = weakref.ref(row, lambda _, key=key: self._rows.pop(key, None))

    def _live(self) -> list[Any]:
        return [r for r in (ref() for ref in list(self._rows.values())) if r is not None]

    def alive(self) -> int:
        return len(self._live())

    def unfinished(self) -> int:
        return sum(1 for r in self._live() if getattr(r, "finish_reason", None) is None)


def rss_bytes() -> int | None:
    """This process's resident set size (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def prefix_cache_audit(cache: "PrefixCache") -> dict[str, Any]:
    """The cache's RAM recounted from its tree against its byte counter."""
    with cache._lock:
        recounted, in_tree, stack = 0, set(), list(cache.root.children.values())
        while stack:
            node = stack.pop()
            in_tree.add(node)
            recounted += node.ram_bytes
            stack.extend(node.children.values())
        holding = {n for n in cache._ram_nodes if n.ram_bytes}
        return {
            "ram_bytes": cache.ram_bytes,
            "ram_bytes_recounted": recounted,
            "ram_budget_bytes": cache.ram_budget,
            "ram_nodes": len(cache._ram_nodes),
            "detached_ram_nodes": len(holding - in_tree),  # hold KV, but no lookup can reach them
            "consistent": recounted == cache.ram_bytes and not (holding - in_tree),
        }


def engine_memory(engine: "Engine", collect: bool = False) -> dict[str, Any]:
    """Rows alive, batch slots, prefix-cache accounting, MLX and process memory.

    `collect` runs the garbage collector first, so only rows something still
    references are counted (a finished row in a reference cycle is not a leak)."""
    if collect:
        gc.collect()
    s = engine.scheduler
    group = s.group
    out: dict[str, Any] = {
        "rows_running": len(s.running),
        "rows_waiting": len(s.waiting) + s.inbox.qsize(),
        "rows_alive": engine.rows.alive(),
        "rows_alive_unfinished": engine.rows.unfinished(),
        "group_rows": group.size,
        "group_kv_bytes": sum(a.nbytes for a in group.arrays()),
        "mlx_active_bytes": mx.get_active_memory(),
        "mlx_cache_bytes": mx.get_cache_memory(),
        # freed buffers MLX may keep (size_buffer_cache); 0: its own default
        "mlx_cache_limit_bytes": buffer_cache_limit(),
        "mlx_peak_bytes": mx.get_peak_memory(),
        "rss_bytes": rss_bytes(),
    }
    if engine.prefix_cache is not None:
        out["prefix_cache"] = prefix_cache_audit(engine.prefix_cache)
    return out


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def return_freed_memory_to_os(threshold: int = 1 << 20) -> bool:
    """Serve every allocation of `threshold` bytes or more with its own mmap, so that
    freeing it gives the memory back to the system.

    glibc serves blocks under its mmap threshold from heaps it rarely returns, and
    raises that threshold (up to 32 MB) each time a large mmapped block is freed. KV
    buffers are a few MB and are freed and reallocated as rows join and leave, so under
    load half a gigabyte of freed KV stayed resident (bench load: RSS peak 1818 MB with
    the default, 1542 MB with a fixed 1 MB threshold, throughput unchanged). A fixed
    threshold also turns the dynamic raising off. A user's MALLOC_MMAP_THRESHOLD_ wins;
    on other C libraries this does nothing (returns False)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


CACHE_ENV = "JUMPAHEAD_MLX_CACHE_MB"
CACHE_MAX = 1 << 30
_cache_limit: list[int] = []
MLX_DEFAULT_CACHE: list[int] = []  # MLX's limit before size_buffer_cache raised it


def size_buffer_cache() -> int:
    """Let MLX keep up to min(1 GiB, RAM / 16) of freed buffers for reuse, on the CPU.

    MLX's CPU allocator keeps only 32 MiB of freed buffers by default; a prefill
    chunk's transients are larger (the scores of one layer of a 512-token chunk at
    2k context are 38 MB, the MLP's 9 MB), so each layer's buffers were fresh
    allocations: with the 1 MB mmap threshold above, new pages faulted in and zeroed
    every layer. Measured (BENCHMARKS.md, issue 42): attention over a 2k-context chunk
    58 ms a layer with 32 MiB, 32 ms with the limit raised; prefill of 2k tokens 16%
    faster. The cache is bounded, so RSS is too (`bench load` allows for it).
    `JUMPAHEAD_MLX_CACHE_MB` sets it (0: MLX's default). Returns the limit in bytes."""
    if _cache_limit:
        return _cache_limit[0]
    raw = os.environ.get(CACHE_ENV)
    limit = None
    if raw is not None and raw.strip():
        try:
            limit = max(0, int(float(raw) * (1 << 20)))
        except ValueError:
            log.warning("%s=%r is not a number of MiB: sized from RAM instead", CACHE_ENV, raw)
    if limit is None:
        if mx.default_device() != mx.cpu:  # Metal/CUDA size their own caches
            limit = 0
        else:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            limit = min(CACHE_MAX, ram // 16)
    if limit > 0:
        MLX_DEFAULT_CACHE.append(mx.set_cache_limit(limit))
    _cache_limit.append(limit)
    return limit


def buffer_cache_limit() -> int:
    """The limit size_buffer_cache set (0: MLX's default kept)."""
    return _cache_limit[0] if _cache_limit else 0


@contextlib.contextmanager
def default_buffer_cache() -> Iterator[None]:
    """MLX's own buffer-cache limit while held (`bench roofline` times prefill both ways)."""
    if not MLX_DEFAULT_CACHE:
        yield
        return
    ours = mx.set_cache_limit(MLX_DEFAULT_CACHE[0])
    try:
        yield
    finally:
        mx.set_cache_limit(ours)

