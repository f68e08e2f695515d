"""The reward-model contract: per-observation progress in [0, 1] of whole trajectories, and a
success probability where the model has one.

GRPO, TPO and ``embodied eval reward`` read rewards only through this class, so a learned
progress model, a zero-shot VLM judge, the simulator's privileged progress and success alone are
interchangeable (``embodied.rewards.make_reward_model`` builds them from a config). The interface
takes trajectories rather than frames because privileged progress lives in a trajectory's
``info``, not in its images; frame-based models read the camera they declare.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from embodied.core.features import (
    CAMERA_PREFIX,
    IMAGE_KEY,
    env_observation_features,
    is_image_key,
    one_camera_alias,
)
from embodied.core.trajectory import Trajectory


@dataclass
class ProgressScore:
    """A reward model's reading of one trajectory."""

    progress: np.ndarray  # float64 [T+1], one value per observation; NaN where none was given
    success_prob: float | None = None  # the model's success probability at the end, if it has one
    missing: int = 0  # frames the model was asked about but gave no answer for (a judge)


class RewardModel(abc.ABC):
    """Scores trajectories with progress (see the module docstring)."""

    reward_type: ClassVar[str] = ""

    @property
    def image_size(self) -> tuple[int, int] | None:
        """The camera size the model scores at; None when it reads no frames."""
        return None

    @property
    def image_key(self) -> str | None:
        """The camera the model scores, as a feature name (``observation.images.corner``, or
        ``observation.image`` for an env's default camera alone); None: the first camera."""
        return None

    @abc.abstractmethod
    def score(self, trajectories: Sequence[Trajectory]) -> list[ProgressScore]:
        """One ``ProgressScore`` per trajectory, in order."""


def camera_frames(trajectory: Trajectory, image_key: str | None = None) -> np.ndarray:
    """The frames ``uint8 [T+1, H, W, 3]`` a progress model scores: camera ``image_key``
    (ValueError naming the cameras there are when it is missing; a named camera is the only
    image of an env built with just that one, as for a policy), by default the first camera (its
    only camera, or ``front`` before ``wrist``). Without a camera among the observations, the
    rollout's ``frames`` (the first camera's renders, possibly rendered only when indexed). A
    rollout that rendered only the images its policy read (``metadata["unrendered"]``) gives the
    camera's frames replayed from its render states (``frames.for_camera``)."""
    features = env_observation_features(trajectory.observations)
    cameras = [k for k in features if is_image_key(k)]
    if cameras and trajectory.metadata.get("unrendered"):
        return _replayed(trajectory, image_key, cameras)
    if not cameras and trajectory.frames is not None:
        return trajectory.frames  # rendered from the camera the rollout env was given
    if not cameras:
        raise ValueError(
            f"the trajectory has no camera to score (observations: {sorted(features)}); roll out "
            "with obs_mode=pixels or pixels_state"
        )
    if image_key is None:
        return features[IMAGE_KEY if IMAGE_KEY in features else cameras[0]]
    key = one_camera_alias([image_key], features).get(image_key, image_key)
    if key not in features:
        raise ValueError(f"the reward model scores {image_key}; the trajectory has {cameras}")
    return features[key]


def _replayed(trajectory: Trajectory, image_key: str | None, cameras: list[str]) -> Any:
    """The frames of ``image_key`` (default: the first camera) of a rollout whose unread images
    were not rendered, replayed from its render states."""
    replay = getattr(trajectory.frames, "for_camera", None)
    if replay is None:
        raise ValueError(
            f"the episode (seed {trajectory.seed}) rendered only the images its policy read and "
            "has no render states to replay the others: roll it out with render_state=True"
        )
    key = image_key if image_key is not None else cameras[0]
    if image_key is not None:
        key = one_camera_alias([image_key], cameras).get(image_key, image_key)
        if key not in cameras:
            raise ValueError(f"the reward model scores {image_key}; the trajectory has {cameras}")
    return replay(key.removeprefix(CAMERA_PREFIX) if key.startswith(CAMERA_PREFIX) else None)


def evenly_spaced(length: int, count: int) -> np.ndarray:
    """``count`` indices spread evenly over ``0..length-1``, first and last included (fewer when
    the episode is shorter): the frames a progress model scores."""
    return np.unique(np.linspace(0, length - 1, min(count, length)).round().astype(int))
