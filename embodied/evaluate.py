"""Evaluation rollouts of a policy: success rate on held-out seeds, with the env configured to
produce exactly the observations the policy was trained on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class EvalResult:
    """Outcome of ``episodes`` rollouts of one task."""

    task: str
    episodes: int
    success_rate: float
    mean_length: float

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat metrics for the logger."""
        return {
            f"{prefix}/{self.task}/success_rate": self.success_rate,
            f"{prefix}/{self.task}/mean_length": self.mean_length,
        }


def env_kwargs_for_features(features: dict[str, Any]) -> dict[str, Any]:
    """Env options that reproduce a dataset's observation features (cameras, size, state).

    A single ``observation.image`` recorded no camera name: the env's default camera (tabletop
    ``front``, Meta-World ``corner2``) is the one that produced it, so no camera is passed."""
    single = "observation.image" in features
    cameras = [k.split(".", 2)[2] for k in features if k.startswith("observation.images.")]
    image_keys = ["observation.image"] if single else [f"observation.images.{c}" for c in cameras]
    has_state = "observation.environment_state" in features
    if not image_keys:
        return {"obs_mode": "state"}
    height, width = features[image_keys[0]]["shape"][:2]
    kwargs: dict[str, Any] = {
        "obs_mode": "pixels_state" if has_state else "pixels",
        "image_size": (int(height), int(width)),
    }
    if not single:
        kwargs["cameras"] = cameras
    return kwargs


def evaluate_policy(
    policy: Any,
    task: str,
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any],
    n_obs_steps: int = 1,
    workers: int = 1,
) -> EvalResult:
    """Roll ``policy`` out (deterministically) on seeds ``seed..seed+episodes-1``."""
    import embodied.sims as sims
    from embodied.rollout import PolicyActor, rollout_vector

    vec = sims.make_vec_env(
        task, workers, asynchronous=workers > 1, autoreset_mode="disabled", **env_kwargs
    )
    env_shape = tuple(vec.single_action_space.shape)
    policy_dim = getattr(getattr(policy, "config", None), "action_dim", None)
    if policy_dim is not None and env_shape != (policy_dim,):
        vec.close()
        raise ValueError(
            f"the policy outputs actions of shape ({policy_dim},) but {task} takes actions of "
            f"shape {env_shape}"
        )
    was_training = policy.training
    policy.eval()
    try:
        actor = PolicyActor(policy, workers, n_obs_steps=n_obs_steps, deterministic=True, seed=seed)
        seeds = [seed + e for e in range(episodes)]
        trajs = list(rollout_vector(vec, actor, seeds, sims.suite_of(task)))
    finally:
        vec.close()
        policy.train(was_training)
    return EvalResult(
        task,
        episodes,
        float(np.mean([t.success for t in trajs])),
        float(np.mean([t.length for t in trajs])),
    )
