"""Signatures on reasoning the server hands out, so clients can send it back.

Anthropic clients keep a thinking block in the history they resend only when it has a
signature; Codex sends Responses reasoning items back as `encrypted_content`. Without
them the next prompt loses the reasoning the previous answer generated, and stops
extending the cached prefix (docs/prefix-cache.md). The server signs what it emits
with an HMAC-SHA256 under a per-server key and, when the text comes back, keeps it
only if the signature verifies: reasoning edited by the client, or signed by another
server (Anthropic's own, after switching base URLs), is dropped from the prompt
rather than shown to the model as its own.

The key is random per server process, or derived from `JUMPAHEAD_SIGNING_KEY` when
that is set (so signatures survive restarts, and replicas can share one).
`encrypted_content` is signed, not encrypted: it carries the text the response also
shows in its summary. A Responses compaction item's `encrypted_content` is sealed the
same way (its own prefix and purpose) over the compacted context it stands for
(proxy/compaction_item.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets

SIGNATURE_PREFIX = "ja1."  # Anthropic thinking signatures
SEALED_PREFIX = "ja2:"  # Responses encrypted_content: base64(text) "." base64(mac)
CONTEXT_PREFIX = "ja3:"  # Responses compaction items: the same form over a compacted context
KEY_ENV = "JUMPAHEAD_SIGNING_KEY"


class Signer:
    """Signs and verifies reasoning texts under one key."""

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            env = os.environ.get(KEY_ENV)
            key = hashlib.sha256(env.encode()).digest() if env else secrets.token_bytes(32)
        self._key = key

    def _mac(self, purpose: bytes, text: str) -> bytes:
        return hmac.new(self._key, purpose + b"\0" + text.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def sign(self, text: str) -> str:
        """An Anthropic thinking block's `signature` for `text`."""
        return SIGNATURE_PREFIX + base64.b64encode(self._mac(b"thinking", text)).decode()

    def verify(self, text: str, signature: object) -> bool:
        """True when `signature` is this server's signature of `text`."""
        return isinstance(signature, str) and hmac.compare_digest(signature, self.sign(text))

    def seal(self, text: str) -> str:
        """A Responses reasoning item's `encrypted_content` for `text`."""
        return self._seal(SEALED_PREFIX, b"reasoning", text)

    def open(self, sealed: object) -> str | None:
        """The text of this server's `encrypted_content`; None when it is not one."""
        return self._open(SEALED_PREFIX, b"reasoning", sealed)

    def seal_context(self, text: str) -> str:
        """A compaction item's `encrypted_content` for a serialized compacted context
        (its own purpose: a reasoning seal never opens as a context, nor the reverse)."""
        return self._seal(CONTEXT_PREFIX, b"compaction", text)

    def open_context(self, sealed: object) -> str | None:
        """The serialized context of this server's compaction item; None when it is not one."""
        return self._open(CONTEXT_PREFIX, b"compaction", sealed)

    def _seal(self, prefix: str, purpose: bytes, text: str) -> str:
        body = base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()
        mac = base64.b64encode(self._mac(purpose, text)).decode()
        return f"{prefix}{body}.{mac}"

    def _open(self, prefix: str, purpose: bytes, sealed: object) -> str | None:
        if not isinstance(sealed, str) or not sealed.startswith(prefix):
            return None
        body, _, mac = sealed[len(prefix):].partition(".")
        try:
            text = base64.b64decode(body, validate=True).decode("utf-8", "surrogatepass")
            given = base64.b64decode(mac, validate=True)
        except (binascii.Error, UnicodeDecodeError):
            return None
        return text if hmac.compare_digest(given, self._mac(purpose, text)) else None


_default: Signer | None = None


def default_signer() -> Signer:
    """The process's signer (one key per server process unless JUMPAHEAD_SIGNING_KEY)."""
    global _default
    if _default is None:
        _default = Signer()
    return _default
