"""What the loaded model can be served as, decided by running it at load.

A model class's source says nothing reliable about batching: nemotron_h passes per-row
lengths to its conv state but not to its SSM update, gpt_bigcode builds positions with
`np.arange(cache[0].offset, ...)` that fails once rows sit at different offsets, gemma2
broadcasts its batched attention wrongly. So the engine does not read source text; it
runs the engine's own cache and forwards (the paths the scheduler takes) on the model
it loaded, in the KV format it will serve, and compares them with each row run alone:

- alone: each row prefilled by itself and decoded one token, then a verifying round
  with a rejection rolled back and a fresh forward of what was kept. If a row cannot
  even run alone, or differs from the same row over mlx-lm's own cache (a layer that
  keeps its state only in mlx-lm's cache classes), the model is refused at load,
  naming the failure.
- rollback: the round after a rejected proposal equals a fresh forward of the kept
  tokens (attention rolls back by pointer, recurrent state by replay). Else no
  proposals are verified (methods that need a way back are off).
- batch: two rows at different offsets in one forward, at different widths (padded
  or packed, as a verifying round carries them), then a plain round at width 1, each
  equal to the same row alone. Else rows are served one at a time (max_batch 1).
- padded: the rows at different widths alone of the above; where only the equal-width
  round matches, rows share a batch but carry no proposals beside each other.

Equal means the logits agree to a tolerance of the weights' float type: a padded row
whose real tokens never reach a layer's state differs by whole logits, not rounding.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx

if TYPE_CHECKING:  # pragma: no cover
    from .model_runner import ModelRunner

log = logging.getLogger("jumpahead.engine")

# Two prompts of different lengths (ids every vocabulary has), longer than the tiny
# test models' sliding windows (8) and chunks (16), so rings and chunk masks are crossed.
PROMPTS = ([(7 * i) % 200 + 1 for i in range(23)], [(11 * i) % 190 + 3 for i in range(9)])
# Rounds as the scheduler runs them: per row, the inputs it carries and how many it
# keeps. A proposal rejected after its first token (row 1, then row 0), plain rounds of
# one token, and widths far enough apart (6 and 1) to take the packed (ragged) forward.
ROUNDS = (
    (([5], 1), ([17, 29, 41], 1)),
    (([9], 1), ([13], 1)),
    (([21, 22, 23, 24, 25, 26], 2), ([31], 1)),
    (([8], 1), ([14], 1)),
)
PLAIN = ((([9], 1), ([13], 1)), (([8], 1), ([14], 1)))  # one token a row only


@dataclass
class ServingCheck:
    """The outcome: how the engine serves this model, and why where it is limited."""

    batch: bool = True  # rows share forwards (else max_batch 1)
    padded: bool = True  # rows of different widths share a padded/packed forward
    verifies: bool = True  # a rejected proposal rolls back exactly
    reasons: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "batch" if self.batch else "one-row"

    def describe(self) -> dict[str, Any]:
        return {"serving": self.mode, "padded_rows": self.padded, "verifies": self.verifies,
                "limits": list(self.reasons)}


class RefusedModel(ValueError):
    """The model cannot run one row over the engine's cache: refused at load."""


def _tolerance(runner: "ModelRunner") -> float:
    """Relative logit tolerance: float32 weights agree to rounding (batched BLAS shapes
    reorder sums), half-precision ones to their own rounding."""
    dtypes = {p.dtype for p in _first_params(runner.model)}
    return 1e-3 if dtypes <= {mx.float32} else 3e-2


def _first_params(model: Any, n: int = 8) -> list[mx.array]:
    from mlx.utils import tree_flatten

    out = [v for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]
    return out[:n]


def _close(a: mx.array, b: mx.array, tol: float) -> tuple[bool, float]:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    if a.shape != b.shape:
        return False, float("inf")
    scale = max(float(mx.abs(b).max().item()), 1.0)
    diff = float(mx.abs(a - b).max().item())
    return diff <= tol * scale and bool(mx.all(mx.isfinite(a)).item()), diff / scale


def _prefilled(runner: "ModelRunner", prompts: list[list[int]]) -> Any:
    """A group cache holding `prompts`, each prefilled alone and then joined (as the
    scheduler joins a prefilled row to the running group)."""
    group = runner.new_cache()
    for p in prompts:
        cache = runner.new_cache()
        cache.ends = [0]
        runner.forward([p], cache, None)
        cache.advance([len(p)])
        mx.eval(cache.arrays())
        group.append_rows(cache)
    return group


def _round(runner: "ModelRunner", group: Any, rows: list[list[int]], kept: list[int]) -> list[mx.array]:
    """One round as the scheduler runs it: every input gets logits, row b keeps the
    first kept[b] of its inputs (recurrent state replayed to there). Each row's logits."""
    before = group.states()
    logits, offsets = runner.forward_ragged(rows, group, [len(r) for r in rows])
    out = [logits[o:o + len(r)] for o, r in zip(offsets, rows)]
    mx.eval(out, group.arrays())
    runner.replay(group, rows, kept, before)
    group.advance(kept)
    return out


def _run(runner: "ModelRunner", rows: list[int], rounds: tuple, keep_all: bool) -> list[list[mx.array]]:
    """PROMPTS[rows] joined in one group, then `rounds`: logits per round, per row."""
    group = _prefilled(runner, [PROMPTS[b] for b in rows])
    out = []
    for step in rounds:
        inputs = [step[b][0] for b in rows]
        kept = [len(step[b][0]) if keep_all else step[b][1] for b in rows]
        out.append(_round(runner, group, inputs, kept))
    return out


def _rollback_ok(runner: "ModelRunner", tol: float) -> tuple[bool, float]:
    """Row 1 alone after its rejected proposal: the next round equals a fresh forward
    of the prompt and the kept token."""
    (inputs, kept), (nxt, _) = ROUNDS[0][1], ROUNDS[1][1]
    after = _run(runner, [1], ROUNDS[:2], keep_all=False)[1][0]
    fresh = _prefilled(runner, [PROMPTS[1] + inputs[:kept]])
    expect = _round(runner, fresh, [nxt], [1])[0]
    return _close(after, expect, tol)


# Bump when what `check` runs or decides changes: verdicts kept on disk are keyed by it.
CHECK_VERSION = 4  # 4: numpy swiglu in the forwards it runs (engine/kv/host_swiglu.py)


def check_once(runner: "ModelRunner") -> ServingCheck:
    """`check`, once per loaded model object and KV format (engines built again over the
    same weights in one process reuse the outcome) and once per weights on this machine:
    the verdict is kept in `$JUMPAHEAD_HOME/serving-checks.json`, keyed by the weights'
    fingerprint, the KV format, the model class and the versions of MLX, mlx-lm and this
    check, so a restarted server does not run it again (a large model on a CPU takes
    tens of seconds). `JUMPAHEAD_MODEL_CHECK_CACHE`: another file, or "off"."""
    memo = getattr(runner.model, "_jumpahead_serving", None)
    if memo is None:
        memo = {}
        object.__setattr__(runner.model, "_jumpahead_serving", memo)  # not a parameter
    key = runner.kv_format.name if runner.kv_format is not None else "full"
    if key not in memo:
        path, disk_key = _disk_place(runner, key)
        kept = _read(path, disk_key)
        if kept is not None:
            log.info("serving check of %s (%s): kept verdict from %s: %s", runner.model_type, key, path, kept.mode)
            memo[key] = kept
        else:
            t0 = time.perf_counter()
            memo[key] = check(runner)
            log.info("serving check of %s (%s): ran in %.1f s: %s", runner.model_type, key,
                     time.perf_counter() - t0, memo[key].mode)
            _write(path, disk_key, memo[key])
    return memo[key]


def _disk_place(runner: "ModelRunner", fmt: str) -> tuple[Path | None, str]:
    setting = os.environ.get("JUMPAHEAD_MODEL_CHECK_CACHE", "")
    if setting.lower() in ("off", "0", "no"):
        return None, ""
    import mlx_lm

    from ..machine.home import jumpahead_home
    from ..model.fingerprint import model_fingerprint

    path = Path(setting).expanduser() if setting else jumpahead_home() / "serving-checks.json"
    cls = type(runner.model)
    ident = ":".join([model_fingerprint(runner.model, runner.model_type), fmt, f"{cls.__module__}.{cls.__name__}",
                      mx.__version__, mlx_lm.__version__, str(CHECK_VERSION)])
    return path, hashlib.sha256(ident.encode()).hexdigest()[:32]


def _read(path: Path | None, key: str) -> ServingCheck | None:
    if path is None:
        return None
    try:
        entry = json.loads(path.read_text()).get(key)
        return ServingCheck(**entry) if isinstance(entry, dict) else None
    except (OSError, ValueError, TypeError):
        return None


def _write(path: Path | None, key: str, verdict: ServingCheck) -> None:
    """Add the verdict to the file (written beside it and renamed: readers never see half)."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        table[key] = asdict(verdict)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: the check runs again next time
        log.info("serving check not kept on disk (%s)", exc)


def _mlx_lm_rounds(runner: "ModelRunner", b: int, keep_all: bool) -> list[mx.array] | None:
    """Row b's ROUNDS through mlx-lm's own cache (`make_prompt_cache`): for each round a
    fresh cache prefilled with the prompt and every token kept before it, then the
    round's inputs. None where mlx-lm's own path cannot run the model (no reference)."""
    from mlx_lm.models.cache import make_prompt_cache

    if runner.kv_format is not None:
        return None  # mlx-lm's quantized cache rounds differently: tests/test_kv_quant.py compares those
    out, kept = [], list(PROMPTS[b])
    try:
        for step in ROUNDS:
            inputs, keep = step[b]
            cache = make_prompt_cache(runner.model)
            runner.model(mx.array([kept], dtype=mx.int32), cache=cache)
            logits = runner.model(mx.array([inputs], dtype=mx.int32), cache=cache)[0]
            mx.eval(logits)
            out.append(logits)
            kept += inputs if keep_all else inputs[:keep]
    except Exception as exc:  # noqa: BLE001
        log.info("%s: no mlx-lm reference at load (%s: %s)", runner.model_type, type(exc).__name__, _line(exc))
        return None
    return out


def check(runner: "ModelRunner") -> ServingCheck:
    """Run the checks above on `runner`'s model (see the module docstring)."""
    out = ServingCheck()
    tol = _tolerance(runner)
    try:
        ok, diff = _rollback_ok(runner, tol)
        if not ok:
            out.verifies = False
            out.reasons.append(f"after a rejected proposal the next logits differ from a fresh forward "
                               f"(relative {diff:.3g}): proposals are not verified")
        alone = [_run(runner, [b], ROUNDS, keep_all=not out.verifies) for b in range(2)]
    except Exception as exc:  # noqa: BLE001 (any failure here is the model's, named)
        raise RefusedModel(f"{runner.model_type}: one row over the engine's cache fails: "
                           f"{type(exc).__name__}: {_line(exc)}") from exc
    # one row over the engine's cache equals one row over mlx-lm's own
    reference = _mlx_lm_rounds(runner, 0, keep_all=not out.verifies)
    for i, want in enumerate(reference or []):
        ok, diff = _close(alone[0][i][0], want, tol)
        if not ok:
            raise RefusedModel(f"{runner.model_type}: one row over the engine's cache differs from the same "
                               f"row over mlx-lm's own cache (round {i}, relative {diff:.3g}): a layer keeps or "
                               "reads its state in a way the engine's cache does not serve")
    try:
        both = _run(runner, [0, 1], ROUNDS, keep_all=not out.verifies)
        same = all(_close(both[i][b], alone[b][i][0], tol)[0] for i in range(len(ROUNDS)) for b in range(2))
        failure = "differ from the rows alone"
    except Exception as exc:  # noqa: BLE001
        same, failure = False, f"fail ({type(exc).__name__}: {_line(exc)})"
    if same:
        return out
    out.padded = False
    try:  # rows at different offsets, one token each: no padding anywhere
        both = _run(runner, [0, 1], PLAIN, keep_all=True)
        plain = [_run(runner, [b], PLAIN, keep_all=True) for b in range(2)]
        equal_width = all(_close(both[i][b], plain[b][i][0], tol)[0] for i in range(len(PLAIN)) for b in range(2))
    except Exception:  # noqa: BLE001
        equal_width = False
    if equal_width:
        out.verifies = False
        out.reasons.append(f"rows of different widths in one padded forward {failure}: rows share rounds "
                           "of one token each and proposals are not verified")
    else:
        out.batch = False
        out.reasons.append(f"two rows at different offsets in one forward {failure}: rows are served "
                           "one at a time")
    return out


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""
