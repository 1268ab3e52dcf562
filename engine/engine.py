"""The Engine: owns the model, runs the scheduler on a thread of its own, and
streams each request's tokens to asyncio consumers."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

import mlx.core as mx

from .machine.blas import blas_info
from .kv.cache_layout import single_row
from .logprobs import MAX_TOP_LOGPROBS
from .kv.kv_format import KVFormat
from .methods import registry as methods
from .methods.registry import describe as describe_methods
from .memory import RowRegistry, engine_memory, return_freed_memory_to_os, size_buffer_cache
from .kv.model_runner import ModelRunner
from .schedule.row import Row
from .sampler import RowSampler
from .schedule.scheduler import Scheduler, SchedulerConfig
from .machine.threads import join_fully
from .types import EngineError, GenerationRequest, ServedModel, TokenChunk

log = logging.getLogger("jumpahead.engine")


def _adapter_health(info: ServedModel) -> dict[str, Any] | None:
    """/health's account of a fused LoRA adapter (None: the base model)."""
    path = info.adapter
    if not path:
        return None
    return {"path": str(path), "name": path.rstrip("/").rsplit("/", 1)[-1], "digest": info.adapter_digest}


@dataclass
class EngineConfig:
    max_batch: int = 8
    prefill_chunk: int = 512
    prefill_chunk_busy: int = 128
    max_proposal: int = 16
    max_asserted: int = 64
    cost_aware: bool = True  # size verified proposals by expected gain (engine/schedule/width_policy.py)
    objective: str = "throughput"  # what an accepted token is worth: "throughput" | "latency" (SchedulerConfig)
    pipeline_greedy: bool | None = None  # None: on a GPU only (SchedulerConfig)
    default_methods: tuple[str, ...] = ()
    # Prefix cache (engine/prefix/prefix_cache.py, engine/prefix/ssd_cache.py): reuse the KV of the
    # longest cached prefix of each prompt, in RAM and in an SSD tier that survives
    # restarts. prefix_cache_dir None = $JUMPAHEAD_HOME (or ~/.cache/jumpahead)
    # /prompt-cache/<model id>.
    prefix_cache: bool = True
    prefix_cache_ram_bytes: int = 2 << 30
    prefix_cache_ssd: bool = True
    prefix_cache_dir: str | None = None
    prefix_cache_ssd_bytes: int = 16 << 30
    # What loads each stateful method's state, by method name (engine/methods/registry.py Lifecycle,
    # attach_methods): "draft": an mlx-lm folder or truncated[:N] (a draft model);
    # "drafter": auto|PATH (a trained drafter head, engine/methods/drafter.py); "mtp": auto|PATH
    # (the Hugging Face folder whose MTP weights serve, engine/methods/mtp.py; auto: the served
    # model's own folder). None/"none": nothing loaded.
    method_specs: dict[str, str | None] = field(default_factory=dict)
    # A loaded method whose own recorded measurement on the served model pays joins
    # default_methods (serve without --methods: engine/methods/registry.py join_defaults).
    measured_defaults: bool = False
    # Run one throwaway prefill chunk and round at startup (ModelRunner.warm_up), so
    # the first request (a restarted server's cache hit) pays no first-forward costs.
    warm_up: bool = True
    # Attention layers' keys and values quantized (engine/kv/kv_format.py); None: full precision.
    kv_format: KVFormat | None = None


class Engine:
    def __init__(self, model: Any, tokenizer: Any, info: ServedModel, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        if self.config.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        return_freed_memory_to_os()  # freed KV buffers leave RSS (engine/memory.py)
        size_buffer_cache()  # a forward's transients reused, not faulted in afresh (engine/memory.py)
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.runner = ModelRunner(model, self.config.kv_format)
        if self.runner.one_row and self.config.max_batch > 1:
            why = "chunked-attention layers" if single_row(self.runner.layout) else "the load-time check"
            log.warning("%s: %s: rows are served one at a time (max_batch 1)", self.runner.model_type, why)
            self.config = replace(self.config, max_batch=1)
        self.context_length = self.runner.context_length
        self.scheduler = Scheduler(
            self.runner,
            SchedulerConfig(
                max_batch=self.config.max_batch,
                prefill_chunk=self.config.prefill_chunk,
                prefill_chunk_busy=self.config.prefill_chunk_busy,
                max_proposal=self.config.max_proposal,
                max_asserted=self.config.max_asserted,
                cost_aware=self.config.cost_aware,
                pipeline_greedy=self.config.pipeline_greedy,
                objective=self.config.objective,
            ),
        )
        self._wake = threading.Event()
        self.rows = RowRegistry()
        self.prefix_cache = self._make_prefix_cache()
        self.scheduler.prefix_cache = self.prefix_cache
        # each stateful method's state and its prefix-cache companion, by method name
        # (engine/methods/registry.py Lifecycle; `attach`), and why a measured one drafts by default
        self.method_states: dict[str, Any] = {}
        self._companions: dict[str, Any] = {}
        self.method_defaults: dict[str, dict[str, Any]] = {}
        try:
            methods.attach_methods(self, self.config.method_specs, self.config.measured_defaults)
        except BaseException:
            if self.prefix_cache is not None:
                self.prefix_cache.close()
            raise
        # Made now, not on the first request: strict fill imports xgrammar (and torch),
        # ~1 s once per process, which a restarted server's first turn would pay.
        _ = self.strict
        self.warm_up_s = self.runner.warm_up() if self.config.warm_up else 0.0
        self.started_at = time.time()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="jumpahead-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(
        cls,
        model: str | None = None,
        config: EngineConfig | None = None,
        progress: Callable[[str], None] = print,
        adapter: str | None = None,
    ) -> "Engine":
        """Load a model (None = the embedded default), with a LoRA adapter folder fused
        in if given, and start the engine thread."""
        from .model.loader import load_model

        m, tok, info = load_model(model, progress=progress, adapter=adapter)
        return cls(m, tok, info, config)

    def attach(self, name: str, loaded: Any) -> Any:
        """Serve method `name` (a registered method with a Lifecycle) with `loaded`, what
        its `load` returns: its `attach` checks it against this engine and sets what the
        runner must keep; the state is kept under `name` (replacing any before it) and
        its companion, if any, registered with the prefix cache. The state kept."""
        method = methods.REGISTRY.get(name)
        lifecycle = method.lifecycle if method is not None else None
        if lifecycle is None:
            raise methods.MethodError(f"method {name!r} keeps no state (no Lifecycle in engine/methods/registry.py)")
        state = lifecycle.attach(self, loaded) if lifecycle.attach is not None else loaded
        self.method_states[name] = state
        old = self._companions.pop(name, None)
        if self.prefix_cache is not None:
            if old is not None and old in self.prefix_cache.hooks:
                self.prefix_cache.hooks.remove(old)
            if lifecycle.companion is not None:
                self._companions[name] = hook = lifecycle.companion(state)
                self.prefix_cache.register_companion(hook)
        return state

    def method_state(self, name: str) -> Any:
        """The state method `name` runs with on this engine (None: none attached)."""
        return self.method_states.get(name)

    def _make_prefix_cache(self) -> Any:
        """The prefix cache this config asks for (None when disabled)."""
        c = self.config
        if not c.prefix_cache:
            return None
        # (a model of sliding layers only packs "none": its prefixes are all snapshot)
        if self.runner.packing is None or (self.runner.packing == "none" and not self.runner.windowed):
            # layers of different shapes (or none with positions) do not pack into
            # one segment array (RowKVCache.segment_packing)
            log.warning("prompt cache off for %s: its attention layers do not share one shape",
                        self.runner.model_type)
            return None
        from .prefix.prefix_cache import PrefixCache
        from .model.fingerprint import model_fingerprint
        from .prefix.ssd_cache import SsdStore, default_cache_root, model_dir_name

        ssd = None
        if c.prefix_cache_ssd:
            # an adapter fused into the weights is part of the model's identity
            name = self.info.cache_name or "model"
            digest = self.info.adapter_digest
            # a KV format's prefixes get their own folder (another format's are foreign)
            folder = name + (f"-kv-{c.kv_format.name}" if c.kv_format else "")
            directory = c.prefix_cache_dir or default_cache_root() / model_dir_name(folder)
            try:
                # so are the adapter fused into the weights and the KV format
                extra = ";".join(x for x in (f"adapter:{digest}" if digest else "",
                                             f"kv:{c.kv_format.name}" if c.kv_format else "") if x)
                fp = model_fingerprint(self.model, name, extra=extra)
                ssd = SsdStore(directory, fp, name, c.prefix_cache_ssd_bytes,
                               max_pending_bytes=max(c.prefix_cache_ram_bytes, 256 << 20))
            except Exception as exc:  # never fail the engine over its cache
                log.warning("prompt cache: SSD tier off (%s); RAM tier only", exc)
        return PrefixCache(c.prefix_cache_ram_bytes, ssd, wake=self._wake.set, exact=self.runner.snapshots)

    # --- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        # MLX streams are per thread: give the engine thread its own on the default device.
        with mx.stream(mx.new_stream(mx.default_device())):
            while not self._closed:
                try:
                    busy = self.scheduler.step()
                except Exception as exc:  # a bug: fail the rows, keep serving
                    log.error("engine step failed:\n%s", traceback.format_exc())
                    try:
                        self.scheduler.fail_all(f"engine error: {type(exc).__name__}: {exc}")
                    except Exception:
                        log.error("recovery failed:\n%s", traceback.format_exc())
                    busy = False
                if not busy:
                    self._wake.wait(timeout=0.25)
                    self._wake.clear()

    # --- any thread ----------------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        if not req.prompt:
            raise EngineError("the prompt renders to no tokens")
        vocab = self.info.vocab_size
        if vocab and any(t < 0 or t >= vocab for t in req.prompt):
            raise EngineError("prompt token id out of the vocabulary range")
        if len(req.prompt) >= self.context_length:
            raise EngineError(
                f"prompt is {len(req.prompt)} tokens; this model's context is "
                f"{self.context_length} tokens"
            )
        for name in req.methods:
            if name not in methods.OFF:
                self._method(name)
        if req.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
            raise EngineError(f"logprobs must be 0..{MAX_TOP_LOGPROBS} alternatives per token")
        s = req.sampling
        if s.temperature < 0 or not 0 < s.top_p <= 1 or s.top_k < 0 or not 0 <= s.min_p <= 1:
            raise EngineError("invalid sampling parameters (temperature >= 0, 0 < top_p <= 1, top_k >= 0, 0 <= min_p <= 1)")
        if s.repetition_penalty <= 0:
            raise EngineError("repetition_penalty must be > 0")
        self.strict.validate(req)  # compiles the request's grammar (cached); a bad one is a 4xx

    def _make_row(self, req: GenerationRequest, emit: Callable[[TokenChunk], None]) -> Row:
        seed = req.sampling.seed if req.sampling.seed is not None else secrets.randbits(63)
        stop_ids = set(self.tokenizer.eos_token_ids) | set(req.stop_token_ids)
        # strict fill: grammar constraint + strict proposers first (engine/strict/fill.py)
        constraint, proposers = self.strict.row_parts(req, req.methods or self.config.default_methods, self._proposers(req))
        row = Row(
            proposers=proposers,
            constraint=constraint,
            req=req,
            sampler=RowSampler(req.sampling, seed, req.prompt),
            emit=emit,
            detokenizer=self.tokenizer.detokenizer,
            stop_ids=stop_ids,
            max_tokens=min(req.max_tokens, self.context_length - len(req.prompt)),
        )
        self.rows.add(row)  # weakly: /metrics memory counts rows still reachable (leak checks)
        return row

    @property
    def strict(self) -> Any:
        """Grammars and template scaffolds for this model (engine/strict/fill.py), made on first use."""
        found = self.__dict__.get("_strict_fill")
        if found is None:
            from .strict.fill import StrictFill

            found = self.__dict__.setdefault("_strict_fill", StrictFill(self.model, self.tokenizer, self.info, self.runner.trimmable))
        return found

    def token_bytes(self) -> list[bytes]:
        """Each token id's bytes (special tokens as their text): logprobs' `bytes`."""
        return self.strict.book.token_bytes

    def _method(self, name: str) -> methods.Method:
        """The registered method `name` (engine/methods/registry.py), if this engine can run it."""
        method = methods.get(name)
        if method is None:
            raise EngineError(methods.unknown_message(name))
        reason = method.needs(self) if method.needs is not None else None
        if reason:
            raise EngineError(reason)
        return method

    def _proposers(self, req: GenerationRequest) -> list:
        """The request's proposers: its ready-made ones, then one per named method
        (strict fill's come from engine/strict/fill.py, in _make_row)."""
        out = []
        for name in req.methods or self.config.default_methods:
            if name in methods.OFF:
                continue
            method = self._method(name)
            if method.factory is not None:
                out.append(method.factory(self, req))
        return list(req.proposers) + out

    async def stream(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        """Run `req`; yield its chunks. Leaving early cancels the row and frees it."""
        self.validate(req)
        if self._closed:
            raise EngineError("engine is shut down")
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[TokenChunk] = asyncio.Queue()
        def emit(chunk: TokenChunk) -> None:
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, chunk)
            except RuntimeError:  # the consumer's event loop is gone: nobody is listening
                row.cancelled = True

        row = self._make_row(req, emit)
        self.scheduler.submit(row)
        self._wake.set()
        finished = False
        try:
            while True:
                chunk = await chunks.get()
                if chunk.finish_reason is not None:
                    finished = True
                yield chunk
                if finished:
                    return
        finally:
            if not finished:
                row.cancelled = True
                self._wake.set()

    def generate_sync(self, req: GenerationRequest) -> list[TokenChunk]:
        """Blocking convenience for scripts and benches: run one request to the end."""
        import queue as _q

        out: _q.SimpleQueue[TokenChunk] = _q.SimpleQueue()
        self.validate(req)
        self.scheduler.submit(self._make_row(req, out.put))
        self._wake.set()
        chunks = []
        while True:
            c = out.get()
            chunks.append(c)
            if c.finish_reason is not None:
                return chunks

    def health(self) -> dict[str, Any]:
        s = self.scheduler
        return {
            "status": "ok" if self._thread.is_alive() else "engine thread stopped",
            "model": self.info.name,
            "adapter": _adapter_health(self.info),
            # each stateful method's report under its name (its Lifecycle.health; None:
            # nothing attached): the drafter's folder, the MTP layer's and why it drafts by default
            **self._method_health(),
            "device": str(mx.default_device()),
            "blas": blas_info(),
            "max_batch": s.config.max_batch,
            # set where a batched round failed at run time and rows went one at a time
            "one_row_reason": s.one_row_reason,
            "methods": describe_methods(self.config.default_methods),  # for requests that name none
            "context_length": self.context_length,
            "layers": self.runner.describe(),  # layer kinds served (engine/kv/cache_layout.py)
            "rows_running": len(s.running),
            "rows_waiting": len(s.waiting) + s.inbox.qsize(),
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def _method_health(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for method in methods.stateful():
            if method.lifecycle.health is not None:
                state = self.method_state(method.name)
                out[method.name] = None if state is None else method.lifecycle.health(self, state)
        return out

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.scheduler.counters)
        out["width_policy"] = self.scheduler.width_policy.as_dict()
        per_method = self.scheduler.totals.as_dict().get("methods")
        if per_method:
            out["methods"] = per_method  # verified proposals per method: accepted lengths, propose time
        for method in methods.stateful():  # a stateful method's own counters (its Lifecycle.metrics)
            state = self.method_state(method.name)
            if state is not None and method.lifecycle.metrics is not None:
                out.update(method.lifecycle.metrics(state))
        if self.prefix_cache is not None:
            out["prefix_cache"] = self.prefix_cache.stats()
        out["memory"] = self.memory()
        return out

    def memory(self, collect: bool = False) -> dict[str, Any]:
        """Rows alive, batch slots, prefix-cache accounting, MLX and process memory
        (engine/memory.py); `collect` garbage-collects first."""
        return engine_memory(self, collect)

    def flush_prefix_cache(self, timeout: float = 60.0) -> bool:
        """Wait until no row runs and every prefix-cache entry is on disk and indexed.

        (A request's last chunk is emitted before its row publishes; benches and tests
        that restart over the same cache directory call this first.)"""
        if self.prefix_cache is None:
            return True
        deadline = time.monotonic() + timeout
        while not self.scheduler.idle:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return self.prefix_cache.flush(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        join_fully(self._thread, timeout=10)
        if self.prefix_cache is not None:
            self.prefix_cache.close()  # finishes queued SSD writes, releases the directory
