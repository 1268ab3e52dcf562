"""The learned drafter: a small head trained for one target model proposes next tokens.

EAGLE-style: the target's final hidden state h_t at the position that chose the row's
pending token x_{t+1}, and that token's embedding (the target's own table), go through
one fused layer (two input norms, a projection of both to the model width, a SwiGLU
block) to a predicted hidden state h'_{t+1}; a head over a reduced draft vocabulary
(the tokens the target emits most often in the training data, `d2t`) gives the draft
token x_{t+2}. Chaining feeds h'_{t+1} and the drafted token back in, k times.

The layer has no attention and so no cache: a row's whole draft state is one vector
the target computes anyway, which lives in the group (Row.hidden) and needs no
rollback after a rejection and no re-prefill on a warm turn. Every row's chain runs in
one batched forward per step (`DrafterGroup`); the target verifies the tokens like any
verified proposal, so outputs equal ordinary decoding at any temperature.

The head is trained by `jumpahead train-drafter` (training/train_drafter.py) from the
target's own greedy outputs and is tied to that target: `Drafter.load` refuses a
drafter whose target fingerprint (model type, width, vocabulary, a digest of the
embedding table) is not the served model's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now
import mlx.nn as nn
import numpy as np

from .proposal import AdaptiveLength, DraftsInGroup, Proposal, RowView

log = logging.getLogger("jumpahead.engine")

DRAFTER_VERSION = 1
WEIGHTS = "drafter.safetensors"
CONFIG = "drafter.json"
# A live A/B of this drafter on the model it serves (`jumpahead live --arms
# default,default+drafter --record-drafter`): `serve` makes method "drafter" a default
# only where this record shows it paying (`measured_pays`).
MEASURED = "measured.json"
# The least paired tasks a measurement needs before it may turn the drafter on.
MIN_PAIRED_TASKS = 30


class DrafterError(ValueError):
    """A drafter that cannot serve this target (another model, a missing file)."""


def input_embedding(model: nn.Module) -> nn.Module | None:
    """The token embedding a drafter reads: `model.model.embed_tokens` where mlx-lm's
    decoder keeps it, else the model's only embedding table wherever the family keeps
    it (`transformer.wte`, `backbone.embeddings`, a multimodal wrapper's language
    model); None where there is none or several (nothing to tie a drafter to)."""
    trunk = getattr(model, "model", None)
    embed = getattr(trunk, "embed_tokens", None) if isinstance(trunk, nn.Module) else None
    embed = getattr(embed, "original", embed)  # the module behind an engine stand-in (engine/kv/row_gemv.py)
    if isinstance(embed, nn.Module):
        return embed
    tables = [m for _, m in model.named_modules() if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding))]
    return tables[0] if len(tables) == 1 else None


def target_fingerprint(model: nn.Module) -> dict[str, Any]:
    """What ties a drafter to its target: width, vocabulary and a digest of the embedding."""
    table = input_embedding(model)
    if table is None or not hasattr(table, "weight"):
        raise DrafterError(f"{type(model).__module__}: no single token embedding table to tie a drafter to")
    embed = table.weight
    rows = np.array(embed[:: max(1, embed.shape[0] // 64)].astype(mx.float32))
    digest = hashlib.sha256(np.round(rows, 4).tobytes()).hexdigest()[:16]
    args = getattr(model, "args", None)
    return {"model_type": getattr(args, "model_type", None), "dim": int(embed.shape[1]),
            "vocab": int(embed.shape[0]), "embed_digest": digest}


class Drafter(nn.Module):
    """The trained layer and its draft-vocabulary head (see the module docstring)."""

    folder: str | None = None  # the folder `load` read it from (/health); None: built in memory

    def __init__(self, dim: int, ffn: int, draft_vocab: int) -> None:
        super().__init__()
        self.norm_h = nn.RMSNorm(dim)
        self.norm_e = nn.RMSNorm(dim)
        self.fc = nn.Linear(2 * dim, dim, bias=False)
        self.norm_x = nn.RMSNorm(dim)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)
        self.norm_out = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, draft_vocab, bias=False)
        self.d2t = mx.zeros((draft_vocab,), dtype=mx.int32)  # draft index -> target token id (frozen)
        self.freeze(keys=["d2t"], recurse=False)
        self.dim, self.ffn, self.draft_vocab = dim, ffn, draft_vocab  # ints: plain attributes

    def step(self, h: mx.array, e: mx.array) -> tuple[mx.array, mx.array]:
        """(h_t, embedding of x_{t+1}) [..., D] -> (h'_{t+1}, draft logits over d2t)."""
        x = self.fc(mx.concatenate([self.norm_h(h), self.norm_e(e)], axis=-1))
        y = self.norm_x(x)
        x = x + self.down(nn.silu(self.gate(y)) * self.up(y))
        return x, self.head(self.norm_out(x))

    def chain(self, embed: nn.Module, hidden: mx.array, tokens: mx.array, k: int) -> mx.array:
        """k greedy draft tokens per row (lazy [B, k] target ids) from hidden [B, D]
        and the rows' pending tokens [B]."""
        out = []
        h, tok = hidden, tokens
        for _ in range(k):
            h, logits = self.step(h, embed(tok))
            tok = self.d2t[mx.argmax(logits, axis=-1)]
            out.append(tok)
        return mx.stack(out, axis=1)

    # --- files ---------------------------------------------------------------------

    def save(self, folder: str | Path, fingerprint: dict[str, Any], info: dict[str, Any] | None = None) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = {k: v.astype(mx.float16) if v.dtype == mx.float32 else v
                   for k, v in dict(_flatten(self.parameters())).items()}
        mx.save_safetensors(str(folder / WEIGHTS), weights)
        meta = {"drafter_version": DRAFTER_VERSION, "dim": self.dim, "ffn": self.ffn,
                "draft_vocab": self.draft_vocab, "target": fingerprint, **(info or {})}
        (folder / CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path, target: nn.Module | None = None) -> "Drafter":
        """Read a drafter folder; with `target`, refuse one trained for another model."""
        folder = Path(folder)
        meta = read_meta(folder)
        if meta.get("drafter_version") != DRAFTER_VERSION:
            raise DrafterError(f"{folder}: drafter version {meta.get('drafter_version')} is not {DRAFTER_VERSION}; "
                               "train it again (jumpahead train-drafter)")
        if target is not None:
            want, have = meta.get("target") or {}, target_fingerprint(target)
            if want != have:
                diff = ", ".join(f"{k}: {want.get(k)!r} vs served {have[k]!r}" for k in have if want.get(k) != have[k])
                raise DrafterError(f"{folder} was trained for another model ({diff}); a drafter serves only "
                                   "the target it was trained on")
        drafter = cls(int(meta["dim"]), int(meta["ffn"]), int(meta["draft_vocab"]))
        weights = mx.load(str(folder / WEIGHTS))
        drafter.load_weights([(k, v.astype(mx.float32) if v.dtype == mx.float16 else v) for k, v in weights.items()])
        mx.eval(drafter.parameters())
        drafter.folder = str(folder.resolve())  # where it came from (/health)
        # a plain attribute: nn.Module would keep a dict among its parameters
        object.__setattr__(drafter, "measurement", read_measurement(folder))
        return drafter


def read_meta(folder: str | Path) -> dict[str, Any]:
    """A drafter folder's drafter.json (how it was trained, for whom)."""
    try:
        return json.loads((Path(folder) / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise DrafterError(f"{folder} is not a drafter folder (no readable {CONFIG}: {exc})") from None


def _flatten(tree: Any, prefix: str = "") -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return tree_flatten(tree, prefix=prefix)


# --- serving: one group per engine, one proposer per row ------------------------------


class DrafterGroup:
    """Drafts for every row of a round in one batched chain.

    The scheduler calls `start_round` and then `offer(proposer, view)` for each row
    whose proposers include one of ours, before any row proposes; the first proposer
    that asks computes the chain for all offered rows at once (none if no row asks:
    a round where no verified token can pay spends nothing here)."""

    def __init__(self, drafter: Drafter, embed: nn.Module) -> None:
        self.drafter = drafter
        self.embed = embed
        self.offered: list[tuple["DrafterProposer", RowView]] = []
        self.results: dict[int, list[int]] = {}
        self.chains = 0  # batched chains run (benches, tests)
        self.rows_drafted = 0

    def start_round(self) -> None:
        self.offered = []
        self.results = {}

    def offer(self, proposer: "DrafterProposer", view: RowView) -> None:
        if view.hidden is not None and proposer.cooldown == 0:
            self.offered.append((proposer, view))

    def draft(self, proposer: "DrafterProposer", view: RowView, k: int) -> list[int]:
        if id(proposer) not in self.results:
            batch = [(p, v) for p, v in self.offered if id(p) not in self.results]
            if not any(p is proposer for p, _ in batch):
                batch.append((proposer, view))  # asked without an offer (one row, a test)
            width = max(p.k for p, _ in batch)
            hidden = mx.stack([v.hidden for _, v in batch])
            tokens = mx.array([v.tokens[-1] for _, v in batch], dtype=mx.int32)
            table = self.drafter.chain(self.embed, hidden.astype(mx.float32), tokens, width).tolist()
            self.chains += 1
            self.rows_drafted += len(batch)
            for (p, _), row in zip(batch, table):
                self.results[id(p)] = row
        return self.results.pop(id(proposer))[:k]


class DrafterProposer(AdaptiveLength, DraftsInGroup):
    """Per-row proposals (verified, kind "drafter") from the shared DrafterGroup; the
    length adapts to the row's acceptance, and a row the drafter keeps missing rests."""

    name = "drafter"

    def __init__(self, group: DrafterGroup, k: int = 4, max_k: int = 6) -> None:
        super().__init__(k, max_k)
        self.round_group = group

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self.resting():
            return None
        k = min(self.k, max_len)
        if k <= 0 or view.hidden is None or len(view.tokens) <= view.prompt_len:
            return None  # (before the first token, the pending one is not chosen yet)
        return Proposal(self.round_group.draft(self, view, k), "drafter")



def read_measurement(folder: str | Path) -> dict[str, Any] | None:
    """A drafter folder's measured.json (None where it has none or it cannot be read:
    an unreadable measurement turns nothing on)."""
    try:
        out = json.loads((Path(folder) / MEASURED).read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def measured_pays(measurement: dict[str, Any] | None, adapter_digest: str | None) -> tuple[bool, str]:
    """Whether a drafter's recorded live A/B says it pays for the served model, and why.

    It pays where `default+drafter` against `default`, on the same model (the same
    adapter digest, or both the base model), over at least MIN_PAIRED_TASKS seeds both
    solved: saved time to success with the whole 95% CI above zero, no fewer tasks
    solved, and the same output on every seed (an exact method that changed one is a
    bug, not a saving). The figures are read, not a recorded verdict."""
    if not measurement:
        return False, "no measurement (jumpahead live --arms default,default+drafter --record-drafter)"
    try:
        versus = measurement["versus"]
        saved = versus["tts_s_saved_per_task"]
        solved = versus["successes"]
        measured_digest = (measurement.get("adapter") or {}).get("digest")
        if measured_digest != adapter_digest:
            return False, f"measured with adapter {measured_digest}, served with {adapter_digest}"
        if int(versus["paired_tasks"]) < MIN_PAIRED_TASKS:
            return False, f"{versus['paired_tasks']} paired tasks measured (at least {MIN_PAIRED_TASKS})"
        if int(versus["outputs_equal"]) != int(versus["seeds"]):
            return False, f"outputs differed on {int(versus['seeds']) - int(versus['outputs_equal'])} seeds"
        if int(solved[measurement["arm"]]) < int(solved[versus["base"]]):
            return False, f"solved {solved[measurement['arm']]} against {solved[versus['base']]}"
        if saved["lo"] is None or float(saved["lo"]) <= 0:
            return False, f"saved {saved['mean']} s per task, 95% CI from {saved['lo']}: not above zero"
    except (KeyError, TypeError, ValueError) as exc:
        return False, f"unreadable measurement ({type(exc).__name__}: {exc})"
    return True, (f"saved {saved['mean']:.2f} s per task (95% CI {saved['lo']:.2f} to {saved['hi']:.2f}) "
                  f"over {versus['paired_tasks']} tasks, outputs equal on all {versus['seeds']}")


# --- method "drafter"'s lifecycle (engine/methods/registry.py Lifecycle) ---------------------------


def load_drafter(engine: Any, spec: str) -> "Drafter | None":
    """The drafter `spec` names (auto|PATH) for `engine`'s model (DrafterError: not for it).

    'auto' loads the drafter trained for the served model: with a LoRA adapter fused, the
    adapter's own (`<adapter>/drafter`, `train-drafter --adapter`) where it has one,
    else the one shipped for the default model, only where the served model is the one
    it was trained for (any other model: None, no error)."""
    auto = spec == "auto"
    path = Path(spec)
    if auto:
        adapter = engine.info.adapter
        path = adapter_drafter_path(adapter) if adapter and adapter_drafter_path(adapter).is_dir() \
            else default_drafter_path()
        if not path.is_dir():
            return None
    try:
        drafter = Drafter.load(path, target=engine.model)
    except DrafterError as exc:
        if not auto:
            raise
        log.info("drafter: the shipped one is not for this model (%s)", exc)
        return None
    log.info("drafter: %s", path)
    return drafter


def attach_drafter(engine: Any, drafter: Drafter) -> "DrafterGroup":
    """Method "drafter"'s state: rows keep the target's hidden state
    (ModelRunner.keep_hidden) and draft together in one DrafterGroup."""
    runner = engine.runner
    if not runner.split:
        raise DrafterError(f"{runner.model_type}: a drafter reads the trunk's hidden state, and this "
                           "model's head is not a plain projection of it")
    mx.eval(drafter.parameters())  # arrays made lazily elsewhere must exist before the engine thread reads them
    runner.keep_hidden = True
    return DrafterGroup(drafter, runner.trunk.embed_tokens)


def drafter_pays(engine: Any, group: "DrafterGroup") -> tuple[bool, str]:
    """Whether the drafter's own live A/B on the served model says it pays (`measured_pays`)."""
    return measured_pays(getattr(group.drafter, "measurement", None), engine.info.adapter_digest)


def default_drafter_path() -> Path:
    """The drafter trained for the default model, shipped in engine/weights/ (its README lists
    the shipped weights)."""
    return Path(__file__).resolve().parents[1] / "weights" / "drafters" / "smollm2-135m"


def adapter_drafter_path(adapter: str | Path) -> Path:
    """The drafter trained for a model with this LoRA adapter fused (`train-drafter
    --adapter`): the adapter's own drafter/ folder, so the two travel together."""
    return Path(adapter) / "drafter"
