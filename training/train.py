"""`jumpahead train-adapter`: teach the default model to act in the task world (LoRA).

Trajectories from live/trajectories.py (train seeds; a few for validation) are written
as mlx-lm chat JSONL (`train.jsonl`, `valid.jsonl`: `mlx_lm.lora --data DIR` reads them
too) and trained with mlx-lm's own LoRA tooling: `linear_to_lora_layers` on the last
`--num-layers` blocks of the default model, loaded in float32 the way the server loads
it (jumpahead.engine.model.loader: OpenBLAS first, quantized weights expanded), and
`mlx_lm.tuner.trainer.train`. The loss counts the assistant messages only (every one
of a multi-turn trajectory, not just the last, as `--mask-prompt` would; the mistaken
step of a recovery trajectory is not learned, only its repair): this module passes
mlx-lm's `train` a batch iterator that carries a per-token mask.

The result is an mlx-lm adapter folder (`adapters.safetensors`, `adapter_config.json`)
that `jumpahead serve --adapter DIR` and `mlx_lm.load(..., adapter_path=DIR)` load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

# Sized for under an hour on 2 cores (OpenBLAS): a step of 2 trajectories is ~1,400
# tokens (each ~440 of system prompt and tools, ~250 of conversation); measured 115
# tokens/s steady (12.5 s a step) with one other process busy, OPENBLAS_NUM_THREADS=1:
# 240 steps ~50 min plus validation; ~40 min at the 150 tokens/s.
DEFAULT_ITERS = 240
DEFAULT_TRAIN = 500  # trajectories written: each seen about once (iters * batch size)
DEFAULT_VALID = 16
DEFAULT_VAL_BATCHES = 8
# Long-kind trajectories (world.LONG_KINDS, drawn with --long-share) are 3,300-6,000
# tokens with the default tokenizer: with any of them the default sequence length is
# this, not 1,024 (a step then costs several times more).
LONG_MAX_SEQ = 8192


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iters", type=int, default=DEFAULT_ITERS, help=f"training steps (default: {DEFAULT_ITERS})")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="adapter folder to write (default: $JUMPAHEAD_HOME or ~/.cache/jumpahead, "
                             "/adapters/smol-agent)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="where to write train.jsonl/valid.jsonl (default: OUT/data)")
    parser.add_argument("--n-train", type=int, default=DEFAULT_TRAIN, help="training trajectories")
    parser.add_argument("--n-valid", type=int, default=DEFAULT_VALID, help="validation trajectories")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--num-layers", type=int, default=12, help="blocks (from the top) that get LoRA")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--scale", type=float, default=20.0, help="LoRA scale (mlx-lm's default 20)")
    parser.add_argument("--learning-rate", type=float, default=1e-4,
                        help="peak of the warmup + cosine schedule (default: 1e-4)")
    parser.add_argument("--max-seq-length", type=int, default=None,
                        help="tokens per trajectory kept (the system prompt with the tools is ~440; "
                             f"default: 1024, or {LONG_MAX_SEQ} with --long-share)")
    parser.add_argument("--long-share", type=float, default=0.0, metavar="P",
                        help="share of trajectories drawn from the long task kinds (add_feature, "
                             "rename_symbol; 10-30 calls, 3-6k tokens); default 0: short kinds only")
    parser.add_argument("--steps-per-report", type=int, default=10)
    parser.add_argument("--steps-per-eval", type=int, default=200)
    parser.add_argument("--val-batches", type=int, default=DEFAULT_VAL_BATCHES,
                        help="validation batches per evaluation (-1: all)")
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume-from", default=None, metavar="DIR",
                        help="start from this adapter's weights (its rank, scale and layers are used): "
                             "e.g. teach the shipped adapter the long kinds without retraining it all")
    parser.add_argument("--model", default=None, metavar="PATH", help="base model (default: the embedded one)")


def default_out() -> Path:
    from jumpahead.engine.model.default_model import default_cache_dir

    return default_cache_dir() / "adapters" / "smol-agent"


# --- data -------------------------------------------------------------------------------


def write_data(data_dir: Path, n_train: int, n_valid: int, long_share: float = 0.0) -> tuple[int, int]:
    """train.jsonl from the first n_train train seeds, valid.jsonl from the next n_valid;
    a `long_share` of each drawn from the long kinds."""
    from jumpahead.live.trajectories import generate, write_jsonl
    from jumpahead.live.world import split_seeds

    seeds = split_seeds("train", n_train + n_valid)
    a = write_jsonl(data_dir / "train.jsonl", generate(seeds[:n_train], long_share))
    b = write_jsonl(data_dir / "valid.jsonl", generate(seeds[n_train:], long_share))
    return a, b


def _ids(tokenizer: Any, messages: list[dict], tools: list[dict] | None, **kwargs: Any) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, return_dict=False, **kwargs)
    if hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def tokens_and_mask(tokenizer: Any, record: dict[str, Any]) -> tuple[list[int], list[bool]]:
    """The rendered conversation's tokens and, per token, whether the loss counts it:
    the tokens of each assistant message (after the template's `assistant` header, up
    to its end-of-message token), except those listed in `no_loss`."""
    messages, tools = record["messages"], record.get("tools")
    skip = set(record.get("no_loss") or ())
    ids = _ids(tokenizer, messages, tools)
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i in skip:
            continue
        start = len(_ids(tokenizer, messages[:i], tools, add_generation_prompt=True))
        end = len(_ids(tokenizer, messages[: i + 1], tools))
        if ids[:end] != _ids(tokenizer, messages[: i + 1], tools):
            raise ValueError("the chat template does not render conversations prefix by prefix")
        for t in range(start, min(end, len(ids))):
            mask[t] = True
    return ids, mask


class MaskedChatDataset:
    """Chat records as (tokens, mask) pairs, tokenized once when first read."""

    def __init__(self, records: list[dict[str, Any]], tokenizer: Any) -> None:
        self.records = records
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[list[int], list[bool]]] = {}

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, idx: int) -> tuple[list[int], list[bool]]:
        if idx not in self._cache:
            self._cache[idx] = tokens_and_mask(self.tokenizer, self.records[idx])
        return self._cache[idx]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def iterate_masked_batches(dataset: MaskedChatDataset, batch_size: int, max_seq_length: int, loop: bool = False,
                           seed: int | None = None, comm_group: Any = None):
    """mlx-lm's iterate_batches, with a per-token loss mask instead of (offset, length)."""
    import mlx.core as mx
    import numpy as np

    idx = sorted(range(len(dataset)), key=lambda i: len(dataset[i][0]))
    if len(dataset) < batch_size:
        raise ValueError(f"dataset has {len(dataset)} examples, fewer than batch_size={batch_size}")
    batches = [idx[i: i + batch_size] for i in range(0, len(idx) - batch_size + 1, batch_size)]
    rng = np.random.default_rng(seed)
    while True:
        for b in rng.permutation(len(batches)):
            items = [dataset[j] for j in batches[b]]
            longest = min(max(len(t) for t, _ in items), max_seq_length)
            width = min(1 + 32 * ((longest + 31) // 32), max_seq_length)
            tokens = np.zeros((len(items), width), np.int32)
            mask = np.zeros((len(items), width), np.bool_)
            for r, (t, m) in enumerate(items):
                n = min(len(t), width)
                tokens[r, :n] = t[:n]
                mask[r, :n] = m[:n]
            yield mx.array(tokens), mx.array(mask)
        if not loop:
            break


def masked_loss(model: Any, batch: Any, mask: Any, start: int = 0):
    """Mean cross-entropy over the tokens the mask marks (targets are batch[:, 1:]).

    `start`: no target before this position is marked in any batch (the shared system
    prompt and tools), so the output head and the softmax run only from there on."""
    import mlx.core as mx
    import mlx.nn as nn

    inputs, targets = batch[:, :-1], batch[:, 1:]
    start = max(0, min(start, inputs.shape[1] - 1))
    weights = mask[:, 1 + start:].astype(mx.float32)
    logits = _logits_from(model, inputs, start)
    ce = nn.losses.cross_entropy(logits, targets[:, start:]) * weights
    ntoks = weights.sum()
    return ce.astype(mx.float32).sum() / mx.maximum(ntoks, 1.0), ntoks


def _logits_from(model: Any, inputs: Any, start: int) -> Any:
    """The model's logits at positions start.. (the head runs only there where the
    model is an mlx-lm `Model` with a `.model` trunk and a tied or separate head)."""
    trunk, args = getattr(model, "model", None), getattr(model, "args", None)
    if start == 0 or trunk is None or args is None:
        return model(inputs)[:, start:]
    if getattr(args, "tie_word_embeddings", False) and hasattr(trunk, "embed_tokens"):
        return trunk.embed_tokens.as_linear(trunk(inputs)[:, start:])
    head = getattr(model, "lm_head", None)
    if head is None:
        return model(inputs)[:, start:]
    return head(trunk(inputs)[:, start:])


def first_trained_target(*datasets: MaskedChatDataset) -> int:
    """The first target position (index into batch[:, 1:]) any record trains."""
    firsts = [m.index(True) - 1 for d in datasets for i in range(len(d)) for m in [d[i][1]] if True in m]
    return max(0, min(firsts, default=0))


# --- training ---------------------------------------------------------------------------


def adapter_config(args: argparse.Namespace, model_name: str, n_layers: int) -> dict[str, Any]:
    """mlx-lm's adapter_config.json fields (load_adapters reads fine_tune_type,
    num_layers, lora_parameters), plus what was trained."""
    return {
        "fine_tune_type": "lora",
        "num_layers": min(args.num_layers, n_layers),
        "lora_parameters": {"rank": args.rank, "scale": args.scale, "dropout": 0.0},
        "model": model_name,
        "iters": args.iters,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "max_seq_length": args.max_seq_length,
        "n_train": args.n_train,
        "long_share": getattr(args, "long_share", 0.0),
        "seed": args.seed,
        "trained_by": "jumpahead train-adapter (training/train.py)",
    }


def resume_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """With --resume-from (a folder or a shipped name), point it at the adapter folder
    and take its shape (LoRA weights of another rank or depth cannot be loaded into
    these layers); what it was, or None without it. FileNotFoundError where the folder
    holds no adapter (engine/model/lora.py resolve_adapter)."""
    if not getattr(args, "resume_from", None):
        return None
    from jumpahead.engine.model.lora import resolve_adapter

    src = resolve_adapter(str(args.resume_from))
    prior = json.loads((src / "adapter_config.json").read_text())
    args.resume_from = str(src)
    args.num_layers = int(prior["num_layers"])
    args.rank = int(prior["lora_parameters"]["rank"])
    args.scale = float(prior["lora_parameters"]["scale"])
    return {"path": str(src), "iters": prior.get("iters"), "n_train": prior.get("n_train"),
            "long_share": prior.get("long_share", 0.0), "result": prior.get("result")}


class _Speed:
    """A training callback that keeps mlx-lm's reports (tokens/s count loss tokens)."""

    def __init__(self) -> None:
        self.train: list[dict[str, Any]] = []
        self.val: list[dict[str, Any]] = []

    def on_train_loss_report(self, info: dict[str, Any]) -> None:
        self.train.append(dict(info))

    def on_val_loss_report(self, info: dict[str, Any]) -> None:
        self.val.append(dict(info))


def train_adapter(args: argparse.Namespace, progress=print) -> dict[str, Any]:
    """Write the data, train, write the adapter folder; returns a summary."""
    import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import build_schedule, linear_to_lora_layers

    from jumpahead.engine.model.loader import load_model

    out = Path(args.out).expanduser() if args.out else default_out()
    data_dir = Path(args.data).expanduser() if args.data else out / "data"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.max_seq_length is None:
        args.max_seq_length = LONG_MAX_SEQ if args.long_share > 0 else 1024
    n_train, n_valid = write_data(data_dir, args.n_train, args.n_valid, args.long_share)
    progress(f"wrote {n_train} train / {n_valid} valid trajectories to {data_dir} "
             f"in {time.perf_counter() - t0:.1f}s")

    mx.random.seed(args.seed)
    model, tokenizer, info = load_model(args.model, progress=progress)
    train_set = MaskedChatDataset(read_jsonl(data_dir / "train.jsonl"), tokenizer)
    valid_set = MaskedChatDataset(read_jsonl(data_dir / "valid.jsonl"), tokenizer)
    model.freeze()
    resume = resume_config(args)
    config = adapter_config(args, info.name, info.n_layers)
    linear_to_lora_layers(model, config["num_layers"], config["lora_parameters"])
    if resume is not None:
        # mlx-lm's own resume (trainer's resume_adapter_file) loads the same way
        model.load_weights(str(Path(args.resume_from) / "adapters.safetensors"), strict=False)
        config["resumed_from"] = resume
    from mlx.utils import tree_flatten

    n_params = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    progress(f"LoRA rank {args.rank} on the last {config['num_layers']} of {info.n_layers} layers: "
             f"{n_params / 1e6:.2f}M trainable parameters")
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")

    warmup = min(20, max(args.iters // 10, 1))
    schedule = build_schedule({"name": "cosine_decay", "warmup": warmup,
                               "arguments": [args.learning_rate, max(args.iters, 1), args.learning_rate / 20]})
    optimizer = optim.Adam(learning_rate=schedule)
    tokens_seen = {"total": 0}
    loops: dict[str, list] = {"stamps": []}  # (time a step's batch was taken, its tokens)

    def batches(dataset, batch_size, max_seq_length, loop=False, seed=None, comm_group=None):
        for batch, mask in iterate_masked_batches(dataset, batch_size, max_seq_length, loop,
                                                  seed=args.seed if loop else 0):
            if loop:
                tokens_seen["total"] += int(batch.shape[0] * batch.shape[1])
                loops["stamps"].append((time.perf_counter(), int(batch.shape[0] * batch.shape[1])))
            yield batch, mask

    speed = _Speed()
    targs = TrainingArgs(batch_size=args.batch_size, iters=args.iters, val_batches=args.val_batches,
                         steps_per_report=args.steps_per_report, steps_per_eval=args.steps_per_eval,
                         steps_per_save=args.save_every, max_seq_length=args.max_seq_length,
                         adapter_file=str(out / "adapters.safetensors"))
    t1 = time.perf_counter()
    model.train()
    start = first_trained_target(train_set, valid_set)  # tokenizes every record once
    progress(f"loss from target position {start} on (the shared prompt before it is never trained)")

    def loss(model, batch, mask):
        return masked_loss(model, batch, mask, start)

    train(model, optimizer, train_set, valid_set if len(valid_set) >= args.batch_size else None, targs,
          loss=loss, iterate_batches=batches, training_callback=speed)
    seconds = time.perf_counter() - t1
    for stale in out.glob("[0-9]*_adapters.safetensors"):  # mlx-lm's periodic checkpoints
        stale.unlink()
    val_s = sum(v.get("val_time", 0.0) for v in speed.val)
    train_s = max(seconds - val_s, 1e-9)
    summary = {
        "out": str(out), "iters": args.iters, "seconds": round(seconds, 1),
        "train_seconds": round(train_s, 1),
        "iterations_per_s": round(args.iters / train_s, 4),
        "tokens_per_s": round(tokens_seen["total"] / train_s, 1),  # all tokens of the padded batches
        # steady state: the median step after the first few (compilation, validation)
        "steady_tokens_per_s": _steady_rate(loops["stamps"]),
        "loss_tokens_per_s": round(speed.train[-1]["tokens_per_second"], 1) if speed.train else None,
        "train_loss": speed.train[-1]["train_loss"] if speed.train else None,
        "val_loss": speed.val[-1]["val_loss"] if speed.val else None,
        "adapter_bytes": (out / "adapters.safetensors").stat().st_size,
    }
    config["result"] = {k: summary[k] for k in ("train_loss", "val_loss", "tokens_per_s", "iterations_per_s",
                                                "seconds")}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return summary


def _steady_rate(stamps: list[tuple[float, int]]) -> float | None:
    """Median tokens/s of the steps after the second (each step: from taking its batch
    to taking the next; a step with a validation pass in it is an outlier the median drops)."""
    rates = sorted(n / (t1 - t0) for (t0, n), (t1, _) in zip(stamps[2:], stamps[3:]) if t1 > t0)
    return round(rates[len(rates) // 2], 1) if rates else None


def run(args: argparse.Namespace) -> int:
    if args.iters < 1 or args.n_train < args.batch_size:
        print("jumpahead: --iters must be >= 1 and --n-train >= --batch-size", file=sys.stderr)
        return 2
    try:
        resume_config(args)  # a bad --resume-from fails here, before the data and the model
    except (OSError, ValueError, KeyError) as e:
        print(f"jumpahead: --resume-from: {e}", file=sys.stderr)
        return 2
    summary = train_adapter(args, progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(summary, indent=2))
    return 0


def copy_adapter(src: Path, dst: Path) -> None:
    """Copy an adapter folder's two files (not its data) to `dst`."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("adapters.safetensors", "adapter_config.json"):
        shutil.copy2(Path(src) / name, dst / name)
