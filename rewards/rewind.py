"""ReWiND synthetic failures: a successful episode played forward to a split, then backward, so a
reward model also sees progress go down (its labels follow the frames shown)."""

from __future__ import annotations

import numpy as np

from embodied.core.trajectory import Trajectory, follow_observations

__all__ = ["rewind", "rewind_order", "rewind_split"]


def rewind_split(length: int, rng: np.random.Generator) -> int:
    """A random ReWiND split of an episode of ``length`` steps: observation ``length // 3`` to the
    last (``embodied collect --rewind`` and ``train reward rewind=`` draw it so)."""
    return int(rng.integers(length // 3, length + 1))


def rewind_order(split: int, rewind_steps: int | None = None) -> np.ndarray:
    """Original observation index shown at each observation of a rewound episode:
    ``0, 1, ..., split, split - 1, ..., split - r`` with r = ``rewind_steps`` (default
    ``max(split // 2, 1)``, at most ``split``)."""
    if split < 1:
        raise ValueError(f"rewind split must be >= 1, got {split}")
    if rewind_steps is None:
        rewind_steps = max(split // 2, 1)
    if not 1 <= rewind_steps <= split:
        raise ValueError(f"rewind_steps must be in [1, split] = [1, {split}], got {rewind_steps}")
    return np.concatenate(
        [np.arange(split + 1), np.arange(split - 1, split - rewind_steps - 1, -1)]
    )


def rewind(traj: Trajectory, split: int, rewind_steps: int | None = None) -> Trajectory:
    """ReWiND synthetic failure: play ``traj`` forward to observation ``split``, then backward.

    With r = ``rewind_steps`` (default ``max(split // 2, 1)``, at most ``split``) the observations
    are ``obs[0..split], obs[split-1], ..., obs[split-r]`` (T' = split + r steps; ``rewind_order``).
    Backward actions are the original actions reversed with the xyz delta negated (``a[:3] *= -1``,
    gripper kept), assuming the tabletop / Meta-World layout (dx, dy, dz, grip). ``info`` follows
    the frame shown (``info[t]`` describes observation t+1; for obs[0] it comes from
    ``reset_info``). Rewards are 0, ``success`` False, ``terminated`` False, ``truncated`` True at
    the last step; policy outputs are dropped (no policy chose the rewound actions); ``frames``
    and ``metadata["unrendered"]`` follow the observations shown; ``metadata`` gains
    ``synthetic = "rewind"``, ``rewind_split`` and ``rewind_steps``.
    """
    steps = traj.length
    if not 1 <= split <= steps:
        raise ValueError(f"rewind split must be in [1, T] = [1, {steps}], got {split}")
    if traj.action_dim < 3:
        raise ValueError(f"rewind needs an xyz delta in the actions, got A = {traj.action_dim}")
    shown = rewind_order(split, rewind_steps)
    rewind_steps = len(shown) - 1 - split
    new_steps = len(shown) - 1

    def take(value: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
        if isinstance(value, dict):
            return {key: np.array(array[shown]) for key, array in value.items()}
        return np.array(value[shown])

    observations = {key: take(value) for key, value in traj.observations.items()}

    # Backward step j undoes original step split-1-j, which moved obs[split-1-j] -> obs[split-j].
    undone = shown[split + 1 :]  # the observation each backward step returns to
    backward_actions = np.array(traj.actions[undone])
    backward_actions[:, :3] *= -1.0
    actions = np.concatenate([traj.actions[:split], backward_actions]).astype(traj.actions.dtype)

    # info[t] describes observation t+1, which is original observation shown[t+1].
    reset_info = traj.metadata.get("reset_info", {})
    info = {}
    for key, array in traj.info.items():
        rows = []
        for observation_index in shown[1:]:
            if observation_index > 0:
                rows.append(array[observation_index - 1])
            elif key in reset_info and np.shape(reset_info[key]) == array.shape[1:]:
                rows.append(np.asarray(reset_info[key], dtype=array.dtype))
            else:
                raise ValueError(
                    f"rewinding to observation 0 needs reset_info[{key!r}] of shape "
                    f"{array.shape[1:]}; use rewind_steps < split"
                )
        info[key] = np.stack(rows).astype(array.dtype)

    truncated = np.zeros(new_steps, dtype=bool)
    truncated[-1] = True
    frames, metadata = follow_observations(traj, shown)
    metadata["synthetic"] = "rewind"
    metadata["rewind_split"] = int(split)
    metadata["rewind_steps"] = int(rewind_steps)
    return Trajectory(
        observations=observations,
        actions=actions,
        rewards=np.zeros(new_steps, dtype=traj.rewards.dtype),
        terminated=np.zeros(new_steps, dtype=bool),
        truncated=truncated,
        success=False,
        instruction=traj.instruction,
        task=traj.task,
        suite=traj.suite,
        seed=traj.seed,
        info=info,
        policy_outputs={},
        decision_steps=np.zeros(0, dtype=np.int64),
        metadata=metadata,
        frames=frames,
    ).validate()
