"""Checkpoint-native multi-token prediction (MTP): the draft layer Qwen3-Next / Qwen3.5
checkpoints ship under `mtp.*`, read from the Hugging Face folder and drafting for
method "mtp".

The structure (vLLM's qwen3_next_mtp.py / qwen3_5_mtp.py, the checkpoints' own names):

    e = pre_fc_norm_embedding(embed(x_{t+1}))      the target's own embedding table
    h = pre_fc_norm_hidden(h_t)                      the target's final hidden state at t,
                                                     after its final norm (what the trunk
                                                     returns; vLLM passes the same)
    x = fc(concat([e, h]))                           embedding first, then hidden
    g = norm(layers.0(x))                            one full-attention decoder layer of
                                                     the model's own class, rope at t
    logits = lm_head(g)                              the target's head: a guess at x_{t+2}

Chaining feeds g and the drafted token back in at t+1, and so on k times. mlx-lm's
loaders drop `mtp.*` (their `sanitize`); `read_mtp_weights` reads them from the
folder's safetensors instead, and `MtpHead.load` maps them onto mlx-lm's classes (the
target's own decoder layer class, made a full-attention layer; experts stacked as
mlx-lm stacks them; Qwen's zero-centred norm weights shifted by one as mlx-lm's
sanitize does for the trunk).

The MTP layer attends over its own KV cache, one per row (`MtpCache`). For every
committed position t it must hold the entry computed from (the target's hidden state at
t, the embedding of x_{t+1}). The engine hands each proposer the target's hidden state
of every input a forward consumed (prefill chunks and rounds alike:
`ModelRunner.keep_all_hidden`, `MtpProposer.observe_hidden`), because the drafts of a
round only see their own guesses, not the target's states: after a verification the
proposer trims its cache back to the first position the target has run since (every
speculative entry goes, accepted or not) and rewrites those positions from the
target's states in the same forward that drafts the next token. The target's own
state (attention by pointer, Gated DeltaNet by replay) is rolled back by the engine's
verified-proposal path as for any proposal.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from .proposal import AdaptiveLength, ObservesHidden, Proposal, RowView

log = logging.getLogger("jumpahead.engine")

# model types whose checkpoints carry `mtp.*` in this layout (vLLM: qwen3_next_mtp, qwen3_5_mtp)
MTP_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
PREFIX = "mtp."
# Qwen's RMSNorms are zero-centred (weight + 1); mlx-lm's sanitize shifts the trunk's, we shift these
_SHIFTED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight",
            "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
_EXPERT = re.compile(r"(layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"(layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)$")
# A row's buffered target hidden states are collapsed into one array past this many rounds
_COMPACT = 64
# A live A/B of method "mtp" on this checkpoint (arms `default` and `default+mtp`: the
# record a drafter keeps as its measured.json, live/drafter_measurement.py), kept beside
# the MTP weights. `serve` adds method "mtp" to the defaults only where it shows MTP
# paying by the drafter's rule (`measured_pays`); without one, MTP is opt-in
# (`--methods echo,mtp`), as every method no measurement has shown paying.
MEASURED = "mtp_measured.json"


class MtpError(ValueError):
    """MTP weights that cannot serve this model (another model type, missing or quantized)."""


def model_type(model: nn.Module) -> str | None:
    return getattr(getattr(model, "args", None), "model_type", None)


def text_args(model: nn.Module) -> Any:
    """The text model's ModelArgs (qwen3_5 nests them under language_model)."""
    inner = getattr(model, "language_model", None)
    return getattr(inner, "args", None) or model.args


# --- reading the weights ------------------------------------------------------------


def _files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(files holding mtp.* tensors, files holding a conv1d weight) of an HF folder."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text()).get("weight_map", {})
        mtp = sorted({folder / f for k, f in weight_map.items() if k.startswith(PREFIX)})
        conv = sorted({folder / f for k, f in weight_map.items() if "conv1d.weight" in k})[:1]
        return mtp, conv
    files = sorted(folder.glob("*.safetensors"))
    return files, files


def read_mtp_weights(folder: str | Path) -> tuple[dict[str, mx.array], bool] | None:
    """The `mtp.*` tensors of a Hugging Face format folder (names as stored), and whether
    the folder's trunk is in Hugging Face layout (a conv1d weight not yet moved by
    mlx-lm's sanitize: then the norms are zero-centred and get shifted). None: no MTP
    weights there (e.g. a folder converted by mlx_lm.convert, which drops them)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return None
    mtp_files, conv_files = _files(folder)
    weights: dict[str, mx.array] = {}
    hf = True  # no conv1d weight to tell by: mtp.* names are Hugging Face names
    for f in dict.fromkeys([*mtp_files, *conv_files]):
        loaded = mx.load(str(f))
        weights.update({k: v for k, v in loaded.items() if k.startswith(PREFIX)})
        conv = next((v for k, v in loaded.items() if "conv1d.weight" in k and not k.startswith(PREFIX)), None)
        if conv is not None and f in conv_files:
            hf = conv.shape[-1] != 1
    return (weights, hf) if weights else None


def _module_weights(raw: dict[str, mx.array], shift: bool) -> dict[str, mx.array]:
    """Checkpoint names -> MtpHead parameter names (layer 0 only; experts stacked)."""
    out: dict[str, mx.array] = {}
    experts: dict[tuple[str, str], dict[int, mx.array]] = {}
    for name, w in raw.items():
        key = name[len(PREFIX):]
        if key.startswith("layers.") and not key.startswith("layers.0."):
            continue  # one MTP layer is used for every step (Qwen's checkpoints have one)
        if key.endswith((".scales", ".biases")) or w.dtype in (mx.uint32, mx.uint8):
            raise MtpError(f"{name}: quantized MTP weights are not supported (use the checkpoint's bf16 ones)")
        m = _EXPERT.search(key)
        if m:
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = w
            continue
        m = _FUSED.search(key)
        if m:  # Qwen3.5 MoE: experts packed as [E, 2I, D] (gate then up) and [E, D, I]
            if m[2] == "gate_up_proj":
                mid = w.shape[-2] // 2
                out[f"{m[1]}.switch_mlp.gate_proj.weight"] = w[..., :mid, :]
                out[f"{m[1]}.switch_mlp.up_proj.weight"] = w[..., mid:, :]
            else:
                out[f"{m[1]}.switch_mlp.down_proj.weight"] = w
            continue
        if shift and w.ndim == 1 and (key == "norm.weight" or key.endswith(_SHIFTED)):
            w = w + 1.0
        out[key] = w
    for (prefix, proj), by_expert in experts.items():
        out[f"{prefix}.switch_mlp.{proj}.weight"] = mx.stack([by_expert[e] for e in sorted(by_expert)])
    return out


# --- the layer ------------------------------------------------------------------------


class MtpHead(nn.Module):
    """fc over (normed embedding, normed hidden), one decoder layer, a final norm
    (parameter names are the checkpoint's without `mtp.`)."""

    def __init__(self, layer_class: type, args: Any) -> None:
        super().__init__()
        dim, eps = args.hidden_size, args.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(dim, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(dim, eps=eps)
        self.fc = nn.Linear(2 * dim, dim, bias=False)
        # the target's own decoder layer class at an index its rule makes full attention
        layer = layer_class(args, layer_idx=getattr(args, "full_attention_interval", 1) - 1)
        if getattr(layer, "is_linear", False):
            raise MtpError(f"{layer_class.__name__}: no full-attention layer for MTP")
        self.layers = [layer]
        self.norm = nn.RMSNorm(dim, eps=eps)

    def __call__(self, hidden: mx.array, embeds: mx.array, cache: Any, mask: Any = "causal") -> mx.array:
        """hidden, embeds [B, L, D] at positions cache.offset.. -> the MTP hidden [B, L, D]
        (`mask`: a batched group's per-row mask, engine/methods/mtp_group.py; else causal)."""
        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], axis=-1))
        if isinstance(mask, str) and x.shape[1] == 1:
            mask = None
        x = self.layers[0](x, mask=mask, cache=cache)
        return self.norm(x)

    @classmethod
    def for_model(cls, model: nn.Module) -> "MtpHead":
        mtype = model_type(model)
        if mtype not in MTP_MODEL_TYPES:
            raise MtpError(f"model type {mtype!r} has no MTP layout here (known: {', '.join(MTP_MODEL_TYPES)})")
        return cls(type(model.layers[0]), text_args(model))

    @classmethod
    def load(cls, folder: str | Path, model: nn.Module) -> "MtpHead":
        """The MTP layer of `model` with the `mtp.*` weights of `folder` (an HF folder:
        the served one, or the original checkpoint of a converted model)."""
        found = read_mtp_weights(folder)
        if found is None:
            raise MtpError(f"{folder}: no mtp.* weights (a Hugging Face format checkpoint folder keeps them; "
                           "mlx_lm.convert drops them)")
        raw, hf = found
        head = cls.for_model(model)
        install_weights(head, _module_weights(raw, shift=hf), model, folder)
        return head

    def logits_fn(self, target_head: Callable[[mx.array], mx.array]) -> Callable[[mx.array], mx.array]:
        """Qwen's MTP layer has no head of its own: the target's."""
        return target_head

    array_mask = False  # the layer takes mlx-lm's "causal" mask (MLA layers do not: mtp_nextn.py)


def install_weights(head: nn.Module, weights: dict[str, mx.array], model: nn.Module, folder: str | Path) -> None:
    """Load an MTP head's weights (strictly) in the target's float dtype."""
    dtype = model.model.embed_tokens.weight.dtype
    if not mx.issubdtype(dtype, mx.floating):  # a quantized target: the MTP layer stays as stored
        dtype = None
    try:
        head.load_weights([(k, v.astype(dtype) if dtype is not None and mx.issubdtype(v.dtype, mx.floating)
                            else v) for k, v in weights.items()], strict=True)
    except ValueError as exc:
        raise MtpError(f"{folder}: the MTP weights do not fit this model's MTP layer ({exc})") from None
    mx.eval(head.parameters())
    head.folder = str(Path(folder).expanduser().resolve())  # where the weights came from (/health)
    # a plain attribute: nn.Module would keep a dict among its parameters
    object.__setattr__(head, "measurement", read_measurement(folder))


def read_measurement(folder: str | Path) -> dict[str, Any] | None:
    """The MTP measurement (MEASURED) beside a checkpoint's MTP weights; None where it
    has none or it cannot be read (an unreadable measurement turns nothing on)."""
    try:
        out = json.loads((Path(folder).expanduser() / MEASURED).read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def measured_pays(measurement: dict[str, Any] | None, adapter_digest: str | None) -> tuple[bool, str]:
    """Whether an MTP layer's recorded live A/B says it pays on the served model, and
    why: the drafter's rule (engine/methods/drafter.py measured_pays: enough paired tasks, the
    95% CI of time saved above zero, no fewer solved, equal outputs, the same adapter)."""
    from .drafter import measured_pays as drafter_rule

    if not measurement:
        return False, (f"no measurement ({MEASURED} beside the MTP weights: a live A/B of arms default and "
                       "default+mtp); opt in with --methods echo,mtp")
    return drafter_rule(measurement, adapter_digest)


class MtpCache:
    """One row's MTP-layer KV, its entries at absolute positions start.. (a row whose
    prompt came from the prefix cache starts where the target's hidden states do).
    `offset` is the absolute position of the next entry: the layer's rope reads it."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.kv = KVCache()

    @property
    def offset(self) -> int:
        return self.start + self.kv.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return self.kv.update_and_fetch(keys, values)

    def causal(self, length: int) -> mx.array:
        """The causal mask [length, cached + length] of the next forward (MLA layers)."""
        cols = mx.arange(self.kv.offset + length)[None, :]
        return cols <= mx.arange(length)[:, None] + self.kv.offset

    def trim_to(self, position: int) -> None:
        """Keep the entries before `position`."""
        self.kv.trim(max(0, self.offset - max(position, self.start)))


# --- method "mtp"'s lifecycle (engine/methods/registry.py Lifecycle) ------------------------------


def load_mtp(engine: Any, spec: str) -> nn.Module | None:
    """The MTP layer `spec` names for `engine`'s model. "auto": the served folder's own
    where the model type has an MTP layout and the folder keeps it (else None, no
    error); a folder: its MTP weights for the served model, or MtpError. Layouts: `mtp.*`
    (qwen3_next, qwen3_5: here), `model.layers.{N}.*` (deepseek_v3, glm4_moe,
    glm4_moe_lite: engine/methods/mtp_nextn.py)."""
    from .mtp_nextn import NEXTN_MODEL_TYPES, NextnHead, nextn_prefix, read_nextn_weights

    model = engine.model
    nextn = model_type(model) in NEXTN_MODEL_TYPES
    if spec == "auto":
        folder = engine.info.path
        if not folder:
            return None
        if not (nextn and read_nextn_weights(folder, nextn_prefix(model)) is not None or
                model_type(model) in MTP_MODEL_TYPES and read_mtp_weights(folder) is not None):
            return None
    else:
        folder = spec
    head = (NextnHead if nextn else MtpHead).load(folder, model)
    log.info("mtp: the MTP layer of %s", folder)
    return head


def attach_mtp(engine: Any, head: nn.Module) -> "Mtp":
    """Method "mtp"'s state: the checkpoint's MTP layer (an MtpHead) with the target's
    embedding and head; the runner keeps the target's hidden state at every input
    (ModelRunner.keep_all_hidden), which the scheduler hands to each row's MtpProposer."""
    runner = engine.runner
    if not runner.split:
        raise MtpError(f"{runner.model_type}: MTP reads the trunk's hidden state, and this model's head "
                       "is not a plain projection of it")
    mx.eval(head.parameters())
    runner.keep_all_hidden = True
    return Mtp(head, engine.model.model.embed_tokens, runner.head)


def mtp_companion(mtp: "Mtp") -> Any:
    """The prefix cache keeps each row's MTP entries beside the target's KV
    (engine/methods/mtp_companion.py), so a warm turn feeds the MTP layer only new positions."""
    from .mtp_companion import MtpCompanion

    return MtpCompanion(mtp.group)


def mtp_pays(engine: Any, mtp: "Mtp") -> tuple[bool, str]:
    """Whether the measurement kept beside the MTP weights says it pays on the served model."""
    return measured_pays(getattr(mtp.head, "measurement", None), engine.info.adapter_digest)


# --- serving ----------------------------------------------------------------------------


class Mtp:
    """The engine's MTP: the layer, the target's embedding and head; one proposer per
    row, all drafting in one batched group (engine/methods/mtp_group.py). `draft` and
    MtpProposer are the per-row path: the group's oracle in the tests."""

    def __init__(self, head: nn.Module, embed: nn.Module, lm_head: Any) -> None:
        self.head = head  # MtpHead, or mtp_nextn.NextnHead
        self.embed = embed
        self.lm_head = head.logits_fn(lm_head)
        self.drafts = 0  # per-row MTP forwards run (tests)
        self._group: Any = None

    def describe(self) -> dict[str, Any]:
        """/health: where the layer came from (the engine adds whether it drafts by default)."""
        return {"folder": getattr(self.head, "folder", None)}

    @property
    def group(self) -> Any:
        """The MtpGroup every row's grouped proposer drafts in (made on first use)."""
        if self._group is None:
            from .mtp_group import MtpGroup

            self._group = MtpGroup(self)
        return self._group

    def proposer(self) -> "MtpProposer":
        from .mtp_group import GroupedMtpProposer

        return GroupedMtpProposer(self.group)

    def draft(self, cache: MtpCache, hidden: mx.array, tokens: list[int], k: int) -> list[int]:
        """Write the entries for the target's hidden states [m, D] at cache.offset.. with
        the tokens after them, then chain k draft tokens from the last one."""
        g = self.head(hidden[None], self.embed(mx.array([tokens], dtype=mx.int32)), cache)[:, -1:, :]
        tok = mx.argmax(self.lm_head(g), axis=-1)  # [1, 1]
        out = [tok]
        for _ in range(k - 1):  # speculative entries: trimmed at the next proposal
            g = self.head(g, self.embed(tok), cache)
            tok = mx.argmax(self.lm_head(g), axis=-1)
            out.append(tok)
        self.drafts += k
        return mx.concatenate(out, axis=1)[0].tolist()


class MtpProposer(AdaptiveLength, ObservesHidden):
    """Verified proposals of kind "mtp" for one row, from its own MtpCache; the length
    adapts to the row's acceptance as the drafter's does, and a row it keeps missing rests."""

    name = "mtp"

    def __init__(self, mtp: Mtp, k: int = 3, max_k: int = 6) -> None:
        super().__init__(k, max_k)
        self.mtp = mtp
        self.cache: MtpCache | None = None
        # target hidden states not yet written into the cache: (first position, [m, D])
        self.pending: list[tuple[int, mx.array]] = []

    def observe_hidden(self, position: int, hidden: mx.array) -> None:
        """The target's hidden states of the inputs a forward consumed, from `position`
        (the scheduler calls this after every prefill chunk and round)."""
        if self.pending and self.pending[-1][0] + self.pending[-1][1].shape[0] != position:
            self.pending = []  # not contiguous (cannot happen in the engine): start over from here
        self.pending.append((position, hidden))
        if len(self.pending) > _COMPACT:  # a row that has not drafted for long: one array, no graph
            first = self.pending[0][0]
            joined = mx.concatenate([h for _, h in self.pending], axis=0)
            mx.eval(joined)
            self.pending = [(first, joined)]

    def take(self, view: RowView) -> tuple[int, mx.array, list[int]] | None:
        """The target's states not yet written, consumed: (their first position, [m, D]
        up to the pending token's predecessor, the token after each); None while the
        states up to the pending token are not all here."""
        n = len(view.tokens) - 1  # the pending token's position
        if n < view.prompt_len or not self.pending:
            return None
        first = self.pending[0][0]
        hidden = mx.concatenate([h for _, h in self.pending], axis=0) if len(self.pending) > 1 else self.pending[0][1]
        if first + hidden.shape[0] != n:
            return None
        self.pending = []
        return first, hidden, list(view.tokens[first + 1: n + 1])

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self.resting():
            return None
        k = min(self.k, max_len)
        taken = self.take(view) if k > 0 else None
        if taken is None:
            return None
        first, hidden, tokens = taken
        if self.cache is None or first < self.cache.start or first > self.cache.offset:
            self.cache = MtpCache(first)  # (a gap: the MTP context restarts at the states it has)
        else:
            self.cache.trim_to(first)  # drop the last draft's speculative entries
        return Proposal(self.mtp.draft(self.cache, hidden, tokens, k), "mtp")
