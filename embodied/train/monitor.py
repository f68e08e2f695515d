"""What a GRPO run watches in its reward: whether a learned model tracks the simulator's progress
(the reward-hacking monitor), and whether its returns rank a group's successes above its failures,
which is the only signal a group-normalised advantage passes on."""

from __future__ import annotations

from typing import Any

import numpy as np


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant."""
    if np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def reward_correlation(learned: list[np.ndarray], privileged: list[np.ndarray]) -> float:
    """Pearson correlation of learned and privileged progress over every step of every rollout
    (steps a judge left unanswered are skipped). Per step rather than per final value: when
    nearly every rollout succeeds, final privileged progress is constant and its correlation is
    noise, while the curves still rise together."""
    x, y = np.concatenate(learned), np.concatenate(privileged)
    known = np.isfinite(x)
    return pearson(x[known], y[known])


def success_ranking(successes: np.ndarray, returns: np.ndarray, group_size: int) -> float:
    """Of the (success, failure) pairs within each group of ``group_size`` consecutive rollouts,
    the fraction whose success has the higher return (a tie counts half): 1 when the returns
    order every group as success does, 0.5 when they ignore it; NaN without such a pair."""
    s = np.asarray(successes, dtype=bool).reshape(-1, group_size)
    r = np.asarray(returns, dtype=float).reshape(-1, group_size)
    # [groups, i, j]: rollout i succeeded, rollout j failed, and how their returns compare
    pairs = s[:, :, None] & ~s[:, None, :]
    diff = r[:, :, None] - r[:, None, :]
    if not pairs.any():
        return float("nan")
    won = (diff[pairs] > 0).sum() + 0.5 * (diff[pairs] == 0).sum()
    return float(won / pairs.sum())


class RewardMonitor:
    """The reward-hacking monitor over a run's per-iteration correlations of learned with
    privileged progress: it says when the model does not track progress on the first rollouts,
    and when the mean of the last ``window`` iterations falls below ``warn`` (having started
    above it) or ``drop`` below the first ``window``'s mean. Smoothed, because one iteration's
    correlation over a few dozen rollouts moves by ~0.1; said once per fall, not every iteration
    it lasts."""

    def __init__(
        self, warn: float, window: int = 5, drop: float = 0.3, state: dict[str, Any] | None = None
    ) -> None:
        self.warn, self.window, self.drop = warn, window, drop
        state = state or {}  # a checkpoint's, so that a resumed run keeps its first iterations
        self.history: list[float] = [float(c) for c in state.get("history", [])]
        self.falling = bool(state.get("falling", False))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the monitor (JSON)."""
        return {"history": list(self.history), "falling": self.falling}

    def update(self, iteration: int, corr: float) -> str | None:
        """Record iteration ``iteration``'s correlation; the warning to give now, if any."""
        if not np.isfinite(corr):
            return None
        self.history.append(corr)
        said = f"iteration {iteration}: the learned reward's correlation with privileged progress"
        if len(self.history) == 1:
            if corr >= self.warn:
                return None
            return (f"{said} is {corr:.2f} on the first rollouts (below monitor_warn {self.warn}); "
                    "the reward model may not fit this policy's episodes")  # fmt: skip
        # Until more than `window` iterations are in, both means are the same: no fall yet.
        start = float(np.mean(self.history[: self.window]))
        recent = float(np.mean(self.history[-self.window :]))
        fell = recent < start - self.drop or (start >= self.warn > recent)
        said_now = fell and not self.falling
        self.falling = fell
        if not said_now:
            return None
        return (f"{said} fell to {recent:.2f} over the last {self.window} iterations (first "
                f"{start:.2f}); the policy may be exploiting the reward model")  # fmt: skip
