"""The MTP layer's per-row state kept beside the target's KV in the prefix cache (RAM
and SSD; engine/prefix/prefix_cache.py CompanionHook), as the two-model draft's is
(engine/methods/draft_model.py DraftCompanion), so a warm turn feeds the MTP layer only the
positions the target runs.

A row's MTP entry at position t needs the target's hidden state at t and the token
x_{t+1}; a hit of m tokens runs the target from m, so the restored state must reach
exactly m: the entries the row wrote (up to its last draft's pending token) and the
target's hidden states after them up to position m - 1, which the row writes with the
new turn's own tokens when it first drafts (MtpGroup._join). A state is kept only
where that tail is short (a row retiring after drafting: a round or two); the
prompt's publication, before the row ever drafted, keeps none.
"""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx
import numpy as np

from .mtp_group import MtpGroup
from .round_group import group_member

# most target hidden states stored after a row's entries (each is one [D] vector)
MOST_HIDDEN = 64


def head_digest(head: Any) -> str:
    """What names an MTP layer's states: a digest of its input projection."""
    w = getattr(head, "fc", None) or head.eh_proj
    rows = np.array(w.weight[:4].astype(mx.float32))
    return hashlib.sha256(np.round(rows, 4).tobytes()).hexdigest()[:16]


class MtpCompanion:
    def __init__(self, group: MtpGroup) -> None:
        self.group = group
        self.name = f"mtp-{head_digest(group.mtp.head)}"

    def capture(self, row: Any, length: int) -> dict[str, mx.array] | None:
        p = group_member(row, self.group)
        return None if p is None else self.group.capture(p, length, MOST_HIDDEN)

    def restore(self, row: Any, state: dict[str, mx.array], length: int) -> None:
        """Hand a hit's state to the row's proposer where it reaches the hit exactly."""
        p = group_member(row, self.group)
        if p is None or not {"keys", "values", "hidden", "base"} <= set(state) or length != row.prefilled:
            return
        keys, values, hidden = state["keys"], state["values"], state["hidden"]
        base = int(state["base"].reshape(-1)[0].item())
        if base < 0 or keys.ndim != 3 or hidden.ndim != 2 or base + keys.shape[1] + hidden.shape[0] != length:
            return
        p.restored = (base, keys, values)
        p.pending = [(length - hidden.shape[0], hidden)]
