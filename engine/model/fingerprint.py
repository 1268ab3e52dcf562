"""The identity of a model's weights: what the prefix cache, the serving checks and a
draft model key their files by."""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx
import numpy as np


def model_fingerprint(model: Any, name: str = "", extra: str = "") -> str:
    """Identity of the weights: parameter names, shapes, dtypes and samples of their values.

    Cheap (reads a few hundred values per sampled tensor), and a different checkpoint
    or conversion of the same architecture gets a different fingerprint. `extra` is
    hashed too: what the samples may miss (a LoRA adapter fused into some layers).
    """
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    h = hashlib.sha256()
    for key, p in params:
        h.update(f"{key}:{tuple(p.shape)}:{p.dtype};".encode())
    picks = params[:2] + params[len(params) // 2 : len(params) // 2 + 1] + params[-2:]
    for _, p in picks:
        sample = p.reshape(-1)[:512]
        if sample.dtype == mx.bfloat16:
            sample = sample.astype(mx.float32)
        h.update(np.array(sample).tobytes())
    if extra:
        h.update(extra.encode())
    return h.hexdigest()[:32]
