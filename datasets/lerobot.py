"""LeRobot dataset v3.0 on disk: write ``Trajectory`` objects into it and read them back exactly.

Layout (LeRobot v3.0)::

    meta/info.json            codebase_version "v3.0", fps, features, totals, path patterns
    meta/stats.json           {feature: {min, max, mean, std, count, q01, q10, q50, q90, q99}}
    meta/tasks.parquet        one row per instruction: column ``task`` (the pandas index) and
                              ``task_index``
    meta/episodes/chunk-XXX/file-YYY.parquet   one row per episode (where its frames live, stats)
    data/chunk-XXX/file-YYY.parquet            the per-frame columns of many episodes
    videos/<key>/chunk-XXX/file-YYY.mp4        the images of many episodes, one after another

Trajectory -> frames. An episode of T steps becomes T+1 frames, one per observation:

- LeRobot's columns ``timestamp`` (float32, frame_index / fps), ``frame_index``,
  ``episode_index``, ``index`` (global) and ``task_index`` (the instruction's row in tasks).
- ``observations["agent_pos"]`` -> ``observation.state``; ``observations["pixels"]`` -> video
  ``observation.image`` (one camera) or ``observation.images.<camera>`` (a dict of cameras); any
  other observation key k -> ``observation.<k>`` (nested keys joined with ".").
- ``action`` holds a_t (zeros on the last frame) and ``action_is_pad`` is True only on the last
  frame; ``next.reward``, ``next.done`` (terminated or truncated), ``next.terminated`` and
  ``next.truncated`` hold the step's outcome (0 / False on the last frame).
- ``info[k][t]`` describes the observation after step t, so it goes to frame t+1. Frame 0 takes
  ``metadata["reset_info"][k]`` (what the rollout records) when it is there with the right
  shape; otherwise frame 0 repeats frame 1's value. Info keys keep their names, except that
  ``progress`` becomes ``progress.privileged`` (labellers write ``progress.label``).
- ``policy_outputs[k]`` -> ``decision.<k>``: decision j's output on frame ``decision_steps[j]``,
  zeros elsewhere, with ``decision_mask`` True on those frames (written only for trajectories
  that carry decisions).
- Episode rows also hold ``success``, ``seed`` (-1 for None, so seeds must be >= 0), ``suite``,
  ``task_name`` (``Trajectory.task``) and ``metadata`` (``Trajectory.metadata`` as JSON).

Every feature that came from a Trajectory field names it in ``info.json`` as
``"trajectory_field"`` (the ``Trajectory.to_dict`` key, e.g. ``"info/stage"``), which is how the
reader rebuilds the Trajectory. The exact per-frame shape of a column is its parquet type
(a scalar column, or nested fixed-size lists); ``info.json`` writes LeRobot's ``[1]`` for scalars.

Crash safety. The writer buffers episodes and writes each batch as NEW files (videos are encoded
under temporary names while the batch fills), then ``meta/tasks.parquet``, a new episodes file,
``meta/stats.json`` and ``meta/info.json`` last, each atomically. ``info.json`` is the commit
point: episodes files that hold only episodes beyond its ``total_episodes`` are leftovers of an
interrupted write and are ignored (``validate_dataset`` warns about them and about unreferenced
files). Files holding earlier episodes are never modified, so a writer killed at any moment
leaves a valid dataset with every episode committed before the kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embodied.io import atomic_open, atomic_write_text
from embodied.trajectory import Trajectory

__all__ = [
    "CODEBASE_VERSION",
    "DatasetError",
    "LeRobotDataset",
    "LeRobotDatasetWriter",
    "dataset_summary",
    "validate_dataset",
]

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk directory
DATA_FILE_SIZE_MB = 100
VIDEO_FILE_SIZE_MB = 200

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
# Features computed from other Trajectory fields; they have no "trajectory_field" of their own.
DERIVED_FEATURES = ("action_is_pad", "next.done")
DECISION_MASK = "decision_mask"

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILES)
VIDEO_STATS_FRAMES = 100  # frames sampled per episode for image stats
VIDEO_STATS_SIZE = 64  # images are strided down to about this many pixels a side for stats
LOSSY_CRF = 20
# yuv420p plays everywhere but halves colour resolution: on 64x64 renders the conversion alone
# caps PSNR near 29 dB. yuv444p (H.264 High 4:4:4) keeps it; crf 20 gives about 37 dB there.
LOSSY_PIX_FMTS = ("yuv420p", "yuv444p")
LOSSLESS_ENCODER = "libx264rgb"  # H.264 in RGB with qp 0: bit-exact, and any H.264 decoder reads it
CODEC_NAMES = {"libx264": "h264", "libx264rgb": "h264", "libsvtav1": "av1", "libopenh264": "h264"}

_INFO_KEYS = ("fps", "features", "total_episodes", "total_frames", "total_tasks", "chunks_size")
_EPISODE_COLUMNS = (
    "episode_index",
    "tasks",
    "length",
    "data/chunk_index",
    "data/file_index",
    "dataset_from_index",
    "dataset_to_index",
    "meta/episodes/chunk_index",
    "meta/episodes/file_index",
)
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
# Columns this module adds to the episode rows; ``episode()`` needs them.
_TRAJECTORY_COLUMNS = ("success", "seed", "suite", "task_name", "metadata")


class DatasetError(ValueError):
    """A dataset on disk is missing a file, is corrupted, or is not LeRobot v3.0."""


# ---------------------------------------------------------------------------------------------
# Trajectory <-> per-frame columns
# ---------------------------------------------------------------------------------------------


class _Column(NamedTuple):
    """One per-frame column of an episode: feature name, Trajectory field (or None), values."""

    name: str
    field: str | None
    values: np.ndarray  # [T+1, ...]
    video: bool = False


def _observation_feature(path: tuple[str, ...]) -> str:
    """Feature name of an observation key (``agent_pos`` -> ``observation.state``)."""
    if path == ("agent_pos",):
        return "observation.state"
    if path[0] == "pixels":
        return "observation.image" if len(path) == 1 else f"observation.images.{path[1]}"
    return "observation." + ".".join(path)


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
    """Every per-frame column of one trajectory except LeRobot's default ones (see module doc)."""
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
    if traj.seed is not None and traj.seed < 0:
        raise ValueError(
            f"Trajectory.seed must be None or >= 0 (-1 means None on disk), got {traj.seed}"
        )
    text = json.dumps(traj.metadata)
    if json.loads(text) != traj.metadata:
        raise ValueError(
            "Trajectory.metadata does not survive JSON unchanged (tuples, non-str keys or NaN?); "
            "use plain dicts, lists, str keys and finite numbers"
        )
    return text


# ---------------------------------------------------------------------------------------------
# Arrow columns, parquet files, chunked file names
# ---------------------------------------------------------------------------------------------


def _to_arrow(values: np.ndarray) -> pa.Array:
    """A [N, ...] array as an arrow column: scalars plain, trailing dims as fixed-size lists."""
    array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _from_arrow(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Inverse of ``_to_arrow``: a fresh, writable numpy array [N, ...]."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows, shape = len(array), []
    while pa.types.is_fixed_size_list(array.type):
        shape.append(array.type.list_size)
        array = array.flatten()
    return np.array(array.to_numpy(zero_copy_only=False)).reshape(rows, *shape)


def _arrow_spec(arrow_type: pa.DataType) -> tuple[np.dtype, tuple[int, ...]]:
    """Numpy dtype and per-frame shape that an arrow column type stores."""
    shape = []
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    return np.dtype(arrow_type.to_pandas_dtype()), tuple(shape)


def _write_parquet(path: Path, table: pa.Table) -> None:
    """Write a parquet file atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as file:
        pq.write_table(table, file)


def _write_json(path: Path, data: Any) -> None:
    """Write a JSON file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=4) + "\n")


def _next_location(location: tuple[int, int]) -> tuple[int, int]:
    """The (chunk, file) after ``location``: files 0..999 fill a chunk, then the next chunk."""
    chunk, file = location
    return (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)


def _first_free_location(directory: Path, suffix: str) -> tuple[int, int]:
    """The (chunk, file) after every ``chunk-XXX/file-YYY<suffix>`` that exists under directory."""
    taken = []
    for path in directory.glob(f"chunk-*/file-*{suffix}"):
        chunk = re.fullmatch(r"chunk-(\d+)", path.parent.name)
        file = re.fullmatch(r"file-(\d+)" + re.escape(suffix), path.name)
        if chunk and file:
            taken.append((int(chunk.group(1)), int(file.group(1))))
    return _next_location(max(taken)) if taken else (0, 0)


def _data_path(row: Mapping[str, Any]) -> str:
    """Relative path of the data file holding an episode."""
    return DATA_PATH.format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])


def _video_path(row: Mapping[str, Any], key: str) -> str:
    """Relative path of the video file holding an episode's images of ``key``."""
    return VIDEO_PATH.format(
        video_key=key,
        chunk_index=row[f"videos/{key}/chunk_index"],
        file_index=row[f"videos/{key}/file_index"],
    )


def _episodes_path(row: Mapping[str, Any]) -> str:
    """Relative path of the episodes metadata file holding an episode's row."""
    return EPISODES_PATH.format(
        chunk_index=row["meta/episodes/chunk_index"], file_index=row["meta/episodes/file_index"]
    )


# ---------------------------------------------------------------------------------------------
# Features and statistics
# ---------------------------------------------------------------------------------------------


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


def _video_keys(features: Mapping[str, Any]) -> list[str]:
    """Names of the video features."""
    return [name for name, feature in features.items() if feature["dtype"] == "video"]


def _stats_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    """Shape of a feature's stats: (3, 1, 1) per channel for videos, else the feature shape."""
    return (3, 1, 1) if feature["dtype"] == "video" else tuple(feature["shape"])


def _real_steps(name: str, values: np.ndarray) -> np.ndarray:
    """The rows statistics are computed over: step-aligned columns (``action``, ``next.*``,
    ``decision.*``) leave out the last frame, whose padding zeros would skew normalisation."""
    step_aligned = name == "action" or name.startswith(("next.", "decision."))
    return values[:-1] if step_aligned and len(values) > 1 else values


def _episode_stats(values: np.ndarray, video: bool) -> dict[str, np.ndarray]:
    """Stats of one episode's column; images: per channel, scaled to [0, 1], sampled frames."""
    if video:
        picks = np.unique(np.linspace(0, len(values) - 1, VIDEO_STATS_FRAMES).round().astype(int))
        stride = max(1, max(values.shape[1:3]) // VIDEO_STATS_SIZE)
        samples = values[picks, ::stride, ::stride].reshape(-1, 3) / 255.0
        count, shape = len(picks), (3, 1, 1)
    else:
        samples = values.astype(np.float64).reshape(len(values), -1)
        count, shape = len(values), values.shape[1:] or (1,)
    stats = {
        "min": samples.min(axis=0),
        "max": samples.max(axis=0),
        "mean": samples.mean(axis=0),
        "std": samples.std(axis=0),
    }
    quantiles = np.quantile(samples, list(QUANTILES.values()), axis=0)
    stats.update(zip(QUANTILES, quantiles, strict=True))
    stats = {name: value.reshape(shape) for name, value in stats.items()}
    stats["count"] = np.array([count], dtype=np.int64)
    return {name: stats[name] for name in STAT_NAMES}


def _aggregate_stats(per_episode: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode stats of one feature (LeRobot's rule).

    min, max, mean, std and count are exact; quantiles are the count-weighted mean of the
    episodes' quantiles, an approximation.
    """
    counts = np.array([s["count"][0] for s in per_episode], dtype=np.float64)
    total = counts.sum()
    weights = (counts / total).reshape(-1, *[1] * per_episode[0]["mean"].ndim)

    def weighted(name: str) -> np.ndarray:
        return (np.stack([s[name] for s in per_episode]) * weights).sum(axis=0)

    mean = weighted("mean")
    spread = [s["std"] ** 2 + (s["mean"] - mean) ** 2 for s in per_episode]
    stats = {
        "min": np.min([s["min"] for s in per_episode], axis=0),
        "max": np.max([s["max"] for s in per_episode], axis=0),
        "mean": mean,
        "std": np.sqrt((np.stack(spread) * weights).sum(axis=0)),
        "count": np.array([int(total)], dtype=np.int64),
    }
    for name in QUANTILES:
        stats[name] = weighted(name)
    return {name: stats[name] for name in STAT_NAMES}


def _stats_json(per_episode: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> dict:
    """stats.json content from the per-episode stats of every committed episode."""
    if not per_episode:
        return {}
    return {
        name: {
            stat: value.tolist()
            for stat, value in _aggregate_stats([episode[name] for episode in per_episode]).items()
        }
        for name in per_episode[0]
    }


def _stats_row(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, list]:
    """Per-episode stats as episode-row columns ``stats/<feature>/<stat>`` (flat lists)."""
    return {
        f"stats/{name}/{stat}": value.reshape(-1).tolist()
        for name, feature_stats in stats.items()
        for stat, value in feature_stats.items()
    }


def _stats_from_row(row: Mapping[str, Any], features: Mapping[str, Any]) -> dict:
    """Inverse of ``_stats_row`` for the given features."""
    stats: dict[str, dict[str, np.ndarray]] = {}
    for name, feature in features.items():
        stats[name] = {}
        for stat in STAT_NAMES:
            value = np.array(row[f"stats/{name}/{stat}"])
            stats[name][stat] = value if stat == "count" else value.reshape(_stats_shape(feature))
    return stats


# ---------------------------------------------------------------------------------------------
# Video
# ---------------------------------------------------------------------------------------------


def _pad_even(frames: np.ndarray) -> np.ndarray:
    """Pad odd heights/widths by one edge pixel (yuv420p needs even sizes); readers crop."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return frames


def _video_info(
    fps: int, video_codec: str, crf: int, lossless: bool, pix_fmt: str
) -> dict[str, Any]:
    """The ``info`` block of a video feature: LeRobot's keys plus how it was encoded."""
    if pix_fmt not in LOSSY_PIX_FMTS:
        raise ValueError(f"pix_fmt must be one of {LOSSY_PIX_FMTS}, got {pix_fmt!r}")
    encoder = LOSSLESS_ENCODER if lossless else video_codec
    return {
        "video.codec": CODEC_NAMES.get(encoder, encoder),
        "video.pix_fmt": "gbrp" if lossless else pix_fmt,
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
        "video.encoder": encoder,
        "video.crf": None if lossless else crf,
        "video.lossless": lossless,
    }


class _VideoEncoder:
    """Encodes the frames of consecutive episodes into one mp4 under a temporary name.

    ``finish`` renames it to its final name, so a crash never leaves a truncated video there.
    Frame i of the file has pts i (time base 1/fps), i.e. it plays at time i / fps.
    """

    def __init__(
        self, path: Path, location: tuple[int, int], fps: int, frame_shape: tuple, info: dict
    ) -> None:
        """Open ``path``'s temporary file with the encoder settings from a feature's info."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.location = location  # (chunk_index, file_index) of ``path``
        self.tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self.num_frames = 0
        self.encoded_bytes = 0
        self._container = av.open(str(self.tmp_path), mode="w", format="mp4")
        self._stream = self._container.add_stream(info["video.encoder"], rate=fps)
        self._stream.height = frame_shape[0] + frame_shape[0] % 2
        self._stream.width = frame_shape[1] + frame_shape[1] % 2
        if info["video.lossless"]:
            self._stream.pix_fmt = "rgb24"
            self._stream.options = {"qp": "0"}
        else:
            self._stream.pix_fmt = info["video.pix_fmt"]
            self._stream.options = {"crf": str(info["video.crf"])}
        self._stream.codec_context.gop_size = fps  # a keyframe every second for random access

    def add(self, frames: np.ndarray) -> int:
        """Append ``uint8 [n, H, W, 3]`` frames; return the file frame index of the first one."""
        first = self.num_frames
        for image in _pad_even(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = self.num_frames
            self._mux(self._stream.encode(frame))
            self.num_frames += 1
        return first

    def _mux(self, packets: list) -> None:
        """Write packets and count their bytes (the file on disk lags behind the encoder)."""
        self.encoded_bytes += sum(packet.size for packet in packets)
        self._container.mux(packets)

    def finish(self) -> None:
        """Flush the encoder, close the file, sync it and move it to its final name."""
        self._mux(self._stream.encode())
        self._container.close()
        with open(self.tmp_path, "rb") as file:
            os.fsync(file.fileno())
        os.replace(self.tmp_path, self.path)

    def abort(self) -> None:
        """Drop the temporary file (best effort: the writer is failing already)."""
        with contextlib.suppress(av.FFmpegError, OSError, ValueError):
            self._container.close()  # closing a broken encoder may fail; the file goes anyway
        self.tmp_path.unlink(missing_ok=True)


def _decode_frames(path: Path, start: int, stop: int, fps: int) -> np.ndarray:
    """Frames [start, stop) of an mp4 as ``uint8 [n, H, W, 3]``.

    Seeks to the keyframe at or before ``start`` and decodes forward; if the seek lands after
    ``start`` (possible with B-frames), decodes from the beginning of the file instead.
    """
    frames: list[np.ndarray] = []
    for seek_frame in (start, 0):
        frames = []
        with _open_video(path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            if seek_frame > 0:
                container.seek(int(Fraction(seek_frame, fps) / stream.time_base), stream=stream)
            for frame in container.decode(stream):
                index = round(frame.pts * stream.time_base * fps)
                if index < start:
                    continue
                if index >= stop or index != start + len(frames):
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
        if len(frames) == stop - start:
            return np.stack(frames)
    raise DatasetError(
        f"{path}: cannot decode frames {start}..{stop - 1} (got {len(frames)} of them)"
    )


def _open_video(path: Path) -> av.container.InputContainer:
    """Open an mp4 for reading; DatasetError naming it when it is missing or unreadable."""
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as error:
        raise DatasetError(f"{path}: unreadable video ({error})") from error
    if not container.streams.video:
        container.close()
        raise DatasetError(f"{path}: has no video stream")
    return container


def _video_num_frames(path: Path, fps: int) -> int:
    """Number of frames an mp4 holds, read from its header."""
    with _open_video(path) as container:
        stream = container.streams.video[0]
        if stream.frames:
            return int(stream.frames)
        return round(stream.duration * stream.time_base * fps) if stream.duration else 0


# ---------------------------------------------------------------------------------------------
# Loading and checking metadata
# ---------------------------------------------------------------------------------------------


@dataclass
class _Metadata:
    """The committed metadata of a dataset, after the checks that do not decode anything."""

    info: dict[str, Any]
    stats: dict[str, Any]
    tasks: list[str]
    episodes: list[dict[str, Any]]  # committed episode rows without stats, by episode_index
    episode_files: list[str]  # committed meta/episodes files (relative paths)
    uncommitted_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _read_json(root: Path, relative: str) -> Any:
    """Parse a JSON file of the dataset; DatasetError naming it if missing or invalid."""
    path = root / relative
    if not path.is_file():
        raise DatasetError(f"{relative}: missing ({root} is not a LeRobot v3.0 dataset?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DatasetError(f"{relative}: not valid JSON ({error})") from error


def _open_parquet(root: Path, relative: str, referenced_by: str) -> pq.ParquetFile:
    """Open a parquet file (reads its footer); DatasetError naming it if missing or corrupt."""
    path = root / relative
    if not path.is_file():
        raise DatasetError(f"{relative}: missing (referenced by {referenced_by})")
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"{relative}: unreadable or truncated parquet ({error})") from error


def _read_table(root: Path, relative: str, referenced_by: str, **kwargs: Any) -> pa.Table:
    """Read a whole parquet file (or some ``columns``); DatasetError naming it on failure."""
    parquet = _open_parquet(root, relative, referenced_by)
    try:
        return parquet.read(**kwargs)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"{relative}: unreadable or truncated parquet ({error})") from error


def _read_info(root: Path) -> dict[str, Any]:
    """meta/info.json, checked for the version and the keys this module relies on."""
    info = _read_json(root, INFO_PATH)
    if not isinstance(info, dict):
        raise DatasetError(f"{INFO_PATH}: expected a JSON object")
    version = info.get("codebase_version")
    if version != CODEBASE_VERSION:
        raise DatasetError(
            f"{INFO_PATH}: unsupported codebase_version: this reader reads {CODEBASE_VERSION}, "
            f"got {version}"
        )
    for key in _INFO_KEYS:
        if key not in info:
            raise DatasetError(f"{INFO_PATH}: missing key {key!r}")
    return info


def _read_tasks(root: Path) -> list[str]:
    """Instructions ordered by task_index, from meta/tasks.parquet."""
    table = _read_table(root, TASKS_PATH, INFO_PATH)
    if {"task", "task_index"} - set(table.column_names):
        raise DatasetError(f"{TASKS_PATH}: needs the columns 'task' and 'task_index'")
    pairs = sorted(zip(table["task_index"].to_pylist(), table["task"].to_pylist(), strict=True))
    if [index for index, _ in pairs] != list(range(len(pairs))):
        raise DatasetError(f"{TASKS_PATH}: task_index must be 0..{len(pairs) - 1}")
    return [task for _, task in pairs]


def _read_episodes(root: Path, info: Mapping[str, Any], meta: _Metadata) -> None:
    """Read the committed episode rows into ``meta``; files beyond the commit point are skipped."""
    total = info["total_episodes"]
    rows: list[dict[str, Any]] = []
    for path in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet")):
        relative = path.relative_to(root).as_posix()
        parquet = _open_parquet(root, relative, INFO_PATH)
        columns = [c for c in parquet.schema_arrow.names if not c.startswith("stats/")]
        required = list(_EPISODE_COLUMNS)
        for key in _video_keys(info["features"]):
            required += [f"videos/{key}/{c}" for c in _VIDEO_COLUMNS]
        missing = [c for c in required if c not in columns]
        if missing:
            raise DatasetError(f"{relative}: missing the episode column {missing[0]!r}")
        table = _read_table(root, relative, INFO_PATH, columns=columns)
        indices = table["episode_index"].to_pylist()
        if indices and min(indices) >= total:
            meta.uncommitted_files.append(relative)
            meta.warnings.append(
                f"{relative}: holds only episodes {min(indices)}..{max(indices)}, beyond "
                f"total_episodes = {total} in {INFO_PATH} (an interrupted write); ignored"
            )
            continue
        if indices and max(indices) >= total:
            raise DatasetError(
                f"{relative}: holds episodes up to {max(indices)} but {INFO_PATH} has "
                f"total_episodes = {total}"
            )
        rows.extend(table.to_pylist())
        meta.episode_files.append(relative)
    rows.sort(key=lambda row: row["episode_index"])
    found = [row["episode_index"] for row in rows]
    if found != list(range(total)):
        missing = sorted(set(range(total)) - set(found))
        problem = f"episode {missing[0]} is missing" if missing else "an episode is duplicated"
        raise DatasetError(
            f"meta/episodes: {problem} ({len(found)} rows for total_episodes = {total} in "
            f"{INFO_PATH})"
        )
    meta.episodes = rows


def _check_episodes(meta: _Metadata) -> None:
    """Index ranges tile [0, total_frames) and agree with lengths; tasks and totals agree."""
    info, end, tasks = meta.info, 0, set(meta.tasks)
    for row in meta.episodes:
        where, episode = _episodes_path(row), row["episode_index"]
        start, stop, length = row["dataset_from_index"], row["dataset_to_index"], row["length"]
        if start != end:
            raise DatasetError(
                f"{where}: episode {episode} starts at index {start} but the previous episode "
                f"ends at {end}; index ranges must tile [0, total_frames)"
            )
        if stop - start != length or length < 1:
            raise DatasetError(
                f"{where}: episode {episode} spans indices [{start}, {stop}) but has "
                f"length {length}"
            )
        for task in row["tasks"]:
            if task not in tasks:
                raise DatasetError(
                    f"{where}: episode {episode} has a task missing from {TASKS_PATH}"
                )
        end = stop
    if end != info["total_frames"]:
        raise DatasetError(
            f"{INFO_PATH}: total_frames = {info['total_frames']} but the episodes metadata holds "
            f"{end} frames"
        )
    if len(meta.tasks) < info["total_tasks"]:
        raise DatasetError(
            f"{INFO_PATH}: total_tasks = {info['total_tasks']} but {TASKS_PATH} has "
            f"{len(meta.tasks)} tasks"
        )
    if len(meta.tasks) > info["total_tasks"]:
        meta.warnings.append(
            f"{TASKS_PATH}: {len(meta.tasks)} tasks but total_tasks = {info['total_tasks']} "
            "(an interrupted write added some)"
        )
    count = meta.stats.get("index", {}).get("count", [0])[0] if meta.stats else 0
    if count != info["total_frames"]:
        meta.warnings.append(
            f"{STATS_PATH}: computed over {count} frames but the dataset has "
            f"{info['total_frames']} (an interrupted write?)"
        )


def _group_by_file(
    rows: Sequence[Mapping[str, Any]], video_key: str | None = None
) -> dict[str, list]:
    """Episode rows grouped by their data file (or video file of ``video_key``), in order."""
    groups: dict[str, list] = {}
    for row in rows:
        path = _data_path(row) if video_key is None else _video_path(row, video_key)
        groups.setdefault(path, []).append(row)
    return groups


def _check_data_files(root: Path, meta: _Metadata) -> None:
    """Every referenced data file opens, has the right rows and columns as info.json says."""
    features = {k: v for k, v in meta.info["features"].items() if v["dtype"] != "video"}
    for relative, rows in _group_by_file(meta.episodes).items():
        parquet = _open_parquet(root, relative, f"episode {rows[0]['episode_index']}")
        expected = sum(row["length"] for row in rows)
        if parquet.metadata.num_rows != expected:
            raise DatasetError(
                f"{relative}: has {parquet.metadata.num_rows} rows but the episodes metadata "
                f"puts {expected} frames in it"
            )
        schema = parquet.schema_arrow
        for name, feature in features.items():
            if name not in schema.names:
                raise DatasetError(
                    f"{relative}: column {name!r} (a feature in info.json) is missing"
                )
            dtype, shape = _arrow_spec(schema.field(name).type)
            if dtype.name != feature["dtype"] or (list(shape) or [1]) != list(feature["shape"]):
                raise DatasetError(
                    f"{relative}: column {name!r} holds {dtype.name} {list(shape) or [1]} but "
                    f"{INFO_PATH} says {feature['dtype']} {list(feature['shape'])}"
                )
        for name in schema.names:
            if name not in features:
                meta.warnings.append(
                    f"{relative}: column {name!r} is not a feature in {INFO_PATH}; ignored"
                )


def _check_video_files(root: Path, meta: _Metadata) -> None:
    """Every referenced video opens and is long enough for the episodes placed in it."""
    fps = meta.info["fps"]
    for key in _video_keys(meta.info["features"]):
        for relative, rows in _group_by_file(meta.episodes, key).items():
            if not (root / relative).is_file():
                raise DatasetError(
                    f"{relative}: missing (referenced by episode {rows[0]['episode_index']})"
                )
            num_frames = _video_num_frames(root / relative, fps)
            for row in rows:
                start = row[f"videos/{key}/from_timestamp"]
                stop = row[f"videos/{key}/to_timestamp"]
                if abs((stop - start) * fps - row["length"]) > 1e-3:
                    raise DatasetError(
                        f"{_episodes_path(row)}: episode {row['episode_index']} spans "
                        f"{stop - start:.4f} s of {relative} but has {row['length']} frames"
                    )
                if stop * fps > num_frames + 1e-3:
                    raise DatasetError(
                        f"{relative}: episode {row['episode_index']} ends at {stop:.4f} s but the "
                        f"video holds {num_frames} frames ({num_frames / fps:.4f} s)"
                    )


def _load_metadata(root: Path) -> _Metadata:
    """Read and check everything except the frame data itself; DatasetError on the first problem."""
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory")
    info = _read_info(root)
    stats = _read_json(root, STATS_PATH)
    if not isinstance(stats, dict):
        raise DatasetError(f"{STATS_PATH}: expected a JSON object")
    meta = _Metadata(info=info, stats=stats, tasks=_read_tasks(root), episodes=[], episode_files=[])
    _read_episodes(root, info, meta)
    _check_episodes(meta)
    _check_data_files(root, meta)
    _check_video_files(root, meta)
    return meta


def _check_data_columns(root: Path, meta: _Metadata) -> None:
    """The index / episode_index / frame_index columns of every data file match the metadata."""
    for relative, rows in _group_by_file(meta.episodes).items():
        columns = ["index", "episode_index", "frame_index"]
        table = _read_table(root, relative, f"episode {rows[0]['episode_index']}", columns=columns)
        expected = {
            "index": np.concatenate(
                [np.arange(r["dataset_from_index"], r["dataset_to_index"]) for r in rows]
            ),
            "episode_index": np.concatenate(
                [np.full(r["length"], r["episode_index"]) for r in rows]
            ),
            "frame_index": np.concatenate([np.arange(r["length"]) for r in rows]),
        }
        for name, values in expected.items():
            if not np.array_equal(_from_arrow(table[name]), values):
                raise DatasetError(
                    f"{relative}: column {name!r} disagrees with the episodes metadata"
                )


def _unreferenced_files(root: Path, meta: _Metadata) -> list[str]:
    """Warnings for files that no committed metadata points to (left by interrupted writes)."""
    referenced = {INFO_PATH, STATS_PATH, TASKS_PATH, *meta.episode_files, *meta.uncommitted_files}
    referenced.update(_group_by_file(meta.episodes))
    for key in _video_keys(meta.info["features"]):
        referenced.update(_group_by_file(meta.episodes, key))
    warnings = []
    for directory in ("meta", "data", "videos"):
        for path in sorted((root / directory).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and relative not in referenced:
                warnings.append(f"{relative}: not referenced by the metadata (interrupted write?)")
    return warnings


def validate_dataset(root: str | os.PathLike[str]) -> list[str]:
    """Check a dataset on disk; raise DatasetError naming the first problem, return warnings."""
    root = Path(root)
    meta = _load_metadata(root)
    _check_data_columns(root, meta)
    return meta.warnings + _unreferenced_files(root, meta)


# ---------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------


@dataclass
class _PendingEpisode:
    """An episode added but not yet committed: its row, its data rows and its stats."""

    row: dict[str, Any]
    table: pa.Table
    stats: dict[str, dict[str, np.ndarray]]


def _tasks_table(tasks: Sequence[str]) -> pa.Table:
    """meta/tasks.parquet as LeRobot writes it with pandas: ``task`` is the (named) index."""
    pandas_metadata = {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {
                "name": name,
                "field_name": name,
                "pandas_type": pandas_type,
                "numpy_type": numpy_type,
                "metadata": None,
            }
            for name, pandas_type, numpy_type in (
                ("task_index", "int64", "int64"),
                ("task", "unicode", "object"),
            )
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }
    table = pa.table(
        {
            "task_index": pa.array(np.arange(len(tasks), dtype=np.int64)),
            "task": pa.array(list(tasks), type=pa.string()),
        }
    )
    return table.replace_schema_metadata({"pandas": json.dumps(pandas_metadata)})


class LeRobotDatasetWriter:
    """Writes Trajectories into a LeRobot v3.0 dataset, in batches of new files (crash-safe).

    Episodes are buffered; when the buffered data reaches ``data_file_size_mb`` (in-memory
    arrow size, as LeRobot measures it) or a buffered video reaches ``video_file_size_mb``
    (encoded bytes), or on ``close``, the batch is written as one new data file, one new video
    file per camera and one new episodes file, then tasks, stats and info.json (last).

    Images are H.264 at ``crf`` with full colour resolution (``pix_fmt`` yuv444p) by default:
    at the 64-128 px a CPU renders, 4:2:0 chroma subsampling smears the colour of small objects,
    and colour is what the instructions name (PSNR ~28 dB with yuv420p vs ~36-39 with yuv444p).
    ``pix_fmt="yuv420p"`` makes files that browsers play;
    ``lossless=True`` stores them bit-exactly (H.264 RGB at qp 0; ``video_codec`` and ``crf``
    are then unused). If writing a batch fails, the writer closes without committing it and the
    dataset keeps its previous state.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        fps: int = 16,
        robot_type: str = "embodied-gantry",
        video_codec: str = "libx264",
        crf: int = LOSSY_CRF,
        lossless: bool = False,
        pix_fmt: str = "yuv444p",
        data_file_size_mb: float = DATA_FILE_SIZE_MB,
        video_file_size_mb: float = VIDEO_FILE_SIZE_MB,
    ) -> None:
        """Create a new dataset at ``root`` (which must not exist, or be an empty directory)."""
        root = Path(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise FileExistsError(
                f"{root} exists and is not an empty directory; use "
                "LeRobotDatasetWriter.open(root) to append to a dataset"
            )
        if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
            raise ValueError(f"fps must be a positive int (LeRobot stores it as one), got {fps!r}")
        root.mkdir(parents=True, exist_ok=True)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": robot_type,
            "total_episodes": 0,
            "total_frames": 0,
            "total_tasks": 0,
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": data_file_size_mb,
            "video_files_size_in_mb": video_file_size_mb,
            "fps": fps,
            "splits": {"train": "0:0"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": {},
        }
        self._start(root, info, _video_info(fps, video_codec, crf, lossless, pix_fmt))

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        data_file_size_mb: float | None = None,
        video_file_size_mb: float | None = None,
    ) -> LeRobotDatasetWriter:
        """Append to an existing dataset; videos are encoded as the dataset's existing ones.

        Metadata files left by an interrupted writer (episodes beyond ``total_episodes``) are
        deleted; new files never reuse the name of a file on disk. Size limits default to the
        ones recorded in info.json.
        """
        root = Path(root)
        meta = _load_metadata(root)
        features = meta.info["features"]
        for relative in meta.uncommitted_files:
            (root / relative).unlink()
        info = dict(meta.info)
        if data_file_size_mb is not None:
            info["data_files_size_in_mb"] = data_file_size_mb
        if video_file_size_mb is not None:
            info["video_files_size_in_mb"] = video_file_size_mb
        video_keys = _video_keys(features)
        video_info = _video_info(info["fps"], "libx264", LOSSY_CRF, False, "yuv420p")
        if video_keys:  # encode like the existing videos
            video_info.update(features[video_keys[0]].get("info", {}))
        writer = cls.__new__(cls)
        writer._start(root, info, video_info)
        writer._tasks = {task: index for index, task in enumerate(meta.tasks)}
        writer._episodes = meta.episodes
        writer._episode_stats = _read_episode_stats(root, meta)
        if meta.episodes:
            last_data_file = root / _data_path(meta.episodes[-1])
            schema = pq.read_schema(last_data_file)
            writer._frame_spec = {
                name: (np.dtype(np.uint8), tuple(feature["shape"]))
                if feature["dtype"] == "video"
                else _arrow_spec(schema.field(name).type)
                for name, feature in features.items()
                if name not in DEFAULT_FEATURES
            }
        return writer

    def _start(self, root: Path, info: dict[str, Any], video_info: dict[str, Any]) -> None:
        """Set up the writer's state (shared by ``__init__`` and ``open``)."""
        self.root = root
        self._info = info
        self._video_info = video_info
        self._tasks: dict[str, int] = {}
        self._episodes: list[dict[str, Any]] = []  # committed rows
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []  # committed
        self._frame_spec: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
        self._pending: list[_PendingEpisode] = []
        self._pending_bytes = 0
        self._num_frames = info["total_frames"]  # committed and buffered
        self._encoders: dict[str, _VideoEncoder] = {}
        self._closed = False
        self._next_data = _first_free_location(root / "data", ".parquet")
        self._next_episodes = _first_free_location(root / "meta/episodes", ".parquet")
        self._next_video: dict[str, tuple[int, int]] = {}  # per camera, after a commit

    @property
    def num_episodes(self) -> int:
        """Episodes added so far, committed or buffered."""
        return len(self._episodes) + len(self._pending)

    def __enter__(self) -> LeRobotDatasetWriter:
        """Use as a context manager; ``close`` commits what was added."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Commit the buffered (complete) episodes even when the block raised."""
        self.close()

    def add_episode(self, traj: Trajectory) -> int:
        """Validate and buffer one trajectory; return its episode index.

        Raises ValueError when its keys, dtypes or shapes differ from the dataset's.
        """
        if self._closed:
            raise ValueError(
                "this LeRobotDatasetWriter is closed (by close(), add_frame_feature() or a "
                "failed write)"
            )
        extras = _extra_features(self._info["features"])
        if extras:
            raise ValueError(
                f"cannot add episodes to {self.root}: its features {extras} were added after "
                "writing (add_frame_feature) and trajectories do not carry them"
            )
        columns = _trajectory_columns(traj)  # validates the trajectory
        metadata_json = _check_episode_scalars(traj)
        self._check_columns(columns)
        try:
            self._buffer(traj, columns, metadata_json)
            if self._pending_bytes >= self._info["data_files_size_in_mb"] * 1024**2 or any(
                encoder.encoded_bytes >= self._info["video_files_size_in_mb"] * 1024**2
                for encoder in self._encoders.values()
            ):
                self._commit()
        except BaseException:
            self._fail()
            raise
        return self.num_episodes - 1

    def close(self) -> None:
        """Commit the buffered episodes and finish; safe to call twice."""
        if self._closed:
            return
        try:
            self._commit()
        except BaseException:
            self._fail()
            raise
        self._closed = True

    def add_frame_feature(
        self,
        name: str,
        values_per_episode: Sequence[np.ndarray],
        info: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        """Commit what was added, then ``LeRobotDataset.add_frame_feature``; closes the writer.

        The writer takes no more episodes afterwards: trajectories do not carry the new feature.
        """
        self.close()
        root_meta = _load_metadata(self.root)
        _add_frame_feature(self.root, root_meta, name, values_per_episode, info, overwrite)

    def _check_columns(self, columns: Sequence[_Column]) -> None:
        """Raise ValueError naming the key if an episode does not match the dataset's columns."""
        spec = {c.name: (c.values.dtype, c.values.shape[1:]) for c in columns}
        if self._frame_spec is None:
            self._frame_spec = spec
            features = self._info["features"]
            for column in columns:
                features[column.name] = _feature_spec(
                    column, self._video_info if column.video else None
                )
            features.update(json.loads(json.dumps(DEFAULT_FEATURES)))
            return
        features = self._info["features"]

        def describe(name: str, field: str | None) -> str:
            return f"{field} (feature {name!r})" if field else f"feature {name!r}"

        for name, (dtype, shape) in self._frame_spec.items():
            field = features[name].get("trajectory_field")
            if name not in spec:
                raise ValueError(
                    f"the trajectory lacks {describe(name, field)}, which the dataset has"
                )
            if spec[name] != (dtype, shape):
                raise ValueError(
                    f"{describe(name, field)}: the trajectory has dtype {spec[name][0]} and "
                    f"per-step shape {spec[name][1]} but the dataset has dtype {dtype} and "
                    f"per-step shape {shape}"
                )
        for column in columns:
            if column.name not in self._frame_spec:
                raise ValueError(
                    f"the trajectory has {describe(column.name, column.field)}, which the "
                    "dataset lacks"
                )

    def _buffer(self, traj: Trajectory, columns: Sequence[_Column], metadata_json: str) -> None:
        """Encode the episode's images and keep its data rows, row and stats for the commit."""
        fps = self._info["fps"]
        episode_index, first_index = self.num_episodes, self._num_frames
        num_frames = traj.length + 1
        task_index = self._tasks.setdefault(traj.instruction, len(self._tasks))
        frame_index = np.arange(num_frames, dtype=np.int64)
        values = {
            "timestamp": (frame_index / fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(num_frames, episode_index, dtype=np.int64),
            "index": first_index + frame_index,
            "task_index": np.full(num_frames, task_index, dtype=np.int64),
        }
        values.update({column.name: column.values for column in columns})
        features = self._info["features"]

        row: dict[str, Any] = {
            "episode_index": episode_index,
            "tasks": [traj.instruction],
            "length": num_frames,
            "dataset_from_index": first_index,
            "dataset_to_index": first_index + num_frames,
        }
        for name in _video_keys(features):
            if name not in self._encoders:
                self._encoders[name] = self._open_encoder(name, values[name].shape[1:])
            encoder = self._encoders[name]
            first_frame = encoder.add(values[name])
            row[f"videos/{name}/chunk_index"], row[f"videos/{name}/file_index"] = encoder.location
            row[f"videos/{name}/from_timestamp"] = first_frame / fps
            row[f"videos/{name}/to_timestamp"] = (first_frame + num_frames) / fps
        row.update(
            success=bool(traj.success),
            seed=-1 if traj.seed is None else int(traj.seed),
            suite=traj.suite,
            task_name=traj.task,
            metadata=metadata_json,
        )

        data_names = [name for name in features if features[name]["dtype"] != "video"]
        table = pa.table({name: _to_arrow(values[name]) for name in data_names})
        stats = {
            name: _episode_stats(
                _real_steps(name, values[name]), features[name]["dtype"] == "video"
            )
            for name in features
        }
        self._pending.append(_PendingEpisode(row=row, table=table, stats=stats))
        self._pending_bytes += table.nbytes
        self._num_frames += num_frames

    def _open_encoder(self, name: str, frame_shape: tuple[int, ...]) -> _VideoEncoder:
        """Start the next video file of camera ``name`` (after every file on disk)."""
        location = self._next_video.get(name)
        if location is None:
            location = _first_free_location(self.root / "videos" / name, ".mp4")
        path = self.root / VIDEO_PATH.format(
            video_key=name, chunk_index=location[0], file_index=location[1]
        )
        return _VideoEncoder(path, location, self._info["fps"], frame_shape, self._video_info)

    def _commit(self) -> None:
        """Write the buffered episodes as new files, then the metadata, info.json last."""
        if self._pending:
            for encoder in self._encoders.values():
                encoder.finish()
            data_location, episodes_location = self._next_data, self._next_episodes
            _write_parquet(
                self.root
                / DATA_PATH.format(chunk_index=data_location[0], file_index=data_location[1]),
                pa.concat_tables([episode.table for episode in self._pending]),
            )
            rows = []
            for episode in self._pending:
                episode.row["data/chunk_index"], episode.row["data/file_index"] = data_location
                episode.row["meta/episodes/chunk_index"] = episodes_location[0]
                episode.row["meta/episodes/file_index"] = episodes_location[1]
                rows.append({**episode.row, **_stats_row(episode.stats)})
            _write_parquet(
                self.root
                / EPISODES_PATH.format(
                    chunk_index=episodes_location[0], file_index=episodes_location[1]
                ),
                pa.Table.from_pylist(rows),
            )
            self._episodes.extend(episode.row for episode in self._pending)
            self._episode_stats.extend(episode.stats for episode in self._pending)
            self._next_data = _next_location(data_location)
            self._next_episodes = _next_location(episodes_location)
            for name, encoder in self._encoders.items():
                self._next_video[name] = _next_location(encoder.location)
            self._encoders = {}
            self._pending = []
            self._pending_bytes = 0

        _write_parquet(self.root / TASKS_PATH, _tasks_table(list(self._tasks)))
        _write_json(self.root / STATS_PATH, _stats_json(self._episode_stats))
        num_episodes = len(self._episodes)
        self._info.update(
            total_episodes=num_episodes,
            total_frames=self._num_frames,
            total_tasks=len(self._tasks),
            splits={"train": f"0:{num_episodes}"},
        )
        _write_json(self.root / INFO_PATH, self._info)

    def _fail(self) -> None:
        """Drop the buffer and temporary videos after an error; the dataset stays as committed."""
        for encoder in self._encoders.values():
            encoder.abort()
        self._encoders = {}
        self._pending = []
        self._closed = True


def _read_episode_stats(root: Path, meta: _Metadata) -> list[dict[str, dict[str, np.ndarray]]]:
    """Per-episode stats of the committed episodes, from the ``stats/...`` episode columns."""
    features = meta.info["features"]
    stats: dict[int, dict[str, dict[str, np.ndarray]]] = {}
    for relative in meta.episode_files:
        for row in _read_table(root, relative, INFO_PATH).to_pylist():
            stats[row["episode_index"]] = _stats_from_row(row, features)
    return [stats[index] for index in range(len(meta.episodes))]


def _extra_features(features: Mapping[str, Any]) -> list[str]:
    """Features added after writing (``add_frame_feature``): no Trajectory field holds them."""
    return [
        name
        for name, feature in features.items()
        if "trajectory_field" not in feature
        and name not in DEFAULT_FEATURES
        and name not in DERIVED_FEATURES
    ]


def _add_frame_feature(
    root: Path,
    meta: _Metadata,
    name: str,
    values_per_episode: Sequence[np.ndarray],
    info: dict[str, Any] | None,
    overwrite: bool,
) -> None:
    """``LeRobotDataset.add_frame_feature`` for the dataset at ``root`` (metadata ``meta``)."""
    features = meta.info["features"]
    if not name or "/" in name:
        raise ValueError(f"feature names must be non-empty and without '/', got {name!r}")
    if name in features and not (overwrite and name in _extra_features(features)):
        raise ValueError(
            f"the dataset has a feature {name!r} already; overwrite=True replaces one that "
            "add_frame_feature added"
        )
    if not meta.episodes:
        raise ValueError("the dataset has no episodes to add a feature to")
    if len(values_per_episode) != len(meta.episodes):
        raise ValueError(
            f"values_per_episode has {len(values_per_episode)} entries but the dataset has "
            f"{len(meta.episodes)} episodes"
        )
    values = [np.asarray(v) for v in values_per_episode]
    for episode, (array, row) in enumerate(zip(values, meta.episodes, strict=True)):
        if array.dtype.kind not in "biuf" or len(array) != row["length"]:
            raise ValueError(
                f"values_per_episode[{episode}] must be numeric with {row['length']} "
                f"entries (one per frame), got {array.dtype} {list(array.shape)}"
            )
        if (array.dtype, array.shape[1:]) != (values[0].dtype, values[0].shape[1:]):
            raise ValueError(
                f"values_per_episode[{episode}] has dtype {array.dtype} and per-frame shape "
                f"{array.shape[1:]} but values_per_episode[0] has {values[0].dtype} and "
                f"{values[0].shape[1:]}"
            )

    for relative, rows in _group_by_file(meta.episodes).items():
        table = _read_table(root, relative, f"episode {rows[0]['episode_index']}")
        order = np.concatenate([np.full(r["length"], r["episode_index"]) for r in rows])
        if not np.array_equal(_from_arrow(table["episode_index"]), order):
            raise DatasetError(f"{relative}: rows are not in the episode order of the metadata")
        if name in table.column_names:  # an older version, or left by an interrupted call
            table = table.drop_columns([name])
        column = np.concatenate([values[r["episode_index"]] for r in rows])
        _write_parquet(root / relative, table.append_column(name, _to_arrow(column)))

    stats = [_episode_stats(_real_steps(name, array), video=False) for array in values]
    for relative in meta.episode_files:
        table = _read_table(root, relative, INFO_PATH)
        table = table.drop_columns(
            [c for c in table.column_names if c.startswith(f"stats/{name}/")]
        )
        rows = [_stats_row({name: stats[e]}) for e in table["episode_index"].to_pylist()]
        for column in rows[0]:
            table = table.append_column(column, pa.array([row[column] for row in rows]))
        _write_parquet(root / relative, table)

    all_stats = {**meta.stats, **_stats_json([{name: s} for s in stats])}
    _write_json(root / STATS_PATH, all_stats)
    new_info = json.loads(json.dumps(meta.info))
    spec = {"dtype": values[0].dtype.name, "shape": list(values[0].shape[1:]) or [1]}
    new_info["features"][name] = {**spec, "names": None, **({"info": info} if info else {})}
    _write_json(root / INFO_PATH, new_info)


# ---------------------------------------------------------------------------------------------
# Reader
# ---------------------------------------------------------------------------------------------


class LeRobotDataset:
    """Reads a LeRobot v3.0 dataset: Trajectories, per-frame columns and single frames.

    Opening runs the checks that need no decoding (``validate_dataset`` adds column and
    leftover-file checks) and raises DatasetError on a corrupted dataset.
    """

    _CACHED_TABLES = 4  # data files kept in memory for random access

    def __init__(self, root: str | os.PathLike[str]) -> None:
        """Open and check the dataset at ``root``."""
        self.root = Path(root)
        self._load()

    def _load(self) -> None:
        """(Re)read the metadata and forget cached data files."""
        self._meta = _load_metadata(self.root)
        self._starts = np.array([row["dataset_from_index"] for row in self._meta.episodes])
        self._tables: dict[str, tuple[pa.Table, np.ndarray]] = {}

    @property
    def num_episodes(self) -> int:
        """Number of episodes."""
        return len(self._meta.episodes)

    @property
    def num_frames(self) -> int:
        """Number of frames over all episodes (T+1 per episode of T steps)."""
        return int(self._meta.info["total_frames"])

    @property
    def fps(self) -> int:
        """Frames per second."""
        return int(self._meta.info["fps"])

    @property
    def features(self) -> dict[str, Any]:
        """The feature specs of info.json ({name: {dtype, shape, names, ...}})."""
        return self._meta.info["features"]

    @property
    def tasks(self) -> list[str]:
        """Instructions, ordered by task_index."""
        return list(self._meta.tasks)

    @property
    def info(self) -> dict[str, Any]:
        """The content of meta/info.json."""
        return self._meta.info

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        """meta/stats.json as {feature: {stat: array}}."""
        return {
            name: {stat: np.array(value) for stat, value in stats.items()}
            for name, stats in self._meta.stats.items()
        }

    def __len__(self) -> int:
        """Number of frames."""
        return self.num_frames

    def episodes_table(self) -> list[dict[str, Any]]:
        """The episodes metadata: one dict per episode (without per-episode stats)."""
        return [dict(row) for row in self._meta.episodes]

    def episode_lengths(self) -> np.ndarray:
        """Steps T of each episode (``Trajectory.length``; an episode has T+1 frames)."""
        return np.array([row["length"] - 1 for row in self._meta.episodes], dtype=np.int64)

    def episode_success(self) -> np.ndarray:
        """Whether each episode succeeded."""
        return np.array([bool(row["success"]) for row in self._meta.episodes], dtype=bool)

    def episode(self, index: int) -> Trajectory:
        """Episode ``index`` as the Trajectory that was written (images decoded)."""
        frames = self.episode_frames(index)
        return _frames_to_trajectory(frames, self.features, self._row(index))

    def episode_frames(
        self, index: int, keys: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Per-frame columns of an episode ([T+1, ...]), extras and decoded images included.

        ``keys`` picks features (videos not asked for are not decoded); default all of them.
        """
        row = self._row(index)
        table = self._episode_rows(row)
        frames = {}
        for name in self.features if keys is None else keys:
            if name not in self.features:
                raise KeyError(f"no feature {name!r}; the dataset has {list(self.features)}")
            if self.features[name]["dtype"] == "video":
                frames[name] = self._decode(row, name, 0, row["length"])
            else:
                frames[name] = _from_arrow(table[name])
        return frames

    def frame(self, index: int) -> dict[str, np.ndarray]:
        """Frame ``index`` (global) as {feature: value}; decodes only that frame of each video."""
        if not 0 <= index < self.num_frames:
            raise IndexError(f"frame {index} is out of range for {self.num_frames} frames")
        episode = int(np.searchsorted(self._starts, index, side="right")) - 1
        row = self._row(episode)
        offset = index - row["dataset_from_index"]
        table = self._episode_rows(row).slice(offset, 1)
        frame = {}
        for name, feature in self.features.items():
            if feature["dtype"] == "video":
                frame[name] = self._decode(row, name, offset, offset + 1)[0]
            else:
                frame[name] = _from_arrow(table[name])[0]
        return frame

    def add_frame_feature(
        self,
        name: str,
        values_per_episode: Sequence[np.ndarray],
        info: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        """Add a per-frame column (e.g. ``progress.label``) to every episode, on disk.

        ``values_per_episode[e]`` holds one entry per frame of episode e ([T+1, ...]); ``info``
        goes to the feature's info.json entry. ``overwrite=True`` replaces a feature added this
        way before. Data files and episodes files are rewritten atomically, then stats.json,
        then info.json: until info.json names the feature, readers ignore the column.
        """
        _add_frame_feature(self.root, self._meta, name, values_per_episode, info, overwrite)
        self._load()

    def _row(self, index: int) -> dict[str, Any]:
        """The metadata row of episode ``index``."""
        if not 0 <= index < self.num_episodes:
            raise IndexError(f"episode {index} is out of range for {self.num_episodes} episodes")
        return self._meta.episodes[index]

    def _episode_rows(self, row: Mapping[str, Any]) -> pa.Table:
        """The data rows of one episode, from a (cached) data file."""
        relative = _data_path(row)
        if relative not in self._tables:
            if len(self._tables) >= self._CACHED_TABLES:
                del self._tables[next(iter(self._tables))]
            table = _read_table(self.root, relative, f"episode {row['episode_index']}")
            self._tables[relative] = (table, _from_arrow(table["index"]))
        table, index = self._tables[relative]
        start = int(np.searchsorted(index, row["dataset_from_index"]))
        stop = start + row["length"]
        if (
            stop > len(index)
            or index[start] != row["dataset_from_index"]
            or (index[stop - 1] != row["dataset_to_index"] - 1)
        ):
            raise DatasetError(
                f"{relative}: the rows of episode {row['episode_index']} are not where the "
                "episodes metadata says"
            )
        return table.slice(start, row["length"])

    def _decode(self, row: Mapping[str, Any], key: str, start: int, stop: int) -> np.ndarray:
        """Frames [start, stop) of an episode's video ``key``, cropped to the feature's size."""
        first = round(row[f"videos/{key}/from_timestamp"] * self.fps)
        frames = _decode_frames(
            self.root / _video_path(row, key), first + start, first + stop, self.fps
        )
        height, width = self.features[key]["shape"][:2]
        return frames[:, :height, :width]


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def dataset_summary(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Episodes, frames, fps, tasks, features, success rate, size, codec: ``dataset info``."""
    dataset = LeRobotDataset(root)
    successes = dataset.episode_success()
    codecs = sorted(
        {
            f"{feature.get('info', {}).get('video.codec')} "
            f"({feature.get('info', {}).get('video.pix_fmt')})"
            for feature in dataset.features.values()
            if feature["dtype"] == "video"
        }
    )
    size = sum(path.stat().st_size for path in dataset.root.rglob("*") if path.is_file())
    return {
        "root": str(dataset.root),
        "codebase_version": dataset.info["codebase_version"],
        "robot_type": dataset.info.get("robot_type"),
        "episodes": dataset.num_episodes,
        "frames": dataset.num_frames,
        "fps": dataset.fps,
        "tasks": dataset.tasks,
        "success_rate": float(successes.mean()) if len(successes) else None,
        "size_bytes": size,
        "video_codec": ", ".join(codecs) if codecs else None,
        "features": {
            name: f"{feature['dtype']} {list(feature['shape'])}"
            for name, feature in dataset.features.items()
        },
    }
