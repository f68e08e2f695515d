"""Rollouts: run a policy in an environment and record the episode as a ``Trajectory``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.trajectory import Trajectory, TrajectoryBuilder

ActFn = Callable[[dict[str, Any]], np.ndarray]


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
    privileged ``info``; an ``info["error"]`` (physics blow-up) is kept in ``metadata``.
    """
    obs, info = env.reset(seed=seed, options=reset_options)
    builder = TrajectoryBuilder(
        obs,
        instruction=str(info.get("instruction", "")),
        task=str(info.get("task", "")),
        suite=suite,
        seed=seed,
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
