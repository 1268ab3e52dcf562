"""One decode row of a Llama-shaped model in numpy and the bound BLAS, outside MLX's graph.

At one row a CPU decode step reads every weight once, and the sgemv stand-ins
(engine/kv/row_gemv.py) read them near the machine's rate. What is left of the step is
not arithmetic: MLX's per-node dispatch (~2,200 nodes a step of the default model), a
hand-off to MLX's stream before every linear, and Python building the graph: ~20 of a
~50 ms step at 512 tokens of context on a 2-core EPYC (`jumpahead bench roofline`,
BENCHMARKS.md, issue 42). MLX has no way to run a layer without its graph, so for one
row of one token this module runs the whole step itself: norms, RoPE, the softmax and
swiglu in numpy, the linears through `cblas_sgemv` on the weights' own buffers (no
copy), the attention through numpy's matmul over views of the engine's cache. Keys and
values are written by the cache's own `update_and_fetch` (one small MLX evaluation a
layer), so the cache's growth, rollback and sharing rules stay the cache's.

Which models: read from the modules, never from a name. Every layer must hold exactly
an attention of q/k/v/o `nn.Linear`s and an `nn.RoPE` over the whole head, an MLP of
gate/up/down `nn.Linear`s, and two `nn.RMSNorm`s; the trunk an embedding, the layers
and a final `nn.RMSNorm`; the head a tied embedding or an `nn.Linear`; float32, every
layer full attention, an unquantized KV cache. What the modules compute with those
parts (the residual order, silu vs another activation, the attention scale) is then
verified by running (`verify`): a short prompt decoded both ways over the engine's own
cache must give logits within `MAX_REL` of MLX's at every step. Where anything fails,
nothing is installed and `/health` (`layers.host_decode`) says why. It is installed
only where measured faster than the engine's MLX step here. `JUMPAHEAD_HOST_DECODE=off`
keeps MLX's step; `=on` installs wherever verified, unmeasured.

Not MLX's bits: sums run in other orders (sgemv, numpy's exp), as a row alone already
differs from the same row in a batch (engine/kv/row_gemv.py), so the engine's oracles
are token-level with near-ties proved (tests/oracle.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..machine.cblas import Cblas, bound_cblas
from .cache_layout import FULL
from .row_gemv import env_mode

ENV = "JUMPAHEAD_HOST_DECODE"
# Logits within this fraction of their largest magnitude of MLX's at every verified step
# (measured: 1e-6 relative on the default model; a wrong activation or a missing RoPE
# moves them by whole units)
MAX_REL = 1e-4
MIN_GAIN = 1.1  # installed only where at least this much faster than MLX's step
VERIFY_PROMPT = 12
VERIFY_STEPS = 4
TIMING_ROUNDS = 2
RUN_STEPS = 3
# Rows one step serves where measured faster: the batch the load-time timing runs (more
# rows stay with MLX's step, unmeasured)
ROWS = 4
# Rows read each weight through sgemm as MLX's step does: the host step saves only the
# graph and its dispatch (1.07-1.15x measured at 4 rows here), so a smaller margin
ROWS_MIN_GAIN = 1.05

_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj", "rope"}
_MLP = {"gate_proj", "up_proj", "down_proj"}
_LAYER = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_TRUNK = {"embed_tokens", "layers", "norm"}


def _w(module: nn.Module, sources: list, name: str = "weight") -> np.ndarray:
    """A numpy view of a float32 parameter's own buffer (no copy); the parameter is held
    in `sources` (the view reads its buffer; `HostDecoder.current` checks it is still the
    module's)."""
    a = module[name]
    mx.eval(a)
    sources.append((module, name, a))
    return np.asarray(a)


@dataclass
class _Layer:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    norm1: np.ndarray
    norm2: np.ndarray
    eps1: float
    eps2: float
    scale: float


def _parts(module: nn.Module) -> set[str]:
    """The names of a module's parameters and submodules (not its plain lists of names)."""
    return {k for k, v in module.items()
            if isinstance(v, (nn.Module, mx.array)) or (isinstance(v, list) and v and isinstance(v[0], nn.Module))}


def _shape_of(model: nn.Module, layout: list) -> str | None:
    """Why this model is not Llama-shaped as this module runs it; None when it is."""
    trunk = model.get("model") if isinstance(model, dict) else None
    if not isinstance(trunk, nn.Module) or _parts(trunk) != _TRUNK or _parts(model) - {"model", "lm_head"} \
            or not isinstance(trunk["layers"], list) or not all(isinstance(x, nn.Module) for x in trunk["layers"]):
        return "the model is not a trunk of embed_tokens, layers and norm and a head"
    if any(kind.kind != FULL for kind in layout):
        return "not every layer is full attention"
    if any(a.dtype != mx.float32 for _, a in tree_flatten(model.parameters())):
        return "not every parameter is float32 (sgemv and the views read float32)"
    if type(trunk["embed_tokens"]) is not nn.Embedding or type(trunk["norm"]) is not nn.RMSNorm:
        return "the embedding or the final norm is not mlx's own class"
    head = model.get("lm_head")
    if head is not None and (type(head) is not nn.Linear or "bias" in head):
        return "the head is not a plain nn.Linear"
    for layer in trunk["layers"]:
        if _parts(layer) != _LAYER:
            return f"a layer holds {sorted(_parts(layer))}"
        attn, mlp = layer["self_attn"], layer["mlp"]
        if _parts(attn) != _ATTENTION or _parts(mlp) != _MLP:
            return "an attention or MLP holds other parts"
        for lin in [attn[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + [mlp[n] for n in _MLP]:
            if type(lin) is not nn.Linear or "bias" in lin or lin["weight"].dtype != mx.float32:
                return "a linear layer is not a float32 nn.Linear without bias"
        rope = attn["rope"]
        if type(rope) is not nn.RoPE or getattr(rope, "dims", None) is None:
            return "the rotary embedding is not nn.RoPE"
        for norm in (layer["input_layernorm"], layer["post_attention_layernorm"]):
            if type(norm) is not nn.RMSNorm:
                return "a norm is not nn.RMSNorm"
        if not isinstance(getattr(attn, "scale", None), float):
            return "the attention has no float scale"
    return None


class HostDecoder:
    """The step: `logits(token, cache)` for one row of one token at the cache's plan."""

    def __init__(self, model: nn.Module, cb: Cblas) -> None:
        self.cb = cb
        trunk = model["model"]
        self.sources: list[tuple[nn.Module, str, mx.array]] = []
        w = lambda module: _w(module, self.sources)  # noqa: E731
        self.embed = w(trunk["embed_tokens"])
        head = model.get("lm_head")
        self.head = self.embed if head is None else w(head)
        self.norm = w(trunk["norm"])
        self.eps = float(trunk["norm"].eps)
        self.layers: list[_Layer] = []
        rope = trunk["layers"][0]["self_attn"]["rope"]
        self.traditional = bool(rope.traditional)
        self.rope_dims = int(rope.dims)
        self.inv_freq = (float(rope.scale) / (float(rope.base) ** (np.arange(0, rope.dims, 2) / rope.dims))
                         ).astype(np.float32)
        for layer in trunk["layers"]:
            attn, mlp = layer["self_attn"], layer["mlp"]
            r = attn["rope"]
            if (r.dims, r.traditional, r.base, r.scale) != (rope.dims, rope.traditional, rope.base, rope.scale):
                raise ValueError("layers rotate differently")
            self.layers.append(_Layer(
                w(attn["q_proj"]), w(attn["k_proj"]), w(attn["v_proj"]), w(attn["o_proj"]),
                w(mlp["gate_proj"]), w(mlp["up_proj"]), w(mlp["down_proj"]),
                w(layer["input_layernorm"]), w(layer["post_attention_layernorm"]),
                float(layer["input_layernorm"].eps), float(layer["post_attention_layernorm"].eps),
                float(attn.scale)))
        first = self.layers[0]
        self.kv_heads = getattr(trunk["layers"][0]["self_attn"], "n_kv_heads", None)
        self.heads = getattr(trunk["layers"][0]["self_attn"], "n_heads", None)
        if not isinstance(self.heads, int) or not isinstance(self.kv_heads, int):
            raise ValueError("the attention does not say its head counts (n_heads, n_kv_heads)")
        self.head_dim = first.q.shape[0] // self.heads
        if self.head_dim * self.heads != first.q.shape[0] or first.k.shape[0] != self.kv_heads * self.head_dim \
                or self.heads % self.kv_heads or self.rope_dims != self.head_dim:
            raise ValueError("head shapes do not divide as one RoPE over the whole head")
        self.rep = self.heads // self.kv_heads
        hidden, inter = first.q.shape[1], first.gate.shape[0]
        self._q = np.empty(self.heads * self.head_dim, np.float32)
        self._k = np.empty(self.kv_heads * self.head_dim, np.float32)
        self._v = np.empty(self.kv_heads * self.head_dim, np.float32)
        self._a = np.empty(hidden, np.float32)
        self._g = np.empty(inter, np.float32)
        self._u = np.empty(inter, np.float32)
        self.timers: dict[str, float] | None = None
        self.steps = 0  # steps taken (tests check the served path reaches it)
        self.row_steps = 0  # of them, steps of more than one row
        self.max_rows = 1  # rows a step serves: more where install measured the rows' step faster
        self.per_row: set[tuple[int, int]] = set()  # weight shapes rows read by sgemv a row (`calibrate`)

    def current(self) -> bool:
        """The model still holds the parameters the views read (an adapter can replace them)."""
        return all(module[name] is a for module, name, a in self.sources)

    def _rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """nn.RoPE over [..., heads, D] (cos/sin broadcast over the heads: one position, or
        [rows, 1, D/2] for one position a row)."""
        if self.traditional:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x1 * sin + x2 * cos
            return out
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def logits(self, tokens: list[int], cache: Any) -> mx.array:
        """Logits [B, 1, V] of each row's one token, written at the row's plan start."""
        self.steps += 1
        if len(tokens) == 1:
            return self._row(tokens[0], cache)
        self.row_steps += 1
        return self._rows(tokens, cache)

    def _row(self, token: int, cache: Any) -> mx.array:
        """One row: every linear through sgemv (it reads a weight at about twice sgemm's
        one-row rate)."""
        cb, H, Hkv, D, rep = self.cb, self.heads, self.kv_heads, self.head_dim, self.rep
        timers = self.timers  # `bench roofline`'s split of the step; None when serving
        clock = time.perf_counter
        t_start = clock()
        weights_s = attention_s = 0.0
        pos = cache.layers[0].plan.starts[0]
        ang = np.float32(pos) * self.inv_freq
        cos, sin = np.cos(ang), np.sin(ang)
        q, k, v, a, g, u = self._q, self._k, self._v, self._a, self._g, self._u
        x = self.embed[token].copy()
        writes: list[mx.array] = []
        for layer, lc in zip(self.layers, cache.layers):
            h = _rms(x, layer.norm1, layer.eps1)
            if timers is not None:
                t0 = clock()
            cb.sgemv(layer.q, h, q)
            cb.sgemv(layer.k, h, k)
            cb.sgemv(layer.v, h, v)
            if timers is not None:
                t1 = clock()
                weights_s += t1 - t0
            kr = self._rope(k.reshape(Hkv, D), cos, sin)
            vr = v.reshape(Hkv, D)
            qr = self._rope(q.reshape(H, D), cos, sin).reshape(Hkv, rep, D) * np.float32(layer.scale)
            # the keys before this token from the cache's buffer as the last evaluation left
            # it (a numpy view), this token's own joined here; its write is queued through
            # the cache's update and all layers' writes evaluated once at the end of the step
            # (one hand-off to MLX instead of one a layer)
            s = np.empty((Hkv, rep, pos + 1), np.float32)
            if pos:
                K = np.asarray(lc.keys)[0, :, :pos]  # [Hkv, pos, D]
                # the keys as the left operand (read at up to 2x the rate, engine/kv/attention.py),
                # stored as one row of scores per query head: the softmax's reductions run
                # along rows (over a strided axis they took 3-13x as long)
                s[:, :, :pos] = np.matmul(K, qr.transpose(0, 2, 1)).transpose(0, 2, 1)
                del K
            s[:, :, pos] = np.matmul(qr, kr[:, :, None])[:, :, 0]
            s -= s.max(axis=2, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=2, keepdims=True)
            o = s[:, :, pos:] * vr[:, None, :]  # [Hkv, rep, D]
            if pos:
                V = np.asarray(lc.values)[0, :, :pos]
                o += np.matmul(s[:, :, :pos], V)
                del V  # no view outlives the layer: the queued write can reuse the buffer in place
            lc.update_and_fetch(mx.array(kr.reshape(1, Hkv, 1, D)), mx.array(vr.reshape(1, Hkv, 1, D)))
            writes += [lc.keys, lc.values]
            if timers is not None:
                t2 = clock()
                attention_s += t2 - t1
            cb.sgemv(layer.o, o.reshape(-1), a)
            if timers is not None:
                t3 = clock()
                weights_s += t3 - t2
            x += a
            h = _rms(x, layer.norm2, layer.eps2)
            if timers is not None:
                t4 = clock()
            cb.sgemv(layer.gate, h, g)
            cb.sgemv(layer.up, h, u)
            if timers is not None:
                t5 = clock()
                weights_s += t5 - t4
            m = g / (np.float32(1.0) + np.exp(-g)) * u
            if timers is not None:
                t6 = clock()
            cb.sgemv(layer.down, m, a)
            if timers is not None:
                weights_s += clock() - t6
            x += a
        t_writes = clock()
        mx.eval(writes)
        attention_s += clock() - t_writes
        out = np.empty(self.head.shape[0], np.float32)
        h = _rms(x, self.norm, self.eps)
        t7 = clock()
        cb.sgemv(self.head, h, out)
        if timers is not None:
            _account(timers, t_start, t7, weights_s, attention_s)
        return mx.array(out).reshape(1, 1, -1)

    def rows_linear(self, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
        """y [B, N] = x [B, K] @ w^T for rows decoded together: one sgemm of all rows, or
        sgemv a row where install measured that faster for this weight's shape (OpenBLAS's
        sgemm packs the weight first; for some shapes re-reading it per row from the
        cache beats that, for others not: measured, `calibrate`)."""
        if w.shape in self.per_row:
            _sgemv_rows(self.cb, x, w, y)
        else:
            self.cb.sgemm_xwt(x, w, y)

    def weights_by_shape(self) -> dict[tuple[int, int], list[np.ndarray]]:
        """Every linear weight the step reads (the head among them), by shape."""
        out: dict[tuple[int, int], list[np.ndarray]] = {}
        for layer in self.layers:
            for w in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down):
                out.setdefault(w.shape, []).append(w)
        out.setdefault(self.head.shape, []).append(self.head)
        return out

    def calibrate(self, rows: int) -> dict[str, Any]:
        """For each weight shape, whether `rows` rows go through one sgemm or a sgemv a
        row: each timed over all of the model's weights of that shape (read from memory,
        as a step reads them), interleaved, best of TIMING_ROUNDS + 1. Returns the choice
        and both times by shape."""
        report: dict[str, Any] = {}
        self.per_row = set()
        for shape, ws in self.weights_by_shape().items():
            x = np.ones((rows, shape[1]), np.float32)
            y = np.empty((rows, shape[0]), np.float32)
            ways = {"sgemm": self.cb.sgemm_xwt, "sgemv": lambda x, w, y: _sgemv_rows(self.cb, x, w, y)}
            best = {way: float("inf") for way in ways}
            for _ in range(TIMING_ROUNDS + 1):
                for way, call in ways.items():
                    t0 = time.perf_counter()
                    for w in ws:
                        call(x, w, y)
                    best[way] = min(best[way], time.perf_counter() - t0)
            chosen = "sgemv" if best["sgemv"] < best["sgemm"] else "sgemm"
            if chosen == "sgemv":
                self.per_row.add(shape)
            report[f"{shape[0]}x{shape[1]}"] = {**{k: round(v * 1e3, 3) for k, v in best.items()}, "chosen": chosen}
        return report

    def _rows(self, tokens: list[int], cache: Any) -> mx.array:
        """B rows, each at its own position: each linear's weight read once a step through
        sgemm, or a row at a time through sgemv where measured faster (`rows_linear`), the
        attention batched over the rows with each row's columns past its own end masked
        (stale keys of a rolled-back proposal or of a longer row's positions)."""
        H, Hkv, D, rep = self.heads, self.kv_heads, self.head_dim, self.rep
        B = len(tokens)
        lin = self.rows_linear
        timers = self.timers
        clock = time.perf_counter
        t_start = clock()
        weights_s = attention_s = 0.0
        pos = np.asarray(cache.layers[0].plan.starts[:B], np.int64)
        P = int(pos.max())  # columns before the latest row's token; each row's own goes last
        ang = pos[:, None].astype(np.float32) * self.inv_freq[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]  # [B, 1, D/2]
        # row b sees columns [0, pos[b]) of the cache and its own token (column P here)
        hide = np.where(np.arange(P)[None, :] >= pos[:, None], -np.inf, 0.0).astype(np.float32)[:, None, None, :]
        hide = hide if (pos != P).any() else None
        hidden, inter = self._a.shape[0], self._g.shape[0]
        q = np.empty((B, H * D), np.float32)
        k = np.empty((B, Hkv * D), np.float32)
        v = np.empty((B, Hkv * D), np.float32)
        a = np.empty((B, hidden), np.float32)
        g = np.empty((B, inter), np.float32)
        u = np.empty((B, inter), np.float32)
        x = self.embed[np.asarray(tokens)]  # a copy [B, hidden]
        writes: list[mx.array] = []
        for layer, lc in zip(self.layers, cache.layers):
            h = _rms_rows(x, layer.norm1, layer.eps1)
            t0 = clock()
            lin(h, layer.q, q)
            lin(h, layer.k, k)
            lin(h, layer.v, v)
            t1 = clock()
            weights_s += t1 - t0
            kr = self._rope(k.reshape(B, Hkv, D), cos, sin)
            vr = v.reshape(B, Hkv, D)
            qr = self._rope(q.reshape(B, H, D), cos, sin).reshape(B, Hkv, rep, D) * np.float32(layer.scale)
            s = np.empty((B, Hkv, rep, P + 1), np.float32)
            if P:
                K = np.asarray(lc.keys)[:B, :, :P]  # [B, Hkv, P, D]
                s[..., :P] = np.matmul(K, qr.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
                del K
                if hide is not None:
                    s[..., :P] += hide
            s[..., P] = np.einsum("bhrd,bhd->bhr", qr, kr)
            s -= s.max(axis=3, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=3, keepdims=True)
            o = s[..., P:] * vr[:, :, None, :]  # [B, Hkv, rep, D]
            if P:
                V = np.asarray(lc.values)[:B, :, :P]
                o += np.matmul(s[..., :P], V)
                del V
            lc.update_and_fetch(mx.array(kr[:, :, None, :]), mx.array(vr[:, :, None, :]))
            writes += [lc.keys, lc.values]
            t2 = clock()
            attention_s += t2 - t1
            lin(np.ascontiguousarray(o.reshape(B, H * D)), layer.o, a)
            x += a
            h = _rms_rows(x, layer.norm2, layer.eps2)
            t3 = clock()
            lin(h, layer.gate, g)
            lin(h, layer.up, u)
            t4 = clock()
            m = np.ascontiguousarray(g / (np.float32(1.0) + np.exp(-g)) * u)
            t5 = clock()
            lin(m, layer.down, a)
            weights_s += (t4 - t2) + (clock() - t5)  # the o projection's residual and norm count in
            x += a
        t_writes = clock()
        mx.eval(writes)
        attention_s += clock() - t_writes
        out = np.empty((B, self.head.shape[0]), np.float32)
        h = _rms_rows(x, self.norm, self.eps)
        t6 = clock()
        lin(h, self.head, out)
        if timers is not None:
            _account(timers, t_start, t6, weights_s, attention_s)
        return mx.array(out).reshape(B, 1, -1)


def _sgemv_rows(cb: Cblas, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
    """y [B, N] = x [B, K] @ w^T as one sgemv a row."""
    for i in range(x.shape[0]):
        cb.sgemv(w, x[i], y[i])


def _account(timers: dict[str, float], t_start: float, t_head: float, weights_s: float, attention_s: float) -> None:
    """Add one step's split (`bench roofline`) to `timers`; the head's sgemv/sgemm began at `t_head`."""
    end = time.perf_counter()
    weights_s += end - t_head
    for name, value in (("weights", weights_s), ("attention", attention_s),
                        ("other", end - t_start - weights_s - attention_s), ("steps", 1)):
        timers[name] = timers.get(name, 0.0) + value


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """nn.RMSNorm of one float32 vector."""
    return x * np.float32(1.0 / np.sqrt(np.dot(x, x) / x.shape[0] + eps)) * w


def _rms_rows(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """nn.RMSNorm of each row of a float32 [B, dim] (contiguous: sgemm reads it)."""
    r = np.float32(1.0) / np.sqrt(np.einsum("bd,bd->b", x, x) / np.float32(x.shape[1]) + np.float32(eps))
    return np.ascontiguousarray(x * r[:, None] * w)


def _group(runner: Any, prompts: list[list[int]]) -> Any:
    """A group of rows, each prefilled alone and joined, as the scheduler joins them."""
    group = runner.new_cache()
    for prompt in prompts:
        cache = runner.new_cache()
        cache.ends = [0]
        runner.forward([prompt], cache, None)
        mx.eval(cache.arrays())
        cache.advance([len(prompt)])
        group.append_rows(cache)
    mx.eval(group.arrays())
    return group


def _verify(runner: Any, decoder: HostDecoder, rows: int = 1) -> str | None:
    """Decode short prompts both ways over the engine's cache; why they differ, or None.
    `rows` > 1: that many rows of different lengths in one group (each row's own
    position, the columns past a shorter row's end masked)."""
    prompts = [[(11 * i + 5 * r) % 97 + 3 for i in range(VERIFY_PROMPT - 3 * r)] for r in range(rows)]
    mlx_cache, host_cache = _group(runner, prompts), _group(runner, prompts)
    tokens = [p[-1] for p in prompts]
    for step in range(VERIFY_STEPS):
        want = runner.forward([[t] for t in tokens], mlx_cache, slice(-1, None), host=False)
        host_cache.begin(1)
        got = decoder.logits(tokens, host_cache)
        mx.eval(want, got)
        if got.shape != want.shape:
            return f"logits of shape {got.shape} against {want.shape}"
        scale = float(mx.abs(want).max().item()) or 1.0
        rel = float(mx.abs(got - want).max().item()) / scale
        if not rel <= MAX_REL:  # NaN fails too
            return f"{rows} row(s), step {step}: logits {rel:.2g} (relative) from MLX's, over {MAX_REL:g}"
        mlx_cache.advance([1] * rows)
        host_cache.advance([1] * rows)
        tokens = mx.argmax(want[:, -1], axis=-1).tolist()
    return None


def _timed(runner: Any, decoder: HostDecoder, rows: int = 1) -> tuple[float, float]:
    """(MLX step, host step) best seconds of `rows` rows at short contexts of different
    lengths: runs of consecutive steps of each, as served (the first of a run untimed),
    the runs interleaved so that load from elsewhere hits both alike."""
    cache = _group(runner, [[5] * (64 - 4 * r) for r in range(rows)])
    best = [float("inf"), float("inf")]
    held, runner.host = runner.host, decoder  # the forward's own dispatch to the step, as served
    held_rows, decoder.max_rows = decoder.max_rows, rows
    try:
        for _ in range(TIMING_ROUNDS):
            for i, host in enumerate((False, True)):
                for n in range(RUN_STEPS):
                    t0 = time.perf_counter()
                    out = runner.forward([[7]] * rows, cache, slice(-1, None), host=host)
                    mx.eval(out)
                    if n:
                        best[i] = min(best[i], time.perf_counter() - t0)
    finally:
        runner.host, decoder.max_rows = held, held_rows
    return best[0], best[1]


def install(runner: Any) -> tuple[dict[str, Any], HostDecoder | None]:
    """The host step for this runner's model where verified (and measured faster):
    /health's account and the decoder, or None."""
    report: dict[str, Any] = {"installed": False}
    mode = env_mode(ENV)
    why = rows_why = None
    if mode == "off":
        why = f"{ENV}=off"
    elif runner.kv_format is not None:
        why = "quantized KV cache (the cache's dequantized reads are MLX's)"
    elif mx.default_device() != mx.cpu:
        why = "not on the CPU"
    elif (cb := bound_cblas()) is None:
        why = "no optimized BLAS bound (MLX's reference BLAS has no sgemv to call)"
    decoder = None
    if why is None:
        # the model's own modules, read and run: whatever they raise leaves MLX's step serving
        try:
            why = _shape_of(runner.model, runner.layout)
            if why is None:
                decoder = HostDecoder(runner.model, cb)
                why = _verify(runner, decoder)
        except Exception as exc:  # noqa: BLE001
            why = f"not Llama-shaped as run here: {type(exc).__name__}: {str(exc).strip()[:200]}"
    if why is None and not runner.one_row:
        # several rows: verified against MLX's batched step; left to it where that fails or raises
        try:
            rows_why = _verify(runner, decoder, ROWS)
        except Exception as exc:  # noqa: BLE001
            rows_why = f"rows not run here: {type(exc).__name__}: {str(exc).strip()[:200]}"
    if why is None:
        if runner.one_row:
            rows_why = "rows are served one at a time"
        if mode != "on":
            mlx_s, host_s = _timed(runner, decoder)
            report["mlx_ms"], report["host_ms"] = round(mlx_s * 1e3, 2), round(host_s * 1e3, 2)
            if host_s * MIN_GAIN > mlx_s:
                why = f"one row's step measured {host_s * 1e3:.1f} ms against {mlx_s * 1e3:.1f} ms through MLX"
        if why is None and rows_why is None and mode != "on":
            try:
                report["rows_linears"] = decoder.calibrate(ROWS)
                mlx_s, host_s = _timed(runner, decoder, ROWS)
                report["rows"] = {"rows": ROWS, "mlx_ms": round(mlx_s * 1e3, 2), "host_ms": round(host_s * 1e3, 2)}
                if host_s * ROWS_MIN_GAIN > mlx_s:
                    rows_why = f"{ROWS} rows' step measured {host_s * 1e3:.1f} ms against {mlx_s * 1e3:.1f} ms through MLX"
            except Exception as exc:  # noqa: BLE001
                rows_why = f"rows not timed here: {type(exc).__name__}: {str(exc).strip()[:200]}"
    if why is not None:
        report["left"] = why
        return report, None
    report["installed"] = True
    if rows_why is None:
        decoder.max_rows = ROWS
    else:
        report["rows_left"] = rows_why
    report["max_rows"] = decoder.max_rows
    return report, decoder
