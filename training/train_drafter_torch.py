"""The drafter's self-distillation on a CUDA machine: generate and train in PyTorch.

`jumpahead train-drafter` does the whole recipe through the MLX engine, which on a
two-core CPU writes ~45 tokens a second: an hour buys ~40k tokens, and the drafter
then learns its training prompts rather than the model. This script does the same two
steps where a GPU is at hand, so the data can be 50x larger:

1. greedy continuations of the exported prompts by the target itself (the MLX
   checkpoint's quantized weights dequantized exactly, the Llama forward in float32),
   recording at every step the pending token and the final hidden state that chose it
   (what `RowView.hidden` holds when serving);
2. the drafter of engine/methods/drafter.py (same layers, same parameter names) trained on them
   with chained steps and a feature regression, one model per `--variant`.

It needs only torch, numpy and safetensors (no jumpahead, no mlx), so it runs on a
machine that has nothing else. The prompts come from `jumpahead train-drafter
--export-prompts DIR` (which also writes reference hidden states this script checks
its forward against before generating); the weights it writes become a drafter folder
with `jumpahead train-drafter --import-weights FILE` (which adds the target's
fingerprint). Only Llama-layout targets (the default model) are supported here.

    python training/train_drafter_torch.py --model M/model.safetensors --config M/config.json \\
        --prompts DIR/prompts.npz --out OUT --generate-minutes 3 --train-minutes 2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.numpy import load_file
from safetensors.torch import save_file


def say(text: str) -> None:
    print(f"train-drafter-torch: {text}", file=sys.stderr, flush=True)


# --- the target ------------------------------------------------------------------------


def dequantize(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group: int) -> np.ndarray:
    """MLX's affine quantization undone: uint32 words hold 32/bits values, lowest bits
    first; value * scale + bias per group of `group` inputs (mx.dequantize)."""
    per = 32 // bits
    q = (w[..., None] >> (np.arange(per, dtype=np.uint32) * bits)) & np.uint32((1 << bits) - 1)
    q = q.reshape(w.shape[0], -1).astype(np.float32)
    s = np.repeat(scales.astype(np.float32), group, axis=1)
    b = np.repeat(biases.astype(np.float32), group, axis=1)
    return q * s + b


def load_weights(path: str, config: dict[str, Any]) -> dict[str, np.ndarray]:
    raw = load_file(path)
    quant = config.get("quantization") or {}
    out = {}
    for key, value in raw.items():
        if key.endswith((".scales", ".biases")):
            continue
        base = key[: -len(".weight")] if key.endswith(".weight") else key
        if value.dtype == np.uint32 and f"{base}.scales" in raw:
            spec = quant.get(base, quant) if isinstance(quant.get(base), dict) else quant
            out[key] = dequantize(value, raw[f"{base}.scales"], raw[f"{base}.biases"], int(spec["bits"]),
                                  int(spec["group_size"]))
        else:
            out[key] = value.astype(np.float32)
    return out


class Target:
    """The Llama forward (mlx-lm's llama.py) in float32 with a preallocated KV cache for
    a batch of left-padded rows."""

    def __init__(self, weights: dict[str, np.ndarray], config: dict[str, Any], device: str) -> None:
        t = lambda k: torch.from_numpy(weights[k]).to(device)  # noqa: E731
        self.n_layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.dim = int(config["hidden_size"])
        self.head_dim = int(config.get("head_dim") or self.dim // self.heads)
        self.eps = float(config.get("rms_norm_eps", 1e-5))
        self.theta = float(config.get("rope_theta", 10000.0))
        if config.get("rope_scaling") or config.get("rope_traditional"):
            raise ValueError("only plain (non-traditional, unscaled) RoPE is supported here")
        self.embed = t("model.embed_tokens.weight")
        self.head = t("lm_head.weight") if "lm_head.weight" in weights else self.embed
        self.norm = t("model.norm.weight")
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            self.layers.append({k: t(p + n) for k, n in (
                ("ln1", "input_layernorm.weight"), ("ln2", "post_attention_layernorm.weight"),
                ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"),
                ("gate", "mlp.gate_proj.weight"), ("up", "mlp.up_proj.weight"), ("down", "mlp.down_proj.weight"))})
        self.device = device
        half = self.head_dim // 2
        self.inv_freq = self.theta ** (-torch.arange(0, half, device=device, dtype=torch.float32) / half)

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        f = pos[:, None, :, None].float() * self.inv_freq  # [B, 1, L, half]
        cos, sin = f.cos(), f.sin()
        a, b = x[..., : self.head_dim // 2], x[..., self.head_dim // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def new_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.kv_heads, length, self.head_dim)
        return [(torch.zeros(shape, device=self.device), torch.zeros(shape, device=self.device))
                for _ in range(self.n_layers)]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, cache: list, at: int, valid: torch.Tensor) -> torch.Tensor:
        """ids, pos [B, L] written at cache slots at..at+L; valid [B, at+L] keys that are
        real tokens. Returns the final (normed) hidden states [B, L, D]."""
        B, L = ids.shape
        h = self.embed[ids]
        end = at + L
        causal = torch.ones(L, end, dtype=torch.bool, device=self.device).tril(at)
        mask = causal[None, None] & valid[:, None, None, :end]
        # a left pad sees only itself (a query that sees nothing would make NaN keys for later layers)
        mask = mask | (torch.arange(end, device=self.device)[None, :] == (at + torch.arange(L, device=self.device))[:, None])
        rep = self.heads // self.kv_heads
        gmask = mask.repeat(1, 1, rep, 1)  # [B, 1, rep * L, end], one block of L rows per query head
        for layer, (kc, vc) in zip(self.layers, cache):
            x = self.rms(h, layer["ln1"])
            q = (x @ layer["q"].T).view(B, L, self.heads, self.head_dim).transpose(1, 2)
            k = (x @ layer["k"].T).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
            v = (x @ layer["v"].T).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            kc[:, :, at:end] = k
            vc[:, :, at:end] = v
            # Query heads sharing a key/value head go along the query axis (head h uses
            # kv head h // rep): attention reads the cache once, with no repeated copy.
            qg = q.reshape(B, self.kv_heads, rep * L, self.head_dim)
            a = F.scaled_dot_product_attention(qg, kc[:, :, :end], vc[:, :, :end], attn_mask=gmask)
            a = a.reshape(B, self.heads, L, self.head_dim)
            h = h + a.transpose(1, 2).reshape(B, L, -1) @ layer["o"].T
            x = self.rms(h, layer["ln2"])
            h = h + (F.silu(x @ layer["gate"].T) * (x @ layer["up"].T)) @ layer["down"].T
        return self.rms(h, self.norm)


@torch.no_grad()
def continue_batch(target: Target, prompts: list[np.ndarray], n: int, eos: set[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy continuations: per row the (hidden that chose it, pending token) pairs of
    every generated token but an end-of-turn one, as the engine's recorder keeps them."""
    dev = target.device
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(B, P, dtype=torch.long, device=dev)
    valid = torch.zeros(B, P + n, dtype=torch.bool, device=dev)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.from_numpy(p.astype(np.int64))
        valid[b, P - len(p):P] = True
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    pos = (torch.arange(P, device=dev)[None] - (P - lengths)[:, None]).clamp(min=0)
    cache = target.new_cache(B, P + n)
    h = target.forward(ids, pos, cache, 0, valid)[:, -1]
    hiddens, tokens = [], []
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    eos_t = torch.tensor(sorted(eos), device=dev)
    nxt_pos = lengths.clone()
    for step in range(n):
        tok = (h @ target.head.T).argmax(-1)
        hiddens.append(h.half())
        tokens.append(torch.where(alive, tok, torch.full_like(tok, -1)))
        alive = alive & ~torch.isin(tok, eos_t)
        if not alive.any() or step == n - 1:
            break
        valid[:, P + step] = True
        h = target.forward(tok[:, None], nxt_pos[:, None], cache, P + step, valid)[:, -1]
        nxt_pos += 1
    H = torch.stack(hiddens, 1).cpu().numpy()
    X = torch.stack(tokens, 1).cpu().numpy()
    out = []
    for b in range(B):
        keep = X[b] >= 0
        toks = X[b][keep]
        hs = H[b][keep]
        if len(toks) and toks[-1] in eos:  # the end-of-turn token is never a pending token the engine drafts from
            toks, hs = toks[:-1], hs[:-1]
        if len(toks) > 3:
            out.append((hs, toks.astype(np.int32)))
    return out


# --- the drafter (engine/methods/drafter.py's layers and names) ----------------------------------


class Drafter(nn.Module):
    def __init__(self, dim: int, ffn: int, draft_vocab: int) -> None:
        super().__init__()
        self.norm_h = nn.RMSNorm(dim, eps=1e-5)  # mlx.nn.RMSNorm's eps
        self.norm_e = nn.RMSNorm(dim, eps=1e-5)
        self.fc = nn.Linear(2 * dim, dim, bias=False)
        self.norm_x = nn.RMSNorm(dim, eps=1e-5)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)
        self.norm_out = nn.RMSNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, draft_vocab, bias=False)

    def step(self, h: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat([self.norm_h(h), self.norm_e(e)], dim=-1))
        y = self.norm_x(x)
        x = x + self.down(F.silu(self.gate(y)) * self.up(y))
        return x, self.head(self.norm_out(x))


def examples(starts: np.ndarray, steps: int) -> np.ndarray:
    """Indices i with i+steps in the same row."""
    return np.concatenate([np.arange(a, b - steps) for a, b in zip(starts[:-1], starts[1:]) if b - a > steps])


@torch.no_grad()
def agreement(d: Drafter, embed: torch.Tensor, d2t: torch.Tensor, H: torch.Tensor, X: torch.Tensor,
              idx: torch.Tensor, k: int = 4) -> list[float]:
    """Share of held-back positions whose first 1..k chained drafts all match the target."""
    hits = torch.zeros(k, device=H.device)
    for i in range(0, len(idx), 8192):
        j = idx[i : i + 8192]
        h, tok = H[j].float(), X[j]
        ok = torch.ones(len(j), dtype=torch.bool, device=H.device)
        for s in range(k):
            h, logits = d.step(h, embed[tok])
            tok = d2t[logits.argmax(-1)]
            ok = ok & (tok == X[j + s + 1])
            hits[s] += ok.sum()
    return [round(float(v) / max(1, len(idx)), 4) for v in hits]


def train_variant(H: torch.Tensor, X: torch.Tensor, train_from: int, train_idx: torch.Tensor,
                  valid_idx: torch.Tensor, embed: torch.Tensor, ffn: int, vocab_size: int, chain: int, minutes: float, batch: int,
                  lr: float, seed: int, train_end: int, heldout_idx: torch.Tensor | None = None
                  ) -> tuple[Drafter, dict[str, Any]]:
    torch.manual_seed(seed)
    dev = H.device
    counts = torch.bincount(X[train_from:train_end], minlength=embed.shape[0])  # the training rows' tokens
    d2t = torch.argsort(-counts, stable=True)[:vocab_size]
    t2d = torch.full((embed.shape[0],), -1, dtype=torch.long, device=dev)
    t2d[d2t] = torch.arange(vocab_size, device=dev)
    d = Drafter(H.shape[1], ffn, vocab_size).to(dev)
    with torch.no_grad():
        d.head.weight.copy_(embed[d2t])  # start from the target's own rows
    # steps the time allows, from a short timing run (the schedule needs a length)
    opt = torch.optim.AdamW(d.parameters(), lr=lr, weight_decay=0.0)

    def loss_of(j: torch.Tensor) -> torch.Tensor:
        h = H[j].float()
        total = torch.zeros((), device=dev)
        for s in range(chain):
            h, logits = d.step(h, embed[X[j + s]])
            y = t2d[X[j + s + 1]]
            keep = y >= 0
            total = total + F.cross_entropy(logits[keep], y[keep]) * (0.8 ** s)
            total = total + F.smooth_l1_loss(h, H[j + s + 1].float()) * (0.8 ** s)
        return total

    gen = torch.Generator(device=dev).manual_seed(seed)
    t0 = time.monotonic()
    for _ in range(5):
        j = train_idx[torch.randint(len(train_idx), (batch,), device=dev, generator=gen)]
        loss_of(j).backward()
        opt.zero_grad()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    per = (time.monotonic() - t0) / 5
    steps = max(20, int(minutes * 60 / per))
    warm = min(200, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warm)) * (
        0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    before = agreement(d, embed, d2t, H, X, valid_idx)
    losses = []
    t1 = time.monotonic()
    for step in range(steps):
        j = train_idx[torch.randint(len(train_idx), (batch,), device=dev, generator=gen)]
        loss = loss_of(j)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            losses.append(float(loss.detach()))
        if step % 1000 == 0:
            say(f"ffn {ffn} vocab {vocab_size}: step {step}/{steps} loss {losses[-1]:.3f}")
    after = agreement(d, embed, d2t, H, X, valid_idx)
    covered = float((t2d[X[valid_idx]] >= 0).float().mean())
    d.d2t = d2t
    info = {"ffn": ffn, "draft_vocab": vocab_size, "chain": chain, "steps": steps, "batch": batch, "lr": lr,
            "seconds": round(time.monotonic() - t1, 1), "final_loss": round(float(np.mean(losses[-10:])), 4),
            "valid_agreement_before": before, "valid_agreement": after, "vocab_coverage": round(covered, 4)}
    if heldout_idx is not None:  # the benchmark's prompts (see main)
        info["heldout_agreement"] = agreement(d, embed, d2t, H, X, heldout_idx)
    say(json.dumps(info))
    return d, info


def save(d: Drafter, folder: Path, stem: str, max_bytes: int) -> list[str]:
    """fp16 weights (and d2t) in files of at most `max_bytes` each (a transfer limit may
    cap a file's size); `train-drafter --import-weights` takes them all."""
    weights = {k: v.detach().to(torch.float16).cpu().contiguous() for k, v in d.state_dict().items()}
    weights["d2t"] = d.d2t.to(torch.int32).cpu().contiguous()
    parts: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, value in sorted(weights.items(), key=lambda kv: -kv[1].nbytes):
        if parts[-1] and size + value.nbytes > max_bytes:
            parts.append({})
            size = 0
        parts[-1][key] = value
        size += value.nbytes
    names = [f"{stem}.safetensors" if len(parts) == 1 else f"{stem}-{i + 1}of{len(parts)}.safetensors"
             for i in range(len(parts))]
    for name, part in zip(names, parts):
        save_file(part, str(folder / name))
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the target's model.safetensors (MLX layout)")
    ap.add_argument("--config", required=True, help="its config.json")
    ap.add_argument("--prompts", required=True, help="prompts.npz from train-drafter --export-prompts")
    ap.add_argument("--out", required=True, help="folder for the weights and summary")
    ap.add_argument("--continue-tokens", type=int, default=320)
    ap.add_argument("--rows", type=int, default=256, help="rows generated together")
    ap.add_argument("--generate-minutes", type=float, default=3.0)
    ap.add_argument("--train-minutes", type=float, default=1.5, help="per variant")
    ap.add_argument("--variant", action="append", default=None, metavar="FFN:VOCAB:CHAIN",
                    help="drafter shapes to train (default 1024:4096:3)")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--order", choices=("random", "longest"), default="random",
                    help="which prompts first (generation stops at its deadline): a random sample of every "
                         "source, or the longest first (less padding)")
    ap.add_argument("--max-file-mb", type=float, default=15.0, help="largest weights file written")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(Path(args.config).read_text())
    weights = load_weights(args.model, config)
    target = Target(weights, config, dev.type)
    data = np.load(args.prompts)
    flat, starts = data["tokens"], data["starts"]
    prompts = [flat[a:b] for a, b in zip(starts[:-1], starts[1:])]
    eos = {int(t) for t in data["eos"]}
    say(f"{len(prompts)} prompts on {dev}, model loaded at {time.monotonic() - t_start:.1f} s")

    # the forward against the MLX engine's own hidden states (exported with the prompts)
    ref_ids, ref_hidden = data["ref_tokens"], data["ref_hidden"]
    L = len(ref_ids)
    got = target.forward(torch.from_numpy(ref_ids.astype(np.int64))[None].to(dev),
                         torch.arange(L, device=dev)[None], target.new_cache(1, L), 0,
                         torch.ones(1, L, dtype=torch.bool, device=dev))[0].cpu().numpy()
    err = float(np.abs(got - ref_hidden).max() / (np.abs(ref_hidden).max() + 1e-9))
    same_argmax = float(((torch.from_numpy(got).to(dev) @ target.head.T).argmax(-1).cpu().numpy()
                         == data["ref_argmax"]).mean())
    say(f"forward vs the engine: max relative error {err:.2e}, argmax agreement {same_argmax:.4f}")
    if same_argmax < 0.98:
        raise SystemExit(f"the torch forward does not match the engine (argmax agreement {same_argmax:.3f})")

    # 1. the target writes the data. In random order each batch is sorted by length
    # within a window of four batches (less padding, the sample still random).
    if args.order == "longest":
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    else:
        shuffled = [int(i) for i in np.random.default_rng(args.seed).permutation(len(prompts))]
        win = 4 * args.rows
        order = [i for w in range(0, len(shuffled), win)
                 for i in sorted(shuffled[w : w + win], key=lambda i: -len(prompts[i]))]
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    deadline = time.monotonic() + args.generate_minutes * 60
    t_gen = time.monotonic()
    done = 0
    for i in range(0, len(order), args.rows):
        if time.monotonic() > deadline:
            break
        rows += continue_batch(target, [prompts[j] for j in order[i : i + args.rows]], args.continue_tokens, eos)
        done = min(len(order), i + args.rows)
        say(f"{done}/{len(prompts)} prompts, {sum(len(t) for _, t in rows)} tokens, "
            f"{time.monotonic() - t_gen:.0f} s")
    gen_s = time.monotonic() - t_gen
    # the benchmark's prompts, continued apart: measured on, never trained on
    heldout: list[tuple[np.ndarray, np.ndarray]] = []
    if "heldout_tokens" in data:
        hs = data["heldout_starts"]
        heldout = continue_batch(target, [data["heldout_tokens"][a:b] for a, b in zip(hs[:-1], hs[1:])],
                                 args.continue_tokens, eos)
    del target
    torch.cuda.empty_cache() if dev.type == "cuda" else None

    # 2. train: rows shuffled, 5% of them held back
    rng = np.random.default_rng(args.seed)
    rows = [rows[i] for i in rng.permutation(len(rows))]
    n_valid = max(2, len(rows) // 20)
    H = torch.from_numpy(np.concatenate([h for h, _ in rows + heldout])).to(dev)
    X = torch.from_numpy(np.concatenate([t for _, t in rows + heldout]).astype(np.int64)).to(dev)
    lens = [len(t) for _, t in rows]
    starts_r = np.cumsum([0] + lens)  # training and held-back rows; the held-out ones follow
    starts_h = starts_r[-1] + np.cumsum([0] + [len(t) for _, t in heldout])
    h_idx = torch.from_numpy(examples(starts_h, 4)).to(dev) if heldout else None
    embed_t = torch.from_numpy(weights.pop("model.embed_tokens.weight")).to(dev)  # read once, above
    del weights
    variants = args.variant or ["1024:4096:3"]
    sources = json.loads(str(data["sources"])) if "sources" in data else None
    summary: dict[str, Any] = {"prompts": len(prompts), "prompt_sources": sources, "prompts_generated": done, "continuations": len(rows),
                               "tokens": int(len(X)), "generate_seconds": round(gen_s, 1),
                               "tokens_per_second": round(len(X) / max(gen_s, 1e-9), 1),
                               "forward_check": {"max_relative_error": err, "argmax_agreement": same_argmax},
                               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                               "variants": {}}
    for spec in variants:
        ffn, vocab, chain = (int(v) for v in spec.split(":"))
        idx = examples(starts_r, chain)
        valid_end = int(starts_r[n_valid])
        v_idx = examples(starts_r[: n_valid + 1], 4)
        tr = torch.from_numpy(idx[idx >= valid_end]).to(dev)
        d, info = train_variant(H, X, valid_end, tr, torch.from_numpy(v_idx).to(dev), embed_t, ffn, vocab, chain,
                                args.train_minutes, args.batch, args.lr, args.seed, int(starts_r[-1]), h_idx)
        info["train_examples"], info["valid_examples"] = int(len(tr)), int(len(v_idx))
        name = f"drafter-{ffn}-{vocab}-{chain}"
        info["files"] = save(d, out, name, int(args.max_file_mb * 2**20))
        summary["variants"][name] = info
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    summary["minutes"] = round((time.monotonic() - t_start) / 60, 2)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
