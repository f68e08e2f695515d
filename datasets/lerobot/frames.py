"""Trajectory <-> per-frame columns: how one episode becomes T+1 frames of named features
(see the package doc) and how those frames and the episode row rebuild the Trajectory."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from embodied.core.features import CAMERA_PREFIX, IMAGE_KEY, STATE_KEY, observation_feature
from embodied.core.trajectory import Trajectory
from embodied.datasets.lerobot.layout import DEFAULT_FEATURES

# True on the frames whose ``action`` was executed: every frame but an episode's last (its final
# observation, where ``action`` repeats the last executed one, as LeRobot repeats an episode's
# last action past its end). Neither ``<key>_is_pad``, which LeRobot reserves for its own padding
# masks, nor a name starting with "action", which LeRobot would train on as an action output.
ACTION_MASK = "has_action"
LEGACY_ACTION_PAD = "action_is_pad"  # what datasets written before ``ACTION_MASK`` hold (negated)
# Features computed from other Trajectory fields; they have no "trajectory_field" of their own.
DERIVED_FEATURES = (ACTION_MASK, LEGACY_ACTION_PAD, "next.done")
DECISION_MASK = "decision_mask"


# Per-frame features whose last frame says whether an episode LeRobot wrote succeeded.
SUCCESS_FEATURES = ("next.success", "success")


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


def _hold_last(values: np.ndarray) -> np.ndarray:
    """``values`` [T, ...] followed by a copy of its last entry (zeros when T = 0): [T+1, ...]."""
    last = values[-1:] if len(values) else np.zeros((1, *values.shape[1:]), dtype=values.dtype)
    return np.concatenate([values, last])


def _trajectory_columns(traj: Trajectory, legacy_pad: bool = False) -> list[_Column]:
    """Every per-frame column of one trajectory except LeRobot's default ones (package doc);
    ``legacy_pad`` writes the older ``action_is_pad`` (True on the last frame) instead of
    ``has_action``, for datasets that already hold it."""
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

    has_action = np.arange(steps + 1) < steps
    add("action", "actions", _hold_last(traj.actions))
    if legacy_pad:
        add(LEGACY_ACTION_PAD, None, ~has_action)
    else:
        add(ACTION_MASK, None, has_action)
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


def _named_field(name: str) -> str | None:
    """The Trajectory field of a feature that no ``trajectory_field`` names (a dataset LeRobot
    wrote), by LeRobot's conventional names; None for features a Trajectory does not hold."""
    if name.startswith(CAMERA_PREFIX):
        return f"observations/pixels/{name[len(CAMERA_PREFIX) :]}"
    if name.startswith("observation.") and "/" not in name:
        path = {STATE_KEY: "agent_pos", IMAGE_KEY: "pixels"}.get(name, name[len("observation.") :])
        return f"observations/{path}"
    return _NAMED_FIELDS.get(name)


_NAMED_FIELDS = {
    "action": "actions",
    "next.reward": "rewards",
    "next.terminated": "terminated",
    "next.truncated": "truncated",
}


def _frames_to_trajectory(
    frames: Mapping[str, np.ndarray],
    features: Mapping[str, Any],
    row: Mapping[str, Any],
    success: bool | None = None,
) -> Trajectory:
    """Inverse of ``_trajectory_columns`` plus the episode row: the Trajectory that was written.

    An episode of N frames has T = N - 1 steps. Episodes LeRobot wrote lack the writer's episode
    columns (``success``, ``seed``, ``suite``, ``task_name``, ``metadata``): ``success`` is then
    the given one (False when None: not recorded), the rest take empty defaults. In datasets
    LeRobot wrote, no feature names a ``trajectory_field``: features map by LeRobot's names
    (``_named_field``; ``next.done`` stands in for ``next.terminated``), missing rewards and flags
    are zeros, and the last frame's action, which has no observation after it, is left out.
    """
    steps = int(row["length"]) - 1
    fields = {name: feature.get("trajectory_field") for name, feature in features.items()}
    if not any(fields.values()):
        fields = {name: _named_field(name) for name in features}
        if "next.done" in features and "next.terminated" not in features:
            fields["next.done"] = "terminated"
    flat: dict[str, Any] = {
        "decision_steps": np.zeros(0, dtype=np.int64),
        "rewards": np.zeros(steps, dtype=np.float32),
        "terminated": np.zeros(steps, dtype=bool),
        "truncated": np.zeros(steps, dtype=bool),
    }
    for name, field in fields.items():
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
    for name in ("rewards", "terminated", "truncated"):
        flat[name] = flat[name].reshape(steps)
    recorded = row.get("success")
    flat["success"] = bool(recorded if recorded is not None else success)
    flat["instruction"] = row["tasks"][0]
    flat["task"] = row.get("task_name") or ""
    flat["suite"] = row.get("suite") or ""
    flat["metadata"] = row.get("metadata") or "{}"
    if row.get("seed") is not None and row["seed"] >= 0:
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


def _check_columns_match(
    frame_spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
    features: Mapping[str, Any],
    columns: Sequence[_Column],
) -> None:
    """Raise ValueError naming the feature (and the trajectory field) if an episode's columns
    differ from a dataset's (``frame_spec``: dtype and per-step shape of each feature)."""
    spec = {c.name: (c.values.dtype, c.values.shape[1:]) for c in columns}

    def describe(name: str, field: str | None) -> str:
        return f"{field} (feature {name!r})" if field else f"feature {name!r}"

    for name, (dtype, shape) in frame_spec.items():
        field = features[name].get("trajectory_field")
        if name not in spec:
            raise ValueError(f"the trajectory lacks {describe(name, field)}, which the dataset has")
        if spec[name] != (dtype, shape):
            raise ValueError(
                f"{describe(name, field)}: the trajectory has dtype {spec[name][0]} and "
                f"per-step shape {spec[name][1]} but the dataset has dtype {dtype} and "
                f"per-step shape {shape}"
            )
    for column in columns:
        if column.name not in frame_spec:
            raise ValueError(
                f"the trajectory has {describe(column.name, column.field)}, which the dataset lacks"
            )


def _index_columns(
    num_frames: int, fps: int, episode_index: int, first_index: int, task_index: int
) -> dict[str, np.ndarray]:
    """An episode's LeRobot index columns (timestamp, frame, episode, dataset and task index)."""
    frame_index = np.arange(num_frames, dtype=np.int64)
    return {
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.full(num_frames, episode_index, dtype=np.int64),
        "index": first_index + frame_index,
        "task_index": np.full(num_frames, task_index, dtype=np.int64),
    }


def _check_value_names(
    names: Mapping[str, Sequence[str]], spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]]
) -> None:
    """Raise ValueError unless each named feature exists with one name per value."""
    unknown = sorted(set(names) - set(spec))
    if unknown:
        raise ValueError(f"names given for {unknown}, which the episode does not have")
    for name, labels in names.items():
        if [len(labels)] != list(spec[name][1][-1:]):
            raise ValueError(
                f"{len(labels)} names given for {name!r}, whose values have shape "
                f"{list(spec[name][1])}"
            )
