"""The draft-model method: a second, smaller mlx-lm model proposes the next tokens.

`DraftModel` holds the draft's weights (shared by every row) and refuses, when it is
built, a draft whose tokenizer is not the target's: proposals are token ids, so both
models must give every id the same meaning. Each row gets a `DraftProposer` with its
own mlx-lm KV cache. Between rounds the proposer syncs that cache with the row's
committed tokens (trim back to the longest common prefix with what the draft has
consumed, then feed what is missing) and proposes k greedy draft tokens; the target
verifies them like any verified proposal, so the row's output is the same as without
the draft, at any temperature. k adapts to the row's acceptance.

No second real model can be downloaded here: `ensure_draft_model(n_layers)` writes a
layer-truncated copy of the default model (same tokenizer, first blocks plus the
shared head) into the cache directory, once.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .model_runner import ModelRunner
from .proposal import Proposal, RowView

DRAFT_VERSION = 1
FEED_CHUNK = 512  # most tokens one draft forward consumes while catching up


class DraftModelError(ValueError):
    """A draft model that cannot serve this target (tokenizer family, cache kind)."""


# --- tokenizer family check ----------------------------------------------------------


def _hf(tok: Any) -> Any:
    return getattr(tok, "_tokenizer", tok)


PROBE_TEXT = "def f(x):\n    return x + 1  # héllo, 世界 <|im_end|>\n\t{\"key\": [1, 2.5e-3]}"


def tokenizer_differences(target: Any, draft: Any) -> list[str]:
    """Why `draft`'s tokenizer is not `target`'s family ([] when they agree).

    Compares the vocabularies (size and every token -> id), the special tokens, and
    how a probe text is encoded (merges). EOS ids are not compared: the target alone
    decides where a row stops.
    """
    a, b = _hf(target), _hf(draft)
    out: list[str] = []
    na, nb = len(a), len(b)
    if na != nb:
        out.append(f"vocabulary size {nb} != target's {na}")
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        bad = [(t, i, vb.get(t)) for t, i in va.items() if vb.get(t) != i]
        shown = ", ".join(f"{t!r}: {j} vs {i}" for t, i, j in sorted(bad, key=lambda x: x[1])[:3])
        out.append(f"{len(bad)} of {len(va)} tokens map to other ids ({shown})")
    sa, sb = set(a.all_special_tokens), set(b.all_special_tokens)
    if sa != sb:
        out.append(f"special tokens differ (draft only: {sorted(sb - sa)[:3]}, target only: {sorted(sa - sb)[:3]})")
    if not out and a.encode(PROBE_TEXT) != b.encode(PROBE_TEXT):
        out.append("the same text encodes to other ids (merges differ)")
    return out


# --- the model and its per-row proposers ---------------------------------------------


class DraftModel:
    """A loaded draft model; `proposer()` makes one DraftProposer per row."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        info: Any = None,
        target_tokenizer: Any = None,
        k: int = 4,
        max_k: int = 8,
    ) -> None:
        if not can_trim_prompt_cache(make_prompt_cache(model)):
            raise DraftModelError(
                "the draft model's cache cannot be trimmed (recurrent layers): "
                "a draft needs to roll back rejected tokens"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.k = k
        self.max_k = max_k
        runner = ModelRunner(model)  # reuse its head detection: project only the last position
        self.split, self.head = runner.split, getattr(runner, "head", None)
        if target_tokenizer is not None:
            self.check_compatible(target_tokenizer)

    @property
    def name(self) -> str:
        return getattr(self.info, "name", None) or "draft"

    def check_compatible(self, target_tokenizer: Any) -> None:
        """Raise DraftModelError when the draft's tokenizer is not the target's family."""
        diffs = tokenizer_differences(target_tokenizer, self.tokenizer)
        if diffs:
            raise DraftModelError(
                f"draft model {self.name!r} has another tokenizer than the target model: "
                + "; ".join(diffs)
                + ". A draft must share the target's tokenizer (same family)."
            )

    @classmethod
    def load(
        cls,
        path: str | Path,
        target_tokenizer: Any = None,
        progress: Callable[[str], None] = print,
        **kwargs: Any,
    ) -> "DraftModel":
        from .loader import load_model

        model, tokenizer, info = load_model(str(path), progress=progress)
        return cls(model, tokenizer, info, target_tokenizer, **kwargs)

    def proposer(self) -> "DraftProposer":
        return DraftProposer(self, self.k, self.max_k)

    def logits_last(self, tokens: list[int], cache: list[Any]) -> mx.array:
        """Feed `tokens` into `cache`; logits [V] of the last position (lazy)."""
        x = mx.array([tokens], dtype=mx.int32)
        if self.split:
            hidden = self.model.model(x, cache=cache)
            return self.head(hidden[:, -1:, :])[0, -1]
        return self.model(x, cache=cache)[0, -1]


class DraftProposer:
    """Per-row draft proposals (verified, kind "draft") from the row's own draft cache."""

    name = "draft"

    def __init__(self, draft: DraftModel, k: int = 4, max_k: int = 8) -> None:
        self.draft = draft
        self.cache = make_prompt_cache(draft.model)
        self.consumed: list[int] = []  # tokens in self.cache, in order
        self.settled = 0  # consumed[:settled] are committed tokens of the row: never trimmed
        self.k = k
        self.max_k = max_k
        self.cooldown = 0
        self.misses = 0
        self.forwards = 0  # draft forwards run (for benches)

    def _sync(self, tokens: list[int] | Any) -> mx.array:
        """Make the cache hold `tokens`; return the logits after the last one."""
        n = len(tokens)
        lcp = self.settled
        limit = min(len(self.consumed), n - 1)  # feed at least one token to get logits
        while lcp < limit and self.consumed[lcp] == tokens[lcp]:
            lcp += 1
        lcp = min(lcp, limit)
        extra = len(self.consumed) - lcp
        if extra:
            trim_prompt_cache(self.cache, extra)
            del self.consumed[lcp:]
        feed = list(tokens[lcp:])
        logits = None
        for i in range(0, len(feed), FEED_CHUNK):
            part = feed[i : i + FEED_CHUNK]
            logits = self.draft.logits_last(part, self.cache)
            self.forwards += 1
            if i + FEED_CHUNK < len(feed):
                mx.eval([c.state for c in self.cache])
        self.consumed += feed
        self.settled = n  # the row's tokens up to its pending one are committed
        return logits

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self.cooldown > 0:
            self.cooldown -= 1
            return None
        k = min(self.k, max_len)
        if k <= 0:
            return None
        logits = self._sync(view.tokens)
        out: list[int] = []
        while True:
            tok = int(mx.argmax(logits).item())
            out.append(tok)
            if len(out) == k:
                break
            logits = self.draft.logits_last([tok], self.cache)
            self.forwards += 1
            self.consumed.append(tok)
        return Proposal(out, "draft")

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        k = len(proposal.tokens)
        if accepted == k:
            self.k = min(self.max_k, self.k + 2)
            self.misses = 0
        elif accepted == 0:
            self.k = max(1, self.k // 2)
            self.misses += 1
            if self.misses >= 3:  # the draft keeps missing here: stop paying for it a while
                self.cooldown = 2 * self.misses
        else:
            self.k = max(1, accepted + 1)
            self.misses = 0


# --- producing a draft: a truncated copy of the default model -------------------------


def ensure_draft_model(
    n_layers: int = 4,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """The default model's first `n_layers` blocks plus its head, as an mlx-lm folder.

    Built once in the cache directory (beside the default model) with the default
    model's conversion code (`truncate_layers`); same tokenizer, so it passes the
    family check. Returns the folder, for `DraftModel.load` or `serve --draft-model`.
    """
    from .default_model import (
        MODEL_NAME,
        _install,
        _remove_stale_temps,
        default_cache_dir,
        ensure_default_model,
        is_complete,
        truncate_layers,
    )

    src = ensure_default_model(cache_dir, progress=progress)
    name = f"{MODEL_NAME}-draft-{n_layers}L"
    target = Path(cache_dir or default_cache_dir()) / "models" / name
    marker = target / "jumpahead.json"
    if is_complete(target):
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
        if info.get("draft_version") == DRAFT_VERSION and info.get("n_layers") == n_layers:
            return target
    _remove_stale_temps(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        progress(f"writing draft model {name} (first {n_layers} layers of {MODEL_NAME})")
        truncate_layers(src, tmp, n_layers)
        src_marker = json.loads((src / "jumpahead.json").read_text())
        src_marker.update({"model": name, "draft_of": MODEL_NAME, "n_layers": n_layers,
                           "draft_version": DRAFT_VERSION})
        (tmp / "jumpahead.json").write_text(json.dumps(src_marker, indent=2) + "\n")
        _install(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m jumpahead.engine.draft [--layers N]`: build the draft, print its path."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m jumpahead.engine.draft", description=main.__doc__)
    p.add_argument("--layers", type=int, default=4, help="blocks of the default model to keep (default 4)")
    args = p.parse_args(argv)
    print(ensure_draft_model(args.layers, progress=lambda s: print(s, flush=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
