"""How a trajectory is scored for RL, in one place for GRPO's returns and TPO's rankings.

Each trajectory gives a few terms (numpy; a term the trajectory cannot give is left out, never
filled with a made-up value)::

    success     1 if the success flag was raised at any step (as evaluation counts), else 0
    progress    p_T - p_0 from a reward model's per-observation progress: the potential-based
                reward  r_t = p_{t+1} - p_t  summed over the episode (it telescopes), so the
                shaping cannot change which policy is optimal (Ng, Harada & Russell 1999)
    success_prob  the reward model's own success probability at the episode's end (its success
                  head), where it has one: a learned success detector in place of the env's flag
    keypoints   mean distance (m) from the end effector to the task's target point (GRAPE's
                spatial constraint: lower for direct, decisive motion)
    collisions  number of collision steps
    steps       episode length / the env's step limit

    score = w_success * success + w_progress * progress + w_success_prob * success_prob
            - w_keypoints * keypoints - w_collisions * collisions - w_steps * steps

GRPO's return is the score with ``success``, ``progress`` and ``success_prob`` weights; TPO
ranks a group's trajectories by it (GRAPE's objectives below weight task success, safety or
efficiency) and pairs the best with the worst.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied.core.reward import ProgressScore

SIGNS = {  # each term's sign in the score: rewards add, costs subtract
    "success": 1.0,
    "progress": 1.0,
    "success_prob": 1.0,
    "keypoints": -1.0,
    "collisions": -1.0,
    "steps": -1.0,
}
TERMS = tuple(SIGNS)
OBJECTIVES: dict[str, dict[str, float]] = {
    "success": {"success": 1.0, "progress": 0.5, "keypoints": 1.0},
    "safety": {"success": 1.0, "progress": 0.5, "keypoints": 1.0, "collisions": 0.5},
    "efficiency": {"success": 1.0, "progress": 0.5, "keypoints": 1.0, "steps": 1.0},
}

INFO_KEYS = {"collisions": ("collisions",), "keypoints": ("ee_pos", "goal_pos")}  # what the
# terms read from the env's per-step info (the others come from the flags and a reward model)


def gives(info: Collection[str], term: str) -> bool:
    """Whether an env whose info has the keys ``info`` can give ``term``."""
    return all(key in info for key in INFO_KEYS.get(term, ()))


def progress_gain(score: ProgressScore) -> float:
    """``p_T - p_0`` over the observations the model answered for (a judge may leave frames
    without an answer); 0 when fewer than two were answered."""
    known = score.progress[np.isfinite(score.progress)]
    return float(known[-1] - known[0]) if len(known) >= 2 else 0.0


def score_terms(traj: Any, progress: ProgressScore | None, limit: int | None) -> dict[str, float]:
    """The terms (module docstring) this trajectory can give."""
    info = traj.info
    terms = {
        "success": 1.0 if traj.ever_succeeded else 0.0,
        "steps": traj.length / float(limit or max(traj.length, 1)),
    }
    if progress is not None:
        terms["progress"] = progress_gain(progress)
        if progress.success_prob is not None:
            terms["success_prob"] = float(progress.success_prob)
    if gives(info, "collisions"):
        terms["collisions"] = float(np.sum(info["collisions"]))
    if gives(info, "keypoints") and traj.length:
        ee, goal = (np.asarray(info[k], dtype=np.float64) for k in ("ee_pos", "goal_pos"))
        terms["keypoints"] = float(np.linalg.norm(ee - goal, axis=-1).mean())
    return terms


@dataclass
class TrajectoryScore:
    """``score(traj, progress)`` as in the module docstring, for the given weights."""

    weights: Mapping[str, float]
    limit: int | None = None  # the env's step limit, for the ``steps`` term

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(TERMS))
        if unknown:
            raise ValueError(f"unknown score terms {unknown}; available: {', '.join(TERMS)}")

    @classmethod
    def objective(
        cls, name: str, overrides: Mapping[str, float] | None = None, limit: int | None = None
    ) -> TrajectoryScore:
        """GRAPE's presets (``success``, ``safety``, ``efficiency``), weights overridable."""
        if name not in OBJECTIVES:
            raise ValueError(f"unknown objective {name!r}; available: {', '.join(OBJECTIVES)}")
        return cls({**OBJECTIVES[name], **(overrides or {})}, limit)

    def check_info(self, info: Collection[str], where: str) -> None:
        """Refuse, before any rollout, weights on terms that an env whose info has the keys
        ``info`` cannot give (``where`` names it)."""
        missing = [k for k, w in self.weights.items() if w and not gives(info, k)]
        if missing:
            needs = sorted({key for k in missing for key in INFO_KEYS[k]} - set(info))
            raise ValueError(
                f"{where} cannot give score terms {missing}: its info has no {needs}; set "
                f"their weights to 0 (score_weights.{missing[0]}=0)"
            )

    def __call__(self, traj: Any, progress: ProgressScore | None = None) -> float:
        terms = score_terms(traj, progress, self.limit)
        missing = [k for k, w in self.weights.items() if w and k not in terms]
        if missing:
            raise ValueError(
                f"the trajectory cannot give score terms {missing} (info keys: "
                f"{sorted(traj.info)}{'' if progress else '; no progress scored'}); set their "
                "weights to 0"
            )
        return float(sum(SIGNS[k] * w * terms[k] for k, w in self.weights.items() if w))

    def batch(
        self, trajs: Sequence[Any], progress: Sequence[ProgressScore] | None = None
    ) -> np.ndarray:
        """Scores ``[N]`` of many trajectories (``progress`` in the same order)."""
        scored = progress if progress is not None else [None] * len(trajs)
        return np.array([self(t, p) for t, p in zip(trajs, scored, strict=True)])


def preference_pairs(
    scores: Sequence[float], group_size: int, mode: str = "best-worst", margin: float = 0.0
) -> list[tuple[int, int]]:
    """(preferred, rejected) index pairs within each group of ``group_size`` consecutive
    trajectories: the highest vs the lowest score (``best-worst``), or every ordered pair whose
    scores differ by more than ``margin`` (``all``). Ties give no pair."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size}")
    pairs: list[tuple[int, int]] = []
    for start in range(0, len(scores), group_size):
        idx = range(start, start + group_size)
        if mode == "best-worst":
            best = max(idx, key=lambda i: scores[i])
            worst = min(idx, key=lambda i: scores[i])
            if scores[best] - scores[worst] > margin:
                pairs.append((best, worst))
        elif mode == "all":
            pairs += [(i, j) for i in idx for j in idx if scores[i] - scores[j] > margin]
        else:
            raise ValueError(f"mode must be 'best-worst' or 'all', got {mode!r}")
    return pairs
