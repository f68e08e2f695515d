"""Rewards for RL from progress, success and costs, batched over many rollouts (numpy).

Shapes: B rollouts, T (padded) env steps, T+1 observations. ``mask`` is bool ``[B, T]``, True on
real steps (``TrajectoryBatch.mask``); every output is 0 on padded steps.

- Potential-based progress reward (Ng, Harada & Russell 1999; DESIGN.md "Progress reward
  model"), with the progress p of each observation as the potential::

      r_t = gamma * p_{t+1} - p_t,   t = 0..T-1

  For gamma = 1 the sum over an episode telescopes to ``p_T - p_0``; in general
  ``sum_t gamma^t r_t = gamma^T p_T - p_0``, so the shaping cannot change which policy is optimal.
- ``success_bonus``: the bonus at the episode's last real step (episode-level ``success [B]``)
  or at the first step where a per-step success flag ``[B, T]`` is set.
- ``step_costs`` (1 per real step) and ``collision_costs`` (the per-step collision flag or
  count): positive costs, subtracted with their weights.
- ``chunk_rewards``: sum of step rewards over each action chunk of n steps (RLinf's
  ``chunk_level`` granularity); the last chunk may be partial.
- ``corrected_success``: the noisy-verifier correction (REFERENCES.md, "Progress reward models",
  imperfect verifiers): for a binary success detector y with false-positive rate a and
  false-negative rate b, ``r_hat = (y - a) / (1 - a - b)``, whose expectation is the true
  success rate s, since ``E[y] = a (1 - s) + (1 - b) s = a + s (1 - a - b)`` (the backward
  correction of Natarajan et al., 2013, used for perturbed rewards by Wang et al., 2020).
- ``RewardShaper``: the weighted sum of all of these, from a ``TrajectoryBatch`` or arrays::

      r = w_progress * potential + w_success * bonus - w_step * step - w_collision * collision

  with per-trajectory returns ``sum_t gamma^t r_t`` and, with ``chunk > 1``, chunk rewards.

NaN progress on a frame a real step uses is a ``ValueError`` naming the trajectory index (a
judge's missing answer must be filled or the episode dropped, never trained on silently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "RewardShaper",
    "ShapedRewards",
    "chunk_rewards",
    "collision_costs",
    "corrected_success",
    "discounted_returns",
    "potential_rewards",
    "step_costs",
    "success_bonus",
]


def _as_2d(name: str, array: Any, dtype: Any) -> tuple[np.ndarray, bool]:
    """Array as 2-D (a 1-D input becomes one row); returns (array, was_1d)."""
    array = np.asarray(array, dtype=dtype)
    if array.ndim == 1:
        return array[None], True
    if array.ndim != 2:
        raise ValueError(f"{name} must be [B, T] (or [T]), got shape {array.shape}")
    return array, False


def _step_mask(mask: Any, shape: tuple[int, int]) -> np.ndarray:
    """``mask`` as bool [B, T] (all True when None), checked against ``shape``."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim == 1 and len(shape) == 2 and shape[0] == 1:
        mask = mask[None]
    if mask.shape != shape:
        raise ValueError(f"mask has shape {mask.shape} but the steps are {shape}")
    return mask


def _check_gamma(gamma: float) -> float:
    gamma = float(gamma)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    return gamma


def potential_rewards(progress: Any, mask: Any = None, gamma: float = 1.0) -> np.ndarray:
    """``gamma * p_{t+1} - p_t``: float64 ``[B, T]`` from progress ``[B, T+1]`` (or ``[T]`` from
    ``[T+1]``), 0 where ``mask [B, T]`` is False.

    Raises ValueError naming the trajectory when a progress value used by a real step (``p_t`` or
    ``p_{t+1}`` of a masked-in step t) is NaN or infinite.
    """
    gamma = _check_gamma(gamma)
    progress, was_1d = _as_2d("progress", progress, np.float64)
    if progress.shape[1] < 1:
        raise ValueError("progress needs at least one frame (T+1 >= 1)")
    steps = (progress.shape[0], progress.shape[1] - 1)
    mask = _step_mask(mask, steps)
    needed = np.zeros(progress.shape, dtype=bool)
    needed[:, :-1] |= mask
    needed[:, 1:] |= mask
    bad = needed & ~np.isfinite(progress)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"progress of trajectory {row} is {progress[row, col]} at frame {col}: fill or drop "
            "missing progress (e.g. a VLM judge's unanswered frames) before computing rewards"
        )
    with np.errstate(invalid="ignore"):
        rewards = gamma * progress[:, 1:] - progress[:, :-1]
    rewards = np.where(mask, rewards, 0.0)
    return rewards[0] if was_1d else rewards


def success_bonus(success: Any, mask: Any, bonus: float = 1.0) -> np.ndarray:
    """float64 ``[B, T]``: ``bonus`` once per successful trajectory, 0 elsewhere.

    ``success`` bool ``[B]`` (episode outcome; or a float such as ``corrected_success``): at the
    last real step of each trajectory, scaled by the value. ``success [B, T]`` (per-step flags,
    e.g. ``info["success"]``): at the first real step whose flag is set.
    """
    mask, was_1d = _as_2d("mask", mask, bool)
    out = np.zeros(mask.shape, dtype=np.float64)
    success = np.asarray(success)
    if was_1d and success.ndim == 0 or was_1d and success.shape == mask.shape[1:]:
        success = success[None]
    if success.shape == mask.shape:  # per-step flags
        flags = success.astype(bool) & mask
        hit = flags.any(axis=1)
        first = flags.argmax(axis=1)
        out[np.flatnonzero(hit), first[hit]] = bonus
    elif success.shape == mask.shape[:1]:
        value = success.astype(np.float64)
        lengths = mask.sum(axis=1)
        last = mask.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)
        rows = np.flatnonzero(lengths > 0)
        out[rows, last[rows]] = bonus * value[rows]
    else:
        raise ValueError(f"success must be [B] or [B, T] = {mask.shape}, got shape {success.shape}")
    return out[0] if was_1d else out


def step_costs(mask: Any) -> np.ndarray:
    """float64 ``[B, T]``: cost 1 on every real step (an efficiency cost)."""
    return np.asarray(mask, dtype=bool).astype(np.float64)


def collision_costs(collisions: Any, mask: Any = None) -> np.ndarray:
    """float64 ``[B, T]``: the per-step collision flag or count, 0 on padded steps."""
    collisions = np.asarray(collisions, dtype=np.float64)
    if collisions.ndim > 2:  # e.g. [B, T, 1] or per-pair counts: total per step
        collisions = collisions.reshape(*collisions.shape[:2], -1).sum(axis=-1)
    collisions, was_1d = _as_2d("collisions", collisions, np.float64)
    mask = _step_mask(mask, collisions.shape)
    if not np.all(np.isfinite(collisions[mask])):
        row = int(np.argwhere(mask & ~np.isfinite(collisions))[0][0])
        raise ValueError(f"collisions of trajectory {row} has a non-finite value")
    out = np.where(mask, collisions, 0.0)
    return out[0] if was_1d else out


def chunk_rewards(rewards: Any, chunk: int, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum step rewards ``[B, T]`` over action chunks of ``chunk`` steps.

    Returns ``(sums [B, C], chunk_mask [B, C])`` with ``C = ceil(T / chunk)``: chunk c covers steps
    ``c*chunk .. min((c+1)*chunk, T) - 1`` (the last one may be partial), padded steps count 0,
    and ``chunk_mask`` is True where the chunk holds at least one real step.
    """
    if not isinstance(chunk, int | np.integer) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
    rewards, was_1d = _as_2d("rewards", rewards, np.float64)
    mask = _step_mask(mask, rewards.shape)
    batch, steps = rewards.shape
    n_chunks = -(-steps // chunk)
    pad = n_chunks * chunk - steps
    values = np.pad(np.where(mask, rewards, 0.0), ((0, 0), (0, pad)))
    real = np.pad(mask, ((0, 0), (0, pad)))
    sums = values.reshape(batch, n_chunks, chunk).sum(axis=2)
    chunk_mask = real.reshape(batch, n_chunks, chunk).any(axis=2)
    if was_1d:
        return sums[0], chunk_mask[0]
    return sums, chunk_mask


def discounted_returns(rewards: Any, mask: Any = None, gamma: float = 1.0) -> np.ndarray:
    """float64 ``[B]``: ``sum_t gamma^t r_t`` over real steps."""
    gamma = _check_gamma(gamma)
    rewards, was_1d = _as_2d("rewards", rewards, np.float64)
    mask = _step_mask(mask, rewards.shape)
    discounts = gamma ** np.arange(rewards.shape[1], dtype=np.float64)
    returns = (np.where(mask, rewards, 0.0) * discounts).sum(axis=1)
    return returns[0] if was_1d else returns


def corrected_success(
    observed: Any, false_positive_rate: float, false_negative_rate: float
) -> np.ndarray:
    """Unbiased success reward from a noisy binary detector: ``(y - a) / (1 - a - b)``.

    ``y`` in {0, 1} (or its mean), ``a`` = P(y=1 | failure), ``b`` = P(y=0 | success). Its
    expectation is the true success rate (REFERENCES.md, "Imperfect verifiers"; Natarajan et
    al. 2013, Wang et al. 2020). Single values fall outside [0, 1] (``-a/(1-a-b)`` for y=0,
    ``(1-a)/(1-a-b)`` for y=1): that is the price of unbiasedness, do not clip. Raises
    ValueError unless ``0 <= a, b < 1`` and ``a + b < 1`` (at ``a + b = 1`` the detector carries
    no information).
    """
    a, b = float(false_positive_rate), float(false_negative_rate)
    if not (0.0 <= a < 1.0 and 0.0 <= b < 1.0):
        raise ValueError(f"false-positive / false-negative rates must lie in [0, 1), got {a}, {b}")
    if a + b >= 1.0:
        raise ValueError(
            f"false_positive_rate + false_negative_rate = {a + b} >= 1: the detector is no better "
            "than chance (or inverted), so its reward cannot be corrected"
        )
    y = np.asarray(observed, dtype=np.float64)
    return (y - a) / (1.0 - a - b)


@dataclass
class ShapedRewards:
    """Output of ``RewardShaper``: per-step rewards and what RL needs from them."""

    rewards: np.ndarray  # float64 [B, T], 0 on padded steps
    mask: np.ndarray  # bool [B, T]
    returns: np.ndarray  # float64 [B]: sum_t gamma^t r_t
    chunk_rewards: np.ndarray  # float64 [B, C] (C = T when chunk = 1)
    chunk_mask: np.ndarray  # bool [B, C]
    terms: dict[str, np.ndarray]  # unweighted [B, T] terms: progress, success, step, collision


@dataclass
class RewardShaper:
    """Weighted per-step rewards from progress, success and costs.

    ``r = progress * (gamma p_{t+1} - p_t) + success * bonus - step * 1 - collision * c_t``.
    With ``verifier_fpr`` / ``verifier_fnr`` set, episode-level success (a detector's verdict)
    is replaced by ``corrected_success`` before the bonus. ``chunk`` > 1 also sums rewards per
    action chunk. ``collision_key`` names the ``TrajectoryBatch.info`` entry read by
    ``from_batch``.
    """

    progress: float = 1.0
    success: float = 0.0
    step: float = 0.0
    collision: float = 0.0
    gamma: float = 1.0
    chunk: int = 1
    verifier_fpr: float = 0.0
    verifier_fnr: float = 0.0
    collision_key: str = "collisions"

    def __post_init__(self) -> None:
        _check_gamma(self.gamma)
        if not isinstance(self.chunk, int | np.integer) or self.chunk < 1:
            raise ValueError(f"RewardShaper.chunk must be an int >= 1, got {self.chunk!r}")
        for name in ("progress", "success", "step", "collision"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"RewardShaper.{name} weight must be finite")
        if self.verifier_fpr or self.verifier_fnr:
            corrected_success(0.0, self.verifier_fpr, self.verifier_fnr)  # validates the rates

    def __call__(
        self,
        progress: Any = None,
        mask: Any = None,
        success: Any = None,
        collisions: Any = None,
    ) -> ShapedRewards:
        """Rewards from arrays: progress ``[B, T+1]``, mask ``[B, T]``, success ``[B]`` or
        ``[B, T]``, collisions ``[B, T]``. An input whose weight is non-zero is required; one
        whose weight is 0 is ignored."""
        if mask is None:
            if progress is None:
                raise ValueError("RewardShaper needs a mask when no progress is given")
            p = np.asarray(progress)
            mask = np.ones((p.shape[0], p.shape[1] - 1) if p.ndim == 2 else (1, len(p) - 1), bool)
        mask, _ = _as_2d("mask", mask, bool)
        zeros = np.zeros(mask.shape, dtype=np.float64)
        terms = {"progress": zeros, "success": zeros, "step": zeros, "collision": zeros}
        if self.progress:
            if progress is None:
                raise ValueError("RewardShaper.progress weight is non-zero but no progress given")
            p, _ = _as_2d("progress", progress, np.float64)
            if p.shape != (mask.shape[0], mask.shape[1] + 1):
                raise ValueError(
                    f"progress has shape {p.shape} but the mask {mask.shape} needs "
                    f"{(mask.shape[0], mask.shape[1] + 1)} (T+1 frames)"
                )
            terms["progress"] = potential_rewards(p, mask, self.gamma)
        if self.success:
            if success is None:
                raise ValueError("RewardShaper.success weight is non-zero but no success given")
            value = np.asarray(success)
            if (self.verifier_fpr or self.verifier_fnr) and value.ndim == 1:
                value = corrected_success(value, self.verifier_fpr, self.verifier_fnr)
            terms["success"] = success_bonus(value, mask)
        if self.step:
            terms["step"] = step_costs(mask)
        if self.collision:
            if collisions is None:
                raise ValueError(
                    "RewardShaper.collision weight is non-zero but no collisions given"
                )
            terms["collision"] = collision_costs(collisions, mask)
        rewards = (
            self.progress * terms["progress"]
            + self.success * terms["success"]
            - self.step * terms["step"]
            - self.collision * terms["collision"]
        )
        rewards = np.where(mask, rewards, 0.0)
        sums, chunk_mask = chunk_rewards(rewards, int(self.chunk), mask)
        return ShapedRewards(
            rewards=rewards,
            mask=mask,
            returns=discounted_returns(rewards, mask, self.gamma),
            chunk_rewards=sums,
            chunk_mask=chunk_mask,
            terms=terms,
        )

    def from_batch(self, batch: Any, progress: Any = None) -> ShapedRewards:
        """Rewards for a ``TrajectoryBatch``: ``progress [B, Tmax+1]`` per observation (e.g. a
        progress model run on ``batch.observations``), ``batch.success`` and
        ``batch.info[collision_key]``."""
        collisions = None
        if self.collision:
            if self.collision_key not in batch.info:
                raise ValueError(
                    f"RewardShaper.collision is non-zero but the batch has no "
                    f"info[{self.collision_key!r}] (has {sorted(batch.info)})"
                )
            collisions = batch.info[self.collision_key]
        return self(progress, batch.mask, batch.success, collisions)
