"""Rollouts: run a policy in an environment and record the episode as a ``Trajectory``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.trajectory import Trajectory, TrajectoryBuilder

ActFn = Callable[[dict[str, Any]], np.ndarray]


def numeric_info(info: dict[str, Any]) -> dict[str, Any]:
    """The numeric/bool entries of an env ``info`` as JSON-able values (lists for arrays)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, bool | int | float | np.number | np.bool_ | np.ndarray):
            array = np.asarray(value)
            if array.dtype.kind in "biuf":
                out[key] = array.tolist()
    return out


def rollout_episode(
    env: gym.Env,
    act: ActFn,
    seed: int | None = None,
    max_steps: int | None = None,
    suite: str = "",
    reset_options: dict[str, Any] | None = None,
) -> Trajectory:
    """Run ``act(obs) -> action`` from ``env.reset(seed=seed)`` until the episode ends.

    Per-step numeric ``info`` entries (stage, collisions, poses, success) become the trajectory's
    privileged ``info``; the numeric entries of the reset ``info`` (describing the first
    observation) go to ``metadata["reset_info"]`` as lists, and an ``info["error"]`` (physics
    blow-up) to ``metadata["error"]``.
    """
    obs, info = env.reset(seed=seed, options=reset_options)
    builder = TrajectoryBuilder(
        obs,
        instruction=str(info.get("instruction", "")),
        task=str(info.get("task", "")),
        suite=suite,
        seed=seed,
        metadata={"reset_info": numeric_info(info)},
    )
    limit = max_steps if max_steps is not None else np.inf
    while builder.num_steps < limit:
        action = np.asarray(act(obs), dtype=np.float32)
        obs, reward, terminated, truncated, info = env.step(action)
        builder.add_step(action, obs, float(reward), bool(terminated), bool(truncated), info)
        if "error" in info:
            builder.metadata["error"] = str(info["error"])
        if terminated or truncated:
            break
    return builder.build()
