"""Trajectory <-> per-frame columns: how one episode becomes T+1 frames of named features
(see the package doc) and how those frames and the episode row rebuild the Trajectory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from embodied.core.features import observation_feature
from embodied.core.trajectory import Trajectory
from embodied.datasets.lerobot.layout import DEFAULT_FEATURES, DatasetError, _episodes_path

# Features computed from other Trajectory fields; they have no "trajectory_field" of their own.
DERIVED_FEATURES = ("action_is_pad", "next.done")
DECISION_MASK = "decision_mask"


# Columns the writer adds to the episode rows; ``episode()`` needs them.
_TRAJECTORY_COLUMNS = ("success", "seed", "suite", "task_name", "metadata")


class _Column(NamedTuple):
    """One per-frame column of an episode: feature name, Trajectory field (or None), values."""

    name: str
    field: str | None
    values: np.ndarray  # [T+1, ...]
    video: bool = False


_observation_feature = observation_feature  # one mapping for datasets, policies and rollouts


def _info_feature(path: tuple[str, ...]) -> str:
    """Feature name of an info key: unchanged, except ``progress`` -> ``progress.privileged``."""
    parts = list(path)
    if parts[0] == "progress":
        parts[0] = "progress.privileged"
    return ".".join(parts)


def _append_zero(values: np.ndarray) -> np.ndarray:
    """``values`` [T, ...] followed by one all-zero (or False) entry: [T+1, ...]."""
    return np.concatenate([values, np.zeros((1, *values.shape[1:]), dtype=values.dtype)])


def _reset_value(metadata: Mapping[str, Any], path: tuple[str, ...], like: np.ndarray) -> Any:
    """``metadata["reset_info"]`` at ``path`` as an array like ``like``; ``like`` if unusable."""
    value: Any = metadata.get("reset_info")
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return like
        value = value[key]
    if value is None:
        return like
    try:
        array = np.asarray(value, dtype=like.dtype)
    except (TypeError, ValueError):
        return like
    return array if array.shape == like.shape else like


def _check_image(key: str, values: np.ndarray) -> None:
    """Raise ValueError unless ``values`` is ``uint8 [T+1, H, W, 3]`` (what a video holds)."""
    if values.dtype != np.uint8 or values.ndim != 4 or values.shape[-1] != 3:
        raise ValueError(
            f"Trajectory {key} must be uint8 [T+1, H, W, 3] to be stored as video, got "
            f"{values.dtype} {list(values.shape)}"
        )


def _trajectory_columns(traj: Trajectory) -> list[_Column]:
    """Every per-frame column of one trajectory except LeRobot's default ones (package doc)."""
    flat = traj.to_dict()  # validates, and names every field the way info.json records it
    steps = traj.length
    columns: dict[str, _Column] = {}

    def add(name: str, field: str | None, values: np.ndarray, video: bool = False) -> None:
        if name in columns or name in DEFAULT_FEATURES:
            other = columns[name].field if name in columns else "LeRobot's default column"
            raise ValueError(
                f"Trajectory {field} and {other} both map to the feature {name!r}; rename one"
            )
        columns[name] = _Column(name, field, values, video)

    for key, values in flat.items():
        if key.startswith("observations/"):
            path = tuple(key.split("/")[1:])
            video = path[0] == "pixels"
            if video:
                _check_image(key, values)
            add(_observation_feature(path), key, values, video)

    is_pad = np.zeros(steps + 1, dtype=bool)
    is_pad[-1] = True
    add("action", "actions", _append_zero(traj.actions))
    add("action_is_pad", None, is_pad)
    add("next.reward", "rewards", _append_zero(traj.rewards))
    add("next.done", None, _append_zero(traj.terminated | traj.truncated))
    add("next.terminated", "terminated", _append_zero(traj.terminated))
    add("next.truncated", "truncated", _append_zero(traj.truncated))

    for key, values in flat.items():
        if key.startswith("info/"):
            path = tuple(key.split("/")[1:])
            first = _reset_value(traj.metadata, path, like=values[0])
            add(_info_feature(path), key, np.concatenate([first[None], values]))

    if traj.policy_outputs or traj.num_decisions:
        steps_taken = traj.decision_steps
        for key, values in flat.items():
            if key.startswith("policy_outputs/"):
                path = tuple(key.split("/")[1:])
                frames = np.zeros((steps + 1, *values.shape[1:]), dtype=values.dtype)
                frames[steps_taken] = values
                add("decision." + ".".join(path), key, frames)
        mask = np.zeros(steps + 1, dtype=bool)
        mask[steps_taken] = True
        add(DECISION_MASK, "decision_steps", mask)
    return list(columns.values())


def _frames_to_trajectory(
    frames: Mapping[str, np.ndarray], features: Mapping[str, Any], row: Mapping[str, Any]
) -> Trajectory:
    """Inverse of ``_trajectory_columns`` plus the episode row: the Trajectory that was written."""
    missing = [c for c in _TRAJECTORY_COLUMNS if c not in row]
    if missing:
        raise DatasetError(
            f"{_episodes_path(row)}: no {missing[0]!r} column, so the episodes were not written "
            "by LeRobotDatasetWriter; read their frames with episode_frames()"
        )
    steps = int(row["length"]) - 1
    flat: dict[str, Any] = {"decision_steps": np.zeros(0, dtype=np.int64)}
    for name, feature in features.items():
        field = feature.get("trajectory_field")
        if field is None:
            continue
        values = frames[name]
        if field.startswith("observations/"):
            flat[field] = values
        elif field.startswith("info/"):
            flat[field] = values[1:]
        elif field.startswith("policy_outputs/"):
            flat[field] = values[frames[DECISION_MASK]]
        elif field == "decision_steps":
            flat[field] = np.flatnonzero(values).astype(np.int64)
        else:  # actions, rewards, terminated, truncated
            flat[field] = values[:steps]
    flat["success"] = bool(row["success"])
    flat["instruction"] = row["tasks"][0]
    flat["task"] = row["task_name"]
    flat["suite"] = row["suite"]
    flat["metadata"] = row["metadata"]
    if row["seed"] >= 0:
        flat["seed"] = int(row["seed"])
    return Trajectory.from_dict(flat)


def _check_episode_scalars(traj: Trajectory) -> str:
    """Check what the episode row stores besides arrays; return the metadata as JSON."""
    if traj.seed is not None and not 0 <= traj.seed < 2**63:
        raise ValueError(
            "Trajectory.seed must be None or in [0, 2**63) (an int64 column, where -1 means "
            f"None), got {traj.seed}"
        )
    text = json.dumps(traj.metadata)
    if json.loads(text) != traj.metadata:
        raise ValueError(
            "Trajectory.metadata does not survive JSON unchanged (tuples, non-str keys or NaN?); "
            "use plain dicts, lists, str keys and finite numbers"
        )
    return text


def _feature_spec(column: _Column, video_info: dict[str, Any] | None) -> dict[str, Any]:
    """The info.json entry of a column (``shape`` [1] for scalars, as LeRobot writes it)."""
    shape = [int(size) for size in column.values.shape[1:]]
    if column.video:
        spec = {
            "dtype": "video",
            "shape": shape,
            "names": ["height", "width", "channels"],
            "info": {"video.height": shape[0], "video.width": shape[1], **(video_info or {})},
        }
    else:
        spec = {"dtype": column.values.dtype.name, "shape": shape or [1], "names": None}
    if column.field is not None:
        spec["trajectory_field"] = column.field
    return spec
