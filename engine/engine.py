"""The Engine: owns the model, runs the scheduler on a thread of its own, and
streams each request's tokens to asyncio consumers."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable

import mlx.core as mx

from .blas import blas_info
from .cache_layout import single_row
from .logprobs import MAX_TOP_LOGPROBS
from .kv_format import KVFormat
from . import methods
from .methods import describe as describe_methods
from .memory import RowRegistry, engine_memory, return_freed_memory_to_os
from .model_runner import ModelRunner
from .row import Row
from .sampler import RowSampler
from .scheduler import Scheduler, SchedulerConfig
from .threads import join_fully
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
    cost_aware: bool = True  # size verified proposals by expected gain (engine/width_policy.py)
    objective: str = "throughput"  # what an accepted token is worth: "throughput" | "latency" (SchedulerConfig)
    pipeline_greedy: bool | None = None  # None: on a GPU only (SchedulerConfig)
    default_methods: tuple[str, ...] = ()
    # Prefix cache (engine/prefix_cache.py, engine/ssd_cache.py): reuse the KV of the
    # longest cached prefix of each prompt, in RAM and in an SSD tier that survives
    # restarts. prefix_cache_dir None = $JUMPAHEAD_HOME (or ~/.cache/jumpahead)
    # /prompt-cache/<model id>.
    prefix_cache: bool = True
    prefix_cache_ram_bytes: int = 2 << 30
    prefix_cache_ssd: bool = True
    prefix_cache_dir: str | None = None
    prefix_cache_ssd_bytes: int = 16 << 30
    draft_model: str | None = None  # mlx-lm folder of a draft model (method "draft")
    drafter: str | None = None  # folder of a trained drafter head (method "drafter", engine/drafter.py)
    # Hugging Face folder whose mtp.* weights serve method "mtp" (engine/mtp.py); "auto": the
    # served model's own folder
    mtp: str | None = None
    # Run one throwaway prefill chunk and round at startup (ModelRunner.warm_up), so
    # the first request (a restarted server's cache hit) pays no first-forward costs.
    warm_up: bool = True
    # Attention layers' keys and values quantized (engine/kv_format.py); None: full precision.
    kv_format: KVFormat | None = None


class Engine:
    def __init__(self, model: Any, tokenizer: Any, info: ServedModel, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        if self.config.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        return_freed_memory_to_os()  # freed KV buffers leave RSS (engine/memory.py)
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
        self.draft = None  # DraftModel, set by attach_draft
        if self.config.draft_model:
            from .draft import DraftModel

            self.attach_draft(DraftModel.load(self.config.draft_model, progress=lambda s: None))
        self.drafter = None  # DraftGroup, set by attach_drafter
        if self.config.drafter:
            from .drafter import Drafter

            self.attach_drafter(Drafter.load(self.config.drafter, target=model))
        self.mtp = None  # Mtp, set by attach_mtp
        if self.config.mtp:
            self.load_mtp(self.config.mtp)
        self._wake = threading.Event()
        self.rows = RowRegistry()
        self.prefix_cache = self._make_prefix_cache()
        self.scheduler.prefix_cache = self.prefix_cache
        if self.draft is not None:
            self._store_draft_state(self.draft)
        if self.mtp is not None:
            self._store_mtp_state()
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
        from .loader import load_model

        m, tok, info = load_model(model, progress=progress, adapter=adapter)
        return cls(m, tok, info, config)

    def attach_draft(self, draft: Any) -> None:
        """Serve method "draft" with `draft` (a DraftModel); refuses another tokenizer family."""
        draft.check_compatible(self.tokenizer)
        self.draft = draft
        if getattr(self, "prefix_cache", None) is not None:  # (None yet while __init__ runs)
            self._store_draft_state(draft)

    def _store_draft_state(self, draft: Any) -> None:
        """The prefix cache keeps each row's draft KV beside the target's (engine/draft.py
        DraftCompanion), so a warm turn does not re-prefill the draft model."""
        from .draft import DraftCompanion

        if self.prefix_cache is None:
            return
        self.prefix_cache.hooks = [h for h in self.prefix_cache.hooks if not isinstance(h, DraftCompanion)]
        self.prefix_cache.register_companion(DraftCompanion(draft))

    def attach_drafter(self, drafter: Any) -> None:
        """Serve method "drafter" with a trained Drafter: rows keep the target's hidden
        state (ModelRunner.keep_hidden) and draft together in one DraftGroup."""
        from .drafter import DraftGroup, DrafterError

        if not self.runner.split:
            raise DrafterError(f"{self.runner.model_type}: a drafter reads the trunk's hidden state, and this "
                               "model's head is not a plain projection of it")
        mx.eval(drafter.parameters())  # arrays made lazily elsewhere must exist before the engine thread reads them
        self.runner.keep_hidden = True
        self.drafter = DraftGroup(drafter, self.runner.trunk.embed_tokens)

    def load_mtp(self, spec: str) -> None:
        """`spec` "auto": the served folder's own MTP layer where the model type has an
        MTP layout and the folder keeps it (else none, no error); a folder: its MTP
        weights for the served model, or MtpError. Layouts: `mtp.*` (qwen3_next,
        qwen3_5: engine/mtp.py), `model.layers.{N}.*` (deepseek_v3, glm4_moe,
        glm4_moe_lite: engine/mtp_nextn.py)."""
        from .mtp import MTP_MODEL_TYPES, MtpHead, model_type, read_mtp_weights
        from .mtp_nextn import NEXTN_MODEL_TYPES, NextnHead, nextn_prefix, read_nextn_weights

        nextn = model_type(self.model) in NEXTN_MODEL_TYPES
        if spec == "auto":
            folder = self.info.path
            if not folder:
                return
            if not (nextn and read_nextn_weights(folder, nextn_prefix(self.model)) is not None or
                    model_type(self.model) in MTP_MODEL_TYPES and read_mtp_weights(folder) is not None):
                return
        else:
            folder = spec
        self.attach_mtp((NextnHead if nextn else MtpHead).load(folder, self.model))
        log.info("mtp: the MTP layer of %s", folder)

    def attach_mtp(self, head: Any) -> None:
        """Serve method "mtp" with the checkpoint's MTP layer (an MtpHead): the runner keeps
        the target's hidden state at every input (ModelRunner.keep_all_hidden), which the
        scheduler hands to each row's MtpProposer."""
        from .mtp import Mtp, MtpError

        if not self.runner.split:
            raise MtpError(f"{self.runner.model_type}: MTP reads the trunk's hidden state, and this model's head "
                           "is not a plain projection of it")
        mx.eval(head.parameters())
        self.runner.keep_all_hidden = True
        self.mtp = Mtp(head, self.model.model.embed_tokens, self.runner.head)
        if getattr(self, "prefix_cache", None) is not None:  # (None yet while __init__ runs)
            self._store_mtp_state()

    def _store_mtp_state(self) -> None:
        """The prefix cache keeps each row's MTP entries beside the target's KV
        (engine/mtp_companion.py), so a warm turn feeds the MTP layer only new positions."""
        from .mtp_companion import MtpCompanion

        if self.prefix_cache is None:
            return
        self.prefix_cache.hooks = [h for h in self.prefix_cache.hooks if not isinstance(h, MtpCompanion)]
        self.prefix_cache.register_companion(MtpCompanion(self.mtp.group))

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
        from .prefix_cache import PrefixCache
        from .ssd_cache import SsdStore, default_cache_root, model_dir_name, model_fingerprint

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
        # strict fill: grammar constraint + strict proposers first (engine/strict.py)
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
        """Grammars and template scaffolds for this model (engine/strict.py), made on first use."""
        found = self.__dict__.get("_strict_fill")
        if found is None:
            from .strict import StrictFill

            found = self.__dict__.setdefault("_strict_fill", StrictFill(self.model, self.tokenizer, self.info, self.runner.trimmable))
        return found

    def token_bytes(self) -> list[bytes]:
        """Each token id's bytes (special tokens as their text): logprobs' `bytes`."""
        return self.strict.book.token_bytes

    def _method(self, name: str) -> methods.Method:
        """The registered method `name` (engine/methods.py), if this engine can run it."""
        method = methods.get(name)
        if method is None:
            raise EngineError(methods.unknown_message(name))
        reason = method.needs(self) if method.needs is not None else None
        if reason:
            raise EngineError(reason)
        return method

    def _proposers(self, req: GenerationRequest) -> list:
        """The request's proposers: its ready-made ones, then one per named method
        (strict fill's come from engine/strict.py, in _make_row)."""
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
            # the trained drafter head loaded for method "drafter" (its folder), or None
            "drafter": getattr(self.drafter.drafter, "folder", None) if self.drafter is not None else None,
            # the MTP layer loaded for method "mtp": its folder, and why it drafts by default or not
            "mtp": self.mtp.describe() if self.mtp is not None else None,
            "device": str(mx.default_device()),
            "blas": blas_info(),
            "max_batch": s.config.max_batch,
            # set where a batched round failed at run time and rows went one at a time
            "one_row_reason": s.one_row_reason,
            "methods": describe_methods(self.config.default_methods),  # for requests that name none
            "context_length": self.context_length,
            "layers": self.runner.describe(),  # layer kinds served (engine/cache_layout.py)
            "rows_running": len(s.running),
            "rows_waiting": len(s.waiting) + s.inbox.qsize(),
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.scheduler.counters)
        out["width_policy"] = self.scheduler.width_policy.as_dict()
        methods = self.scheduler.totals.as_dict().get("methods")
        if methods:
            out["methods"] = methods  # verified proposals per method: accepted lengths, propose time
        if self.draft is not None:  # the draft model's batched forwards (engine/draft.py DraftModelGroup)
            out["draft_model"] = self.draft.group.stats()
        if self.mtp is not None:  # the MTP layer's batched forwards (engine/mtp_group.py MtpGroup)
            out["mtp_group"] = self.mtp.group.stats()
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
