"""Constrained decoding with xgrammar, and the grammar jump-forward strict proposer.

A request's `grammar` (GenerationRequest.grammar) is one of:

- `{"type": "json_schema", "schema": {...}}`: output is one JSON value valid for the schema;
- `{"type": "json_object"}`: output is one JSON object;
- `{"type": "tool_call", "tools": [openai function tools], "name": optional}`: output is
  exactly one call in the default (Hermes/ChatML) template format,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, then EOS
  (`tool_choice` "required", or a named function when `name` is given).
- `{"type": "tool_calls", "family": ..., "tools": [...], "name": optional, "parallel": true,
  "count": optional}`: output is only tool calls in the model's own family format
  (engine/strict/tool_formats/: Hermes, Qwen3-Coder, GLM, Kimi, Mistral, harmony, DeepSeek,
  Llama 3 JSON), one or more (`parallel`), or exactly `count`.

Optional keys: `any_whitespace` (default False: compact JSON with `", "` and `": "`
separators, the way chat templates render `tojson`; True lets the model place
whitespace freely, which also leaves less text forced), `strict` (default True: no
properties beyond the schema's unless it allows them, xgrammar's strict mode), and for
tool calls `open` / `close` (the markers around the JSON, defaults
`"<tool_call>\\n"`, `"\\n</tool_call>"`).

`GrammarConstraint` is the engine's Constraint (engine/methods/proposal.py): it masks a row's
logits with the matcher's token bitmask and follows every committed token.
`JumpForwardProposer` proposes the text the grammar forces next
(`find_jump_forward_string`), tokenized with the model's tokenizer, as kind "strict"
(verified by default, asserted on request: see engine/strict/fill.py); tokens the matcher
would not accept are cut, and when asserting, a final token that a longer allowed
token extends is left for the model to choose (the retokenization boundary: `' "'`
may merge with the value the model writes next). Compiled grammars are cached per
tokenizer by a hash of the spec, so each schema compiles once.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import threading
from typing import Any, Sequence

import numpy as np
import xgrammar as xg

from ..methods.proposal import Proposal, RowView, Wrapper
from ..types import EngineError

log = logging.getLogger("jumpahead.engine")

TOOL_OPEN = "<tool_call>\n"
TOOL_CLOSE = "\n</tool_call>"
SEPARATORS = (", ", ": ")


def _spec_key(spec: dict) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _function(tool: dict) -> dict:
    """The function definition of an OpenAI tool (chat `{"function": ...}` or flat)."""
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def tool_call_schema(tools: Sequence[dict], name: str | None = None) -> dict:
    """JSON schema of one call `{"name": ..., "arguments": {...}}` of one of `tools`."""
    options = []
    for tool in tools:
        fn = _function(tool)
        fname = fn.get("name")
        if not fname or (name is not None and fname != name):
            continue
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fname}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not options:
        raise EngineError(f"tool_choice names a function that is not among the tools: {name!r}" if name else "tool_choice requires tools")
    return options[0] if len(options) == 1 else {"anyOf": options}


class GrammarBook:
    """Per-tokenizer xgrammar state: TokenizerInfo, compiler, compiled grammars by spec hash."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.hf = hf_tokenizer
        self.vocab_size = vocab_size
        self.info = xg.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids))
        self.compiler = xg.GrammarCompiler(self.info, max_threads=2)
        self._compiled: dict[str, xg.CompiledGrammar] = {}
        self._lock = threading.Lock()
        self._extensions: _Extensions | None = None
        self._token_bytes: list[bytes] | None = None

    @property
    def token_bytes(self) -> list[bytes]:
        """Each token id's bytes (special tokens as their text)."""
        if self._token_bytes is None:
            self._token_bytes = [bytes(b) for b in self.info.decoded_vocab]
        return self._token_bytes

    def compile(self, spec: dict) -> xg.CompiledGrammar:
        """Compile (once per distinct spec). Raises EngineError for a spec we cannot use."""
        key = _spec_key(spec)
        with self._lock:
            hit = self._compiled.get(key)
        if hit is not None:
            return hit
        try:
            compiled = self.compiler.compile_grammar(self.grammar(spec))
        except EngineError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError / InvalidJSONError / ValueError
            raise EngineError(f"cannot compile the requested grammar: {exc}") from exc
        with self._lock:
            if len(self._compiled) > 256:
                self._compiled.clear()
            self._compiled[key] = compiled
        return compiled

    def grammar(self, spec: dict) -> xg.Grammar:
        if not isinstance(spec, dict):
            raise EngineError("grammar must be an object with a 'type'")
        kind = spec.get("type")
        ws = bool(spec.get("any_whitespace", False))
        fmt: dict[str, Any] = {"any_whitespace": ws}
        if not ws:
            fmt["separators"] = SEPARATORS
        if kind == "json_schema":
            schema = spec.get("schema")
            if not isinstance(schema, (dict, bool)):
                raise EngineError("grammar json_schema needs a 'schema' object")
            return xg.Grammar.from_json_schema(json.dumps(schema), strict_mode=bool(spec.get("strict", True)), **fmt)
        if kind == "json_object":
            return xg.Grammar.from_json_schema('{"type": "object"}', strict_mode=False, **fmt)
        if kind == "tool_call":
            tools = spec.get("tools") or []
            schema = tool_call_schema(tools, spec.get("name"))
            body = xg.Grammar.from_json_schema(json.dumps(schema), strict_mode=bool(spec.get("strict", True)), **fmt)
            return xg.Grammar.concat(
                _literal(spec.get("open", TOOL_OPEN)), body, _literal(spec.get("close", TOOL_CLOSE))
            )
        if kind == "tool_calls":
            from .tool_formats import FAMILIES, structural_tag

            family = FAMILIES.get(spec.get("family"))
            if family is None:
                raise EngineError(f"unknown tool-call family {spec.get('family')!r} (known: {', '.join(FAMILIES)})")
            tag = structural_tag(family, spec.get("tools") or [], spec.get("name"), bool(spec.get("parallel", True)),
                                 spec.get("count"), bool(spec.get("strict", True)))
            return xg.Grammar.from_structural_tag(tag)
        raise EngineError(f"unknown grammar type {kind!r} (known: json_schema, json_object, tool_call, tool_calls)")

    def constraint(self, spec: dict) -> "GrammarConstraint":
        return GrammarConstraint(self.compile(spec), self)

    def extensions(self) -> "_Extensions":
        if self._extensions is None:
            self._extensions = _Extensions(self.info, self.vocab_size)
        return self._extensions


def _literal(text: str) -> xg.Grammar:
    return xg.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


class _Extensions:
    """Which tokens' bytes are a strict prefix of another ordinary token's bytes.

    Sorted byte strings put every extension of t right after t, so `of(t)` is a
    contiguous run found with bisect.
    """

    def __init__(self, info: xg.TokenizerInfo, vocab_size: int) -> None:
        vocab = info.decoded_vocab
        special = set(info.special_token_ids) | set(info.stop_token_ids)
        items = sorted((bytes(v), i) for i, v in enumerate(vocab[:vocab_size]) if i not in special and len(v))
        self.keys = [k for k, _ in items]
        self.ids = np.array([i for _, i in items], dtype=np.int64)
        self.text = {i: k for k, i in items}

    def of(self, token: int) -> np.ndarray:
        """Ids of ordinary tokens whose bytes strictly extend `token`'s bytes."""
        key = self.text.get(token)
        if key is None:
            return self.ids[:0]
        lo = bisect.bisect_right(self.keys, key)
        hi = lo
        while hi < len(self.keys) and self.keys[hi].startswith(key):
            hi += 1
        return self.ids[lo:hi]


class GrammarConstraint:
    """The engine's Constraint over one row's output, backed by an xgrammar matcher."""

    def __init__(self, compiled: xg.CompiledGrammar, book: GrammarBook) -> None:
        self.matcher = xg.GrammarMatcher(compiled)
        self.book = book
        self.vocab_size = book.vocab_size
        self._bitmask = np.full(xg.get_bitmask_shape(1, book.vocab_size), -1, dtype=np.int32)
        self.error: str | None = None  # set when a committed token broke the grammar
        self._stop = np.array(sorted(book.info.stop_token_ids), dtype=np.int64)

    def allowed(self) -> np.ndarray | None:
        """Boolean mask of the tokens the grammar allows next (None: all of them)."""
        if self.error is not None or self.matcher.is_terminated():
            out = np.zeros(self.vocab_size, dtype=bool)
            out[self._stop] = True
            return out
        if not self.matcher.fill_next_token_bitmask(self._bitmask):
            return None
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        allowed = self.allowed()
        if allowed is None:
            return logits
        n = min(len(logits), len(allowed))
        out = np.full(logits.shape, -np.inf, dtype=logits.dtype)
        out[:n] = np.where(allowed[:n], logits[:n], -np.inf)
        return out

    def accept(self, token: int) -> None:
        if self.error is not None or self.matcher.is_terminated():
            return
        if not self.matcher.accept_token(int(token)):
            # Only a bug (an asserted token not checked with `accepts`) gets here; the
            # row's mask then allows only EOS so it ends instead of leaving the grammar.
            self.error = f"token {token} is not allowed by the grammar"
            log.warning("grammar constraint: %s", self.error)

    def accepts(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar accepts from here (state unchanged)."""
        if self.error is not None or self.matcher.is_terminated():
            return 0
        n = 0
        for t in tokens:
            if not self.matcher.accept_token(int(t)):
                break
            n += 1
        if n:
            self.matcher.rollback(n)
        return n


class JumpForwardProposer:
    """Strict fill from the grammar: assert the text the grammar allows as the only
    continuation (`find_jump_forward_string`), tokenized with the model's tokenizer."""

    name = "strict"

    def __init__(self, constraint: GrammarConstraint, verify: bool = False) -> None:
        self.constraint = constraint
        self.verify = verify
        self.hf = constraint.book.hf
        self.extensions = constraint.book.extensions()

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        c = self.constraint
        m = c.matcher
        if c.error is not None or m.is_terminated() or max_len <= 0:
            return None
        text = m.find_jump_forward_string()
        if not text:
            return None
        ids = self.hf.encode(text, add_special_tokens=False)
        n = 0
        for t in ids[:max_len]:
            if not m.accept_token(int(t)):
                break
            n += 1
        # Unless the proposal stops at a boundary the tokenizer itself chose inside the
        # forced text (cut by max_len), its last token ends the forced text.
        at_end = not (n == max_len < len(ids))
        ids = ids[:n]
        if n and at_end and not self.verify:
            # If the grammar also allows a longer token that starts with the last token's
            # bytes, the model may merge it with what it writes next: leave it to the model.
            m.rollback(1)
            longer = self.extensions.of(ids[-1])
            if longer.size:
                allowed = c.allowed()
                if allowed is None or allowed[longer].any():
                    ids = ids[:-1]
            n -= 1
        if n:
            m.rollback(n)
        return Proposal(ids, "strict", verify=self.verify) if ids else None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass


class ConstrainedProposer(Wrapper):
    """Wraps a proposer for a constrained row: its tokens are cut to the prefix the
    grammar accepts. Asserted tokens must never break the grammar; verified ones would
    be rejected there anyway (their sampling is masked), so the cut only saves width."""

    def __init__(self, inner: Any, constraint: GrammarConstraint) -> None:
        self.inner = inner
        self.constraint = constraint
        self.name = inner.name

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        prop = self.inner.propose(view, max_len)
        if prop is None or not prop.tokens:
            return prop
        head = prop.tokens[:max_len]
        n = self.constraint.accepts(head)
        if n == 0:
            return None
        if n < len(head):
            prop.tokens = prop.tokens[:n]
        # else the tokens past max_len stay: an asserted run longer than the round's cap
        # must reach the scheduler whole to be marked cut; its rest is checked next round.
        return prop

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        self.inner.feedback(proposal, accepted)
