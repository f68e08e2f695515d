"""Feature names and observation specs: how an env's observations, a dataset's columns and a
policy's inputs name the same thing.

Observations reach policies under LeRobot's feature names (``observation.state``,
``observation.image``, ``observation.images.<camera>``) whether they come from a dataset or
straight from an env, so one name mapping serves the datasets, the policies and the rollouts.
An ``ObservationSpec`` says which of those features a model reads and in what shape; an
``ActionSpec`` what it emits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATE_KEY = "observation.state"  # proprioception (the env's ``agent_pos``)
ENV_STATE_KEY = "observation.environment_state"  # privileged simulator state (object poses)
IMAGE_KEY = "observation.image"  # a single camera
CAMERA_PREFIX = "observation.images."  # one of several cameras: observation.images.<camera>
GOAL_PREFIX = "goal."  # environment_state values locating what the instruction names


def is_image_key(key: str) -> bool:
    """Whether a feature name is a camera (``observation.image`` or ``observation.images.*``)."""
    return key == IMAGE_KEY or key.startswith(CAMERA_PREFIX)


def observation_feature(path: tuple[str, ...]) -> str:
    """Feature name of an env observation key (``agent_pos`` -> ``observation.state``,
    ``pixels`` -> ``observation.image``, ``pixels/front`` -> ``observation.images.front``)."""
    if path == ("agent_pos",):
        return "observation.state"
    if path[0] == "pixels":
        return "observation.image" if len(path) == 1 else f"observation.images.{path[1]}"
    return "observation." + ".".join(path)


def env_observation_features(obs: dict[str, Any]) -> dict[str, np.ndarray]:
    """An env observation (one level of dicts) keyed by feature names."""
    out: dict[str, np.ndarray] = {}
    for key, value in obs.items():
        if isinstance(value, dict):
            for sub, array in value.items():
                out[observation_feature((key, sub))] = np.asarray(array)
        else:
            out[observation_feature((key,))] = np.asarray(value)
    return out


def feature_value_names(spec: dict[str, Any]) -> list[str]:
    """The per-value names of a LeRobot feature spec (info.json's ``names``: a list, or a dict
    holding one list such as ``{"motors": [...]}``); [] when it has none."""
    names = spec.get("names")
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return []
    return list(names)


def one_camera_alias(
    keys: Sequence[str], available: Collection[str], image_camera: str | None = None
) -> dict[str, str]:
    """``{read key: available key}`` for the one case where names differ: a model reading one
    named camera (``observation.images.front``) of an env built with only its default camera,
    whose single image is ``observation.image``. ``image_camera``, where known, names the camera
    that image is: then no other camera is taken for it."""
    cameras = [k for k in keys if k.startswith(CAMERA_PREFIX)]
    shown = image_camera is None or cameras[:1] == [CAMERA_PREFIX + image_camera]
    if len(cameras) == 1 and cameras[0] not in available and IMAGE_KEY in available and shown:
        return {cameras[0]: IMAGE_KEY}
    return {}


@dataclass(frozen=True)
class ObservationSpec:
    """What a model reads at each decision: its cameras and their sizes, the proprioceptive state
    and, for privileged baselines only, the simulator's environment state.

    ``cameras`` maps feature names (``observation.image``, ``observation.images.wrist``) to
    ``(height, width)``; ``*_names`` name the state values when known (``ee.x``, ``block_red.x``),
    so a policy trained on one env's state is refused by another whose values mean other things.
    """

    cameras: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    state_dim: int = 0
    state_names: tuple[str, ...] = ()
    env_state_dim: int = 0
    env_state_names: tuple[str, ...] = ()
    n_obs_steps: int = 1

    @property
    def privileged(self) -> bool:
        """Whether the model reads the simulator's privileged environment state."""
        return self.env_state_dim > 0

    def read_keys(self) -> list[str]:
        """The feature names read, cameras first."""
        keys = list(self.cameras)
        if self.state_dim:
            keys.append(STATE_KEY)
        if self.env_state_dim:
            keys.append(ENV_STATE_KEY)
        return keys

    def features(self) -> dict[str, dict[str, Any]]:
        """The read features as LeRobot ``features`` (``shape`` and, when known, ``names``)."""
        out: dict[str, dict[str, Any]] = {
            key: {"shape": [int(h), int(w), 3]} for key, (h, w) in self.cameras.items()
        }
        for key, dim, names in (
            (STATE_KEY, self.state_dim, self.state_names),
            (ENV_STATE_KEY, self.env_state_dim, self.env_state_names),
        ):
            if dim:
                out[key] = {"shape": [int(dim)], **({"names": list(names)} if names else {})}
        return out


@dataclass(frozen=True)
class ActionSpec:
    """What a policy emits per decision: ``chunk`` actions of ``dim`` values each."""

    dim: int
    chunk: int = 1
