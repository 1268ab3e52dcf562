"""Plain data the engine takes and gives: requests in, token chunks out.

The engine never sees a protocol: the proxy renders the chat template into prompt
token ids and maps these chunks onto its wire format.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Literal

# Provenance of an emitted token: one of engine/methods/registry.py `token_kinds()`. `sampled`
# came from the row's sampler; the others are the kinds of the registered methods
# ("strict", "echo", "ngram", "draft", "jump", "scripted", and any registered later),
# supplied by a proposer (see docs/design.md, Engine vocabulary).
TokenKind = str
FinishReason = Literal["stop", "length", "cancelled", "error"]

_ids = itertools.count(1)


@dataclass
class SamplingParams:
    """Per-row sampler settings. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationRequest:
    """One completion to run: prompt token ids plus how to sample and when to stop."""

    prompt: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    # Token ids that end the row (the tokenizer's EOS ids are added by the engine).
    stop_token_ids: list[int] = field(default_factory=list)
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    # Proposal methods by name ("echo", "ngram", "draft", "strict"); the engine builds
    # them. `proposers` adds ready-made instances (policies); see engine/methods/proposal.py.
    methods: list[str] = field(default_factory=list)
    proposers: list = field(default_factory=list)
    # Constrained decoding (engine/strict/grammar.py): {"type": "json_schema", "schema": {...}},
    # {"type": "json_object"} or {"type": "tool_call", "tools": [...], "name": optional}.
    grammar: dict | None = None
    # The request's tools (OpenAI function tools) for the template-scaffold strict
    # proposer (engine/strict/scaffold.py); None or [] = no scaffold.
    tools: list[dict] | None = None
    # Output lengths (tokens) of the session's recent turns, oldest first: the
    # throughput objective forecasts from them which row the batch waits on last
    # (engine/schedule/forecast.py). Empty: unknown (the remaining max_tokens is used).
    recent_lengths: list[int] = field(default_factory=list)
    # Log probabilities of the emitted tokens (engine/logprobs.py): None = not asked
    # (no extra work); N = each token's logprob plus its N most likely alternatives.
    logprobs: int | None = None
    # The request as messages, after policies (core/turn.py's `Turn`; typed loosely, as
    # the engine layer sits below it), and its session id: what an engine that serves
    # messages rather than tokens sends on (the upstream engine). The runner sets both.
    turn: Any = None
    session_id: str = ""


@dataclass
class Timings:
    """Seconds; measured on the engine thread."""

    queued_s: float = 0.0  # submit -> first forward that touched the row
    prefill_s: float = 0.0  # wall spent in forwards that consumed prompt tokens
    decode_s: float = 0.0  # first generated token -> last generated token
    rounds: int = 0  # decode rounds the row took part in


@dataclass
class TokenChunk:
    """What a row emits after a round: new token ids, their provenance and the text.

    `text` is the detokenized delta that is safe to show: text that could still turn
    into a stop string is held back, and the stop string itself is never emitted.
    The last chunk of a row has `finish_reason` set (and may carry no tokens).
    """

    tokens: list[int]
    kinds: list[TokenKind]
    text: str
    finish_reason: FinishReason | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timings: Timings | None = None
    # Prompt tokens served from the prefix cache (set on the first and the last chunk).
    cached_tokens: int = 0
    fill: dict | None = None  # usage.fill telemetry (last chunk): see ProposalStats
    # Per token, the absolute position in the row's sequence it was copied from (echo,
    # ngram, jump with a source); None for the whole chunk when nothing was copied.
    sources: list[int | None] | None = None
    # Rows that asked for logprobs: per token, its TokenLogprob (engine/logprobs.py),
    # None for an asserted token the model never scored. None when not asked.
    logprobs: list | None = None
    # Proposal tokens (verified or asserted) the round that made this chunk carried for
    # the row, accepted or not: a round that carried some and emitted one token had them
    # all rejected, and its extra forward time is what they cost (traces/accounting.py).
    proposed: int = 0


@dataclass
class ServedModel:
    """The model an engine serves, as the server names it (`Engine.info`): the local
    engine's `ModelInfo` (engine/model/loader.py) adds what loading found; an upstream engine
    knows only this much."""

    name: str
    path: str  # the model's folder, or an upstream's URL
    vocab_size: int | None = None  # None: unknown (an upstream)
    adapter: str | None = None  # a LoRA adapter folder fused into the weights at load
    adapter_digest: str | None = None  # sha256 of its adapters.safetensors (first 16 hex)

    @property
    def cache_name(self) -> str:
        """The model's identity for caches: its name, plus the adapter when one is fused
        (cached KV of the base model must never serve the adapted one, or another adapter)."""
        if not self.adapter:
            return self.name
        return f"{self.name}+{Path(self.adapter).name}-{self.adapter_digest or 'unknown'}"


class EngineError(RuntimeError):
    """A request the engine cannot run (bad parameters, prompt too long)."""
