"""Strict fill for a row: its grammar constraint and its strict proposers.

The Engine asks `StrictFill.row_parts(req, methods, others)` when it makes a row:

- a request with `grammar` gets a `GrammarConstraint` (always: it is what the client
  asked for) and the grammar jump-forward proposer (engine/strict/grammar.py);
- a request with `tools` gets the template-scaffold proposer (engine/strict/scaffold.py).

Strict fill is on by default (it supplies only text the grammar or the chat template
fixes); `"none"` / `"off"` in the method list turn every proposer off: ordinary
decoding, still constrained. Strict proposers go first in the row's list (they fire
only where text is forced); on a constrained row every proposal, strict or from a
policy, is cut to the prefix the grammar accepts.

Exact by default: forced *text* does not fix the *tokens*. Under a grammar the model
may write ` {"` as one token or as ` {` then `"`, and a 135M model often picks the
non-canonical split; asserting the tokenizer's canonical split then changes the
context and the free text after it. So strict tokens are proposed for verification
(kind "strict", `Proposal.verify`): one forward as with assertion, each position
accepted only where the row's own (masked) sampler picks it, so the output equals
ordinary constrained decoding token for token at any temperature and seed. Set
`StrictFill.asserted = True` for DESIGN's unverified assertion (a few more tokens per
forward, canonical tokenization); models whose cache cannot be rolled back
(recurrent layers) always assert, since they cannot verify.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from .grammar import ConstrainedProposer, GrammarBook, GrammarConstraint, JumpForwardProposer
from ..types import EngineError, GenerationRequest, ServedModel

OFF = frozenset({"none", "off"})


def strict_enabled(methods: Sequence[str]) -> bool:
    return not (set(methods) & OFF)


def logits_width(model: Any, info: ServedModel) -> int:
    """The width of the model's logits (the grammar bitmask covers exactly these ids)."""
    args = getattr(model, "args", None)
    width = getattr(args, "vocab_size", None)
    if not width:
        try:
            width = int(model.model.embed_tokens.weight.shape[0])
        except AttributeError:
            width = info.vocab_size
    if not width:
        raise EngineError("cannot tell the model's vocabulary size for constrained decoding")
    return int(width)


class StrictFill:
    def __init__(self, model: Any, tokenizer: Any, info: ServedModel, trimmable: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.trimmable = trimmable
        self.asserted = False  # True: assert strict tokens unverified (see module doc)
        self._book: GrammarBook | None = None
        self._scaffolds: Any = None
        self._lock = threading.RLock()

    @property
    def verify(self) -> bool:
        return self.trimmable and not self.asserted

    @property
    def book(self) -> GrammarBook:
        with self._lock:
            if self._book is None:
                hf = getattr(self.tokenizer, "_tokenizer", self.tokenizer)
                self._book = GrammarBook(hf, logits_width(self.model, self.info), self.tokenizer.eos_token_ids)
            return self._book

    def validate(self, req: GenerationRequest) -> None:
        """Compile the request's grammar and analyse the template for its tools now
        (both cached), off the engine thread; a bad grammar fails as a 4xx."""
        if req.grammar is not None:
            self.book.compile(req.grammar)
        if req.tools:
            self.scaffold(req.tools)

    def scaffold(self, tools: list[dict]) -> Any:
        from .scaffold import ScaffoldBook

        with self._lock:
            if self._scaffolds is None:
                self._scaffolds = ScaffoldBook(self.tokenizer, self.book.token_bytes)
            return self._scaffolds.for_tools(tools)

    def row_parts(self, req: GenerationRequest, methods: Sequence[str], others: list) -> tuple[GrammarConstraint | None, list]:
        """The row's constraint and its full proposer list (strict ones first)."""
        constraint = self.book.constraint(req.grammar) if req.grammar is not None else None
        strict: list = []
        if strict_enabled(methods):
            if req.tools:
                scaffold = self.scaffold(req.tools)
                if scaffold is not None:
                    strict.append(scaffold.proposer(self.verify))
            if constraint is not None:
                strict.append(JumpForwardProposer(constraint, self.verify))
        proposers = strict + list(others)
        if constraint is not None:
            proposers = [p if isinstance(p, JumpForwardProposer) else ConstrainedProposer(p, constraint) for p in proposers]
        return constraint, proposers
