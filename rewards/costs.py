"""Trajectory costs for ranking rollouts into preference pairs (GRAPE's TPO), from the privileged
``info`` every env records (numpy; lower is better).

Each term is a number per trajectory, in comparable units::

    failure     1 - success
    progress    1 - final progress (the stage reached)
    keypoints   mean over steps of the end effector's distance to the task's target point
                (metres): the spatial constraint, lower for direct, decisive motion
    collisions  number of collision steps
    steps       episode length / limit

    cost = sum_k w_k * term_k

``OBJECTIVES`` holds GRAPE's three weightings: task success, safety (collisions weigh heavily)
and efficiency (steps weigh heavily); any dict of weights works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TERMS = ("failure", "progress", "keypoints", "collisions", "steps")
OBJECTIVES: dict[str, dict[str, float]] = {
    "success": {"failure": 1.0, "progress": 0.5, "keypoints": 1.0},
    "safety": {"failure": 1.0, "progress": 0.5, "keypoints": 1.0, "collisions": 0.5},
    "efficiency": {"failure": 1.0, "progress": 0.5, "keypoints": 1.0, "steps": 1.0},
}


def keypoint_distances(info: Mapping[str, Any]) -> np.ndarray:
    """Per-step distance ``[T]`` from the end effector to the task's privileged target point
    (``goal_pos``: the block to reach, the plate to push or place onto, the handle, the button)."""
    for key in ("ee_pos", "goal_pos"):
        if key not in info:
            raise ValueError(f"trajectory info has no {key!r}; keys: {sorted(info)}")
    ee, goal = (np.asarray(info[k], dtype=np.float64) for k in ("ee_pos", "goal_pos"))
    return np.linalg.norm(ee - goal, axis=-1)


def cost_terms(traj: Any, limit: int | None = None) -> dict[str, float]:
    """The cost terms one trajectory's info can give: ``progress``, ``collisions`` and
    ``keypoints`` only when the env recorded them (Meta-World records no collisions), so a
    weighting that needs a missing one is refused rather than scored with a made-up value."""
    info = traj.info
    terms = {
        "failure": 0.0 if traj.success else 1.0,
        "steps": traj.length / float(limit or max(traj.length, 1)),
    }
    if "progress" in info:  # no step taken (an env error at the start): nothing reached
        terms["progress"] = 1.0 - float(np.asarray(info["progress"])[-1]) if traj.length else 1.0
    if "collisions" in info:
        terms["collisions"] = float(np.sum(info["collisions"]))
    if "ee_pos" in info and "goal_pos" in info and traj.length:
        terms["keypoints"] = float(keypoint_distances(info).mean())
    return terms


@dataclass
class TrajectoryCost:
    """``cost(traj) = sum_k weights[k] * term_k(traj)``; ``objective`` picks a preset."""

    weights: Mapping[str, float]
    limit: int | None = None  # episode step limit for the ``steps`` term

    @classmethod
    def objective(cls, name: str, limit: int | None = None) -> TrajectoryCost:
        """GRAPE's presets: ``success``, ``safety`` or ``efficiency``."""
        if name not in OBJECTIVES:
            raise ValueError(f"unknown objective {name!r}; available: {', '.join(OBJECTIVES)}")
        return cls(OBJECTIVES[name], limit)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(TERMS))
        if unknown:
            raise ValueError(f"unknown cost terms {unknown}; available: {', '.join(TERMS)}")

    def __call__(self, traj: Any) -> float:
        terms = cost_terms(traj, self.limit)
        missing = [k for k, w in self.weights.items() if w and k not in terms]
        if missing:
            raise ValueError(
                f"the trajectory's info cannot give cost terms {missing} (info keys: "
                f"{sorted(traj.info)}); set their weights to 0 in cost_weights"
            )
        return float(sum(w * terms[k] for k, w in self.weights.items() if w))

    def batch(self, trajs: Sequence[Any]) -> np.ndarray:
        """Costs ``[N]`` of many trajectories."""
        return np.array([self(t) for t in trajs], dtype=np.float64)


def preference_pairs(
    costs: Sequence[float], group_size: int, mode: str = "best-worst", margin: float = 0.0
) -> list[tuple[int, int]]:
    """(preferred, rejected) index pairs within each group of ``group_size`` consecutive
    trajectories: the lowest vs the highest cost (``best-worst``), or every ordered pair whose
    costs differ by more than ``margin`` (``all``). Ties give no pair."""
    costs = np.asarray(costs, dtype=np.float64)
    if len(costs) % group_size:
        raise ValueError(f"{len(costs)} costs do not split into groups of {group_size}")
    pairs: list[tuple[int, int]] = []
    for start in range(0, len(costs), group_size):
        idx = range(start, start + group_size)
        if mode == "best-worst":
            best = min(idx, key=lambda i: costs[i])
            worst = max(idx, key=lambda i: costs[i])
            if costs[worst] - costs[best] > margin:
                pairs.append((best, worst))
        elif mode == "all":
            pairs += [(i, j) for i in idx for j in idx if costs[j] - costs[i] > margin]
        else:
            raise ValueError(f"mode must be 'best-worst' or 'all', got {mode!r}")
    return pairs
