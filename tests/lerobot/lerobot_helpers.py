"""Helpers of the LeRobot interop tests: the kinds of toolkit datasets, rollouts to fill them, and
LeRobot's own dataset class over a directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# name -> (env options, writer options, episodes written first, episodes appended by the toolkit)
KINDS = {
    "video": ({"obs_mode": "pixels_state"}, {}, 2, 0),
    "state-only": ({"obs_mode": "state"}, {}, 2, 0),
    "two-cameras": ({"obs_mode": "pixels", "cameras": ["front", "wrist"]}, {}, 2, 0),
    "lossless": ({"obs_mode": "pixels_state"}, {"lossless": True}, 2, 0),
    "appended": ({"obs_mode": "pixels_state"}, {}, 1, 1),
    "odd-size": ({"obs_mode": "pixels_state", "image_size": 65}, {}, 2, 0),
}
STEPS = 24  # env steps per episode (short: the expert does not finish, which does not matter)


def torchcodec_works() -> bool:
    """Whether LeRobot's torchcodec backend can decode here (it needs system FFmpeg libraries)."""
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        return False
    return True


BACKENDS = ["pyav", "torchcodec"] if torchcodec_works() else ["pyav"]


def lerobot_dataset(root: Path, backend: str = "pyav", **options):
    """LeRobot's own ``LeRobotDataset`` over a local directory (uint8 frames)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(
        repo_id=f"local/{root.name}", root=root, video_backend=backend, return_uint8=True, **options
    )


def rollouts(env_options: dict, seeds: list[int]) -> list:
    """Expert PickPlace episodes of ``STEPS`` steps with the given env options."""
    import embodied.sims as sims
    from embodied.rollout.episodes import rollout_episode

    options = {"image_size": 48, **env_options}
    env = sims.make("PickPlace", **options)
    expert = sims.make_expert(env, noise=0.05, seed=0)
    trajectories = [
        rollout_episode(env, expert, seed=seed, suite="tabletop", max_steps=STEPS) for seed in seeds
    ]
    env.close()
    return trajectories


def write_kind(root: Path, kind: str) -> Path:
    """A toolkit dataset of ``kind`` at ``root`` (see ``KINDS``)."""
    from embodied.datasets import LeRobotDatasetWriter

    env_options, writer_options, first, appended = KINDS[kind]
    trajectories = rollouts(env_options, list(range(first + appended)))
    with LeRobotDatasetWriter(root, **writer_options) as writer:
        for traj in trajectories[:first]:
            writer.add_episode(traj)
    if appended:
        with LeRobotDatasetWriter.open(root) as writer:
            for traj in trajectories[first:]:
                writer.add_episode(traj)
    return root


def frames_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Arrays equal in value and shape (scalars and [1]-shaped values alike)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.reshape(-1).shape == b.reshape(-1).shape and np.array_equal(
        a.reshape(-1), b.reshape(-1)
    )
