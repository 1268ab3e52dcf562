"""The engine interface: what the proxy, the runner, policies and traces call on an engine.

Two engines implement it: the in-process one (engine/engine.py `Engine`, and replay's
`ReplayEngine` on top of it) and the upstream engine (proxy/upstream/engine.py
`UpstreamEngine`, tokens from other servers). Code above the engine takes an `Engine`
and reaches for anything else only through `getattr` (a local engine's
`generate_sync`, `memory`, `token_bytes`, `scheduler`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .types import GenerationRequest, ServedModel, TokenChunk


@runtime_checkable
class Engine(Protocol):
    """An engine the server can serve from."""

    tokenizer: Any  # the serving model's tokenizer (encode, decode, chat template, eos_token_ids)
    info: "ServedModel"  # the model's identity (a local engine's is the loader's ModelInfo)
    context_length: int  # the model's window in tokens
    started_at: float  # time.time() at start (/v1/models `created`, /health uptime)

    def validate(self, req: "GenerationRequest") -> None:
        """Raise EngineError (a 4xx) for a request this engine cannot run."""
        ...

    def stream(self, req: "GenerationRequest") -> AsyncIterator["TokenChunk"]:
        """Run `req`, yielding its chunks; leaving early cancels it."""
        ...

    def health(self) -> dict[str, Any]:
        """/health's report (`status` "ok" when serving)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """/metrics' engine section."""
        ...

    def close(self) -> None:
        """Stop serving and release what the engine holds."""
        ...


@runtime_checkable
class LocalEngine(Engine, Protocol):
    """An engine running the model in this process, which can also answer blocking
    requests (policies' model-written summaries, Responses compaction by the model)."""

    def generate_sync(self, req: "GenerationRequest") -> list["TokenChunk"]:
        """Run `req` to its end, blocking."""
        ...
