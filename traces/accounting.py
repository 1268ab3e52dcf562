"""The one accounting of what supplied tokens save and what they cost.

Forced replay (traces/replay.py) and live runs (live/summary.py) both price their
interventions here, so each quantity has one definition:

- plain_s: the ordinary arm's seconds per one-token decode round.
- D (decode avoided) = the intervention's correct supplied tokens x plain_s. Correct:
  tokens an exact method supplied (the model accepted each one), and the tokens of an
  unverified jump up to where it is wrong (`correct_tokens`). A wrong jump avoids no
  decoding: its tokens are redone or they broke the task; the rounds that carried them
  still cost P, and what followed from them is R.
- P (carrying them) = what the rounds that carried supplied tokens took beyond a plain
  round, less their proposer time.
- H (proposing) = proposer time in those rounds, plus hook time where a run has it.

At task level (live runs only; a replayed turn's continuation is fixed by the record):

- time to success under a retry budget of one redo: an attempt that fails costs its
  model time, and the task is redone on the ordinary arm (the stated rule: at the
  ordinary arm's measured model time on the same task, which solved it); a task the
  ordinary arm does not solve either has no time to success. So a fast failure never
  lowers the time to success: it adds to it.
- R (recovery) = what the measured paired saving leaves unexplained by D - P - H:
  R = (D - P - H) - (ordinary time to success - arm time to success). It is not
  clamped (noise moves it both ways; its CI says how far), and every arm pays it, not
  only arms with a detected wrong jump. Forced replay cannot observe R: rolling a row
  back is a pointer move, and the record, not the model, decides what comes next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RETRIES = 1  # the predefined retry budget: one ordinary redo after a failed attempt (0: none)


@dataclass(frozen=True)
class DPH:
    """An intervention's (or a turn's) decode avoided, carrying and proposing cost."""

    D_s: float = 0.0
    P_s: float = 0.0
    H_s: float = 0.0


def price(good_tokens: int, carried_round_s: Sequence[float], carried_propose_s: Sequence[float],
          plain_s: float | None, other_s: float = 0.0) -> DPH:
    """D, P and H of supplied tokens: `good_tokens` of them correct, carried by rounds
    that took `carried_round_s` with `carried_propose_s` of proposer time in each;
    `other_s`: time spent for them outside those rounds (policy hooks), counted in H."""
    if not plain_s:
        return DPH(0.0, 0.0, sum(carried_propose_s) + other_s)
    propose = sum(carried_propose_s)
    p = sum(carried_round_s) - plain_s * len(carried_round_s) - propose
    return DPH(good_tokens * plain_s, p, propose + other_s)


def correct_tokens(supplied: int, wrong_at: int | None) -> int:
    """Of `supplied` tokens, those before the first wrong one (`wrong_at`: its offset
    from the first supplied token, 0 for a run wrong from its start; None: all right).
    Forced replay knows the offset (where the record diverges); a live run judges a jump
    by its call's effect (ground truth), so a wrong live jump counts 0."""
    if wrong_at is None:
        return supplied
    return max(0, min(supplied, wrong_at))


def time_to_success(model_s: float, success: bool, ordinary_model_s: float | None, ordinary_success: bool,
                    retries: int = RETRIES) -> float | None:
    """Model seconds until the task is solved: the attempt, then (failed, and
    `retries` >= 1) one ordinary redo of `ordinary_model_s`, which solves it where the
    ordinary arm did; None where the budget does not reach a success."""
    if success:
        return model_s
    if retries < 1 or not ordinary_success or ordinary_model_s is None:
        return None
    return model_s + ordinary_model_s


def recovery_s(gain_s: float, ordinary_tts_s: float, arm_tts_s: float) -> float:
    """R: the part of D - P - H that the measured paired saving does not show."""
    return gain_s - (ordinary_tts_s - arm_tts_s)
