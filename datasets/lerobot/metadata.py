"""Loading a dataset's committed metadata (info, stats, tasks, episode rows) with every check
that needs no decoding; the reader, the writer's ``open`` and ``validate_dataset`` use it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embodied.datasets.lerobot.file_checks import _check_data_files, _check_video_files
from embodied.datasets.lerobot.files import _open_parquet, _read_json, _read_table
from embodied.datasets.lerobot.layout import (
    CODEBASE_VERSION,
    DATA_PATH,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    DatasetError,
    _episodes_path,
    _video_keys,
)
from embodied.datasets.lerobot.stats import IMAGE_DTYPES, STAT_NAMES, _stats_shape

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
# Numeric dtypes a parquet column can hold and this package reads back (plus "video").
_NUMERIC_DTYPES = (
    "bool",
    *(f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)),
    "float16",
    "float32",
    "float64",
)
_REQUIRED_STATS = ("min", "max", "mean", "std", "count")


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


def _is_int(value: Any) -> bool:
    """An int that is not a bool (JSON ``true`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    """A JSON value and its type, for messages: ``"16" (a string)``."""
    if isinstance(value, dict):
        return "an object"
    kinds = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    kind = kinds.get(type(value), "a list" if isinstance(value, list) else "null")
    text = json.dumps(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({kind})"


def _read_info(root: Path) -> dict[str, Any]:
    """meta/info.json, checked for the version, the keys this package relies on and their types."""
    info = _read_json(root, INFO_PATH)
    if not isinstance(info, dict):
        raise DatasetError(f"{INFO_PATH}: expected a JSON object, got {_describe(info)}")
    version = info.get("codebase_version")
    if version != CODEBASE_VERSION:
        raise DatasetError(
            f"{INFO_PATH}: unsupported codebase_version: this reader reads {CODEBASE_VERSION}, "
            f"got {version}"
        )
    for key in _INFO_KEYS:
        if key not in info:
            raise DatasetError(f"{INFO_PATH}: missing key {key!r}")
    _check_info_types(info)
    for name, feature in info["features"].items():
        _check_feature(name, feature, info)
    if info["total_episodes"] > 0:
        for name, dtype in (
            ("index", "int"),
            ("episode_index", "int"),
            ("frame_index", "int"),
            ("task_index", "int"),
            ("timestamp", "float"),
        ):
            feature = info["features"].get(name)
            if feature is None:
                raise DatasetError(f"{INFO_PATH}: missing LeRobot's feature {name!r}")
            if not feature["dtype"].startswith(dtype) or feature["shape"] != [1]:
                raise DatasetError(
                    f"{INFO_PATH}: feature {name!r} must be a scalar {dtype}, got "
                    f"{feature['dtype']} {feature['shape']}"
                )
    return info


def _check_info_types(info: Mapping[str, Any]) -> None:
    """The type (and range) of every info.json field this package or LeRobot reads."""

    def bad(key: str, expected: str) -> DatasetError:
        return DatasetError(f"{INFO_PATH}: {key!r} must be {expected}, got {_describe(info[key])}")

    if not _is_int(info["fps"]) or info["fps"] <= 0:
        raise bad("fps", "a positive integer")
    for key in ("total_episodes", "total_frames", "total_tasks"):
        if not _is_int(info[key]) or info[key] < 0:
            raise bad(key, "an integer >= 0")
    if not _is_int(info["chunks_size"]) or info["chunks_size"] <= 0:
        raise bad("chunks_size", "a positive integer")
    for key in ("data_files_size_in_mb", "video_files_size_in_mb"):
        if key in info and (not _is_number(info[key]) or not info[key] > 0):
            raise bad(key, "a positive number")
    if info.get("robot_type") is not None and not isinstance(info["robot_type"], str):
        raise bad("robot_type", "a string or null")
    splits = info.get("splits")
    if splits is not None and not (
        isinstance(splits, dict) and all(isinstance(v, str) for v in splits.values())
    ):
        raise bad("splits", 'an object of strings like {"train": "0:10"}')
    if "data_path" in info and info["data_path"] != DATA_PATH:
        raise bad("data_path", f"LeRobot v3.0's {DATA_PATH!r} (the only layout read here)")
    if not isinstance(info["features"], dict):
        raise bad("features", "an object of feature specs")
    has_videos = any(
        isinstance(f, dict) and f.get("dtype") == "video" for f in info["features"].values()
    )
    if has_videos and info.get("video_path") != VIDEO_PATH:
        raise DatasetError(
            f"{INFO_PATH}: 'video_path' must be LeRobot v3.0's {VIDEO_PATH!r} (the only layout "
            f"read here), got {_describe(info.get('video_path'))}"
        )


def _check_feature(name: str, feature: Any, info: Mapping[str, Any]) -> None:
    """One entry of info.json's ``features``: dtype, shape, names, video info."""
    where = f"{INFO_PATH}: feature {name!r}"
    if not isinstance(feature, dict):
        raise DatasetError(f"{where} must be an object, got {_describe(feature)}")
    for key in ("dtype", "shape"):
        if key not in feature:
            raise DatasetError(f"{where} has no {key!r}")
    dtype, shape = feature["dtype"], feature["shape"]
    if not isinstance(dtype, str):
        raise DatasetError(f"{where}: 'dtype' must be a string, got {_describe(dtype)}")
    if dtype == "string":
        raise DatasetError(
            f"{where} has dtype 'string', which this toolkit does not read (it reads 'video', "
            "'image' and numeric features)"
        )
    if dtype not in IMAGE_DTYPES and dtype not in _NUMERIC_DTYPES:
        raise DatasetError(
            f"{where} has an unknown dtype {dtype!r} (expected 'video', 'image' or one of "
            f"{', '.join(_NUMERIC_DTYPES)})"
        )
    if not (
        isinstance(shape, list) and shape and all(_is_int(size) and size > 0 for size in shape)
    ):
        raise DatasetError(
            f"{where}: 'shape' must be a non-empty list of positive integers, got "
            f"{_describe(shape)}"
        )
    names = feature.get("names")
    if names is not None and not isinstance(names, list | dict):
        raise DatasetError(f"{where}: 'names' must be a list, an object or null")
    if "trajectory_field" in feature and not isinstance(feature["trajectory_field"], str):
        raise DatasetError(f"{where}: 'trajectory_field' must be a string")
    if dtype in IMAGE_DTYPES and (len(shape) != 3 or shape[2] != 3):
        raise DatasetError(f"{where}: an {dtype}'s shape must be [height, width, 3], got {shape}")
    if dtype == "video":
        video_info = feature.get("info", {})
        if not isinstance(video_info, dict):
            raise DatasetError(f"{where}: 'info' must be an object")
        video_fps = video_info.get("video.fps")
        if video_fps is not None and video_fps != info["fps"]:
            raise DatasetError(
                f"{where}: info 'video.fps' is {_describe(video_fps)} but 'fps' is {info['fps']}"
            )


def _check_stats(meta: _Metadata) -> None:
    """meta/stats.json: statistics of the right shape for every feature (when there are frames)."""
    stats, features = meta.stats, meta.info["features"]
    for name, feature_stats in stats.items():
        if not isinstance(feature_stats, dict):
            raise DatasetError(f"{STATS_PATH}: {name!r} must be an object of statistics")
        if name not in features:
            meta.warnings.append(f"{STATS_PATH}: statistics of {name!r}, not a feature; ignored")
            continue
        expected = _stats_shape(features[name])
        for stat, value in feature_stats.items():
            if stat not in STAT_NAMES:
                continue
            try:
                array = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                raise DatasetError(
                    f"{STATS_PATH}: {name}/{stat} is not an array of numbers"
                ) from None
            want = (1,) if stat == "count" else expected
            # Datasets written before the stats took LeRobot's shapes hold them per entry.
            legacy = stat != "count" and array.shape == tuple(features[name]["shape"])
            if array.shape != want and not legacy:
                raise DatasetError(
                    f"{STATS_PATH}: {name}/{stat} has shape {list(array.shape)} but feature "
                    f"{name!r} needs {list(want)}"
                )
    if meta.info["total_frames"] > 0:
        for name in features:
            missing = [s for s in _REQUIRED_STATS if s not in stats.get(name, {})]
            if missing:
                raise DatasetError(f"{STATS_PATH}: no {missing[0]!r} statistic for {name!r}")


def _read_tasks(root: Path) -> list[str]:
    """Instructions ordered by task_index, from meta/tasks.parquet."""
    table = _read_table(root, TASKS_PATH, INFO_PATH)
    if {"task", "task_index"} - set(table.column_names):
        raise DatasetError(f"{TASKS_PATH}: needs the columns 'task' and 'task_index'")
    if not pa.types.is_integer(table.schema.field("task_index").type) or not (
        pa.types.is_string(table.schema.field("task").type)
        or pa.types.is_large_string(table.schema.field("task").type)
    ):
        raise DatasetError(f"{TASKS_PATH}: 'task_index' must be integers and 'task' strings")
    if table["task_index"].null_count or table["task"].null_count:
        raise DatasetError(f"{TASKS_PATH}: holds empty (null) entries")
    pairs = sorted(zip(table["task_index"].to_pylist(), table["task"].to_pylist(), strict=True))
    if [index for index, _ in pairs] != list(range(len(pairs))):
        raise DatasetError(f"{TASKS_PATH}: task_index must be 0..{len(pairs) - 1}")
    return [task for _, task in pairs]


def _check_episode_columns(relative: str, table: pa.Table, video_keys: list[str]) -> None:
    """Types and ranges of the episode columns that locate an episode (no nulls either)."""
    integers = [c for c in _EPISODE_COLUMNS if c != "tasks"]
    integers += [f"videos/{key}/{c}" for key in video_keys for c in ("chunk_index", "file_index")]
    times = [f"videos/{key}/{c}" for key in video_keys for c in ("from_timestamp", "to_timestamp")]
    optional = {
        "success": (pa.types.is_boolean, "booleans"),
        "seed": (pa.types.is_integer, "integers"),
        **dict.fromkeys(("suite", "task_name", "metadata"), (pa.types.is_string, "strings")),
    }
    for name in [*integers, *times, "tasks", *optional]:
        if name not in table.column_names:
            continue
        column, kind = table[name], table.schema.field(name).type
        if name in integers:
            ok, expected = pa.types.is_integer(kind), "integers"
        elif name in times:
            ok, expected = pa.types.is_floating(kind) or pa.types.is_integer(kind), "numbers"
        elif name == "tasks":
            ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
                pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
            )
            expected = "lists of strings"
        else:
            ok, expected = optional[name][0](kind), optional[name][1]
        if not ok:
            raise DatasetError(f"{relative}: column {name!r} must hold {expected}, not {kind}")
        if column.null_count:
            raise DatasetError(f"{relative}: column {name!r} has empty (null) entries")
        if name in integers or name in times:
            values = column.to_numpy()
            if len(values) and (values.min() < 0 or not np.isfinite(values).all()):
                raise DatasetError(f"{relative}: column {name!r} has a negative entry")
        if name == "tasks" and any(not tasks for tasks in column.to_pylist()):
            raise DatasetError(f"{relative}: an episode has no task in column 'tasks'")


def _read_episodes(root: Path, info: Mapping[str, Any], meta: _Metadata) -> None:
    """Read the committed episode rows into ``meta``; files beyond the commit point are skipped."""
    total = info["total_episodes"]
    video_keys = _video_keys(info["features"])
    rows: list[dict[str, Any]] = []
    files_of: dict[int, str] = {}  # episode index -> the episodes file holding its row
    for path in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet")):
        relative = path.relative_to(root).as_posix()
        parquet = _open_parquet(root, relative, INFO_PATH)
        columns = [c for c in parquet.schema_arrow.names if not c.startswith("stats/")]
        required = list(_EPISODE_COLUMNS)
        for key in video_keys:
            required += [f"videos/{key}/{c}" for c in _VIDEO_COLUMNS]
        missing = [c for c in required if c not in columns]
        if missing:
            raise DatasetError(f"{relative}: missing the episode column {missing[0]!r}")
        table = _read_table(root, relative, INFO_PATH, columns=columns)
        _check_episode_columns(relative, table, video_keys)
        indices = table["episode_index"].to_pylist()
        if indices and min(indices) >= total:
            meta.uncommitted_files.append(relative)
            meta.warnings.append(
                f"{relative}: holds only episodes {min(indices)}..{max(indices)}, beyond "
                f"total_episodes = {total} in {INFO_PATH}: episodes of an interrupted write, "
                "ignored (opening the dataset for writing deletes them)"
            )
            continue
        if indices and max(indices) >= total:
            raise DatasetError(
                f"{relative}: holds episodes up to {max(indices)} but {INFO_PATH} has "
                f"total_episodes = {total}"
            )
        for row in table.to_pylist():
            if row["episode_index"] in files_of:
                raise DatasetError(
                    f"{relative}: episode {row['episode_index']} is also in "
                    f"{files_of[row['episode_index']]} (an episode must appear once)"
                )
            files_of[row["episode_index"]] = relative
            rows.append(row)
        meta.episode_files.append(relative)
    rows.sort(key=lambda row: row["episode_index"])
    missing = sorted(set(range(total)) - set(files_of))
    if missing:
        raise DatasetError(
            f"meta/episodes: episode {missing[0]} is missing ({len(rows)} episode rows in "
            f"{len(meta.episode_files)} files for total_episodes = {total} in {INFO_PATH})"
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
    count = _stats_count(meta.stats)
    if count != info["total_frames"]:
        meta.warnings.append(
            f"{STATS_PATH}: computed over {count} frames but the dataset has "
            f"{info['total_frames']} (an interrupted write?)"
        )


def _stats_count(stats: Mapping[str, Any]) -> int | None:
    """How many frames stats.json was computed over (its ``index`` count), None if it does not
    say; an interrupted commit leaves it different from total_frames."""
    count = stats.get("index", {}).get("count") if isinstance(stats.get("index"), dict) else None
    if isinstance(count, list) and len(count) == 1:
        count = count[0]
    return count if _is_int(count) else None if stats else 0


def _load_metadata(root: Path) -> _Metadata:
    """Read and check everything except the frame data itself; DatasetError on the first problem."""
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory")
    info = _read_info(root)
    stats = _read_json(root, STATS_PATH)
    if not isinstance(stats, dict):
        raise DatasetError(f"{STATS_PATH}: expected a JSON object, got {_describe(stats)}")
    meta = _Metadata(info=info, stats=stats, tasks=_read_tasks(root), episodes=[], episode_files=[])
    _read_episodes(root, info, meta)
    _check_episodes(meta)
    _check_data_files(root, meta)
    _check_video_files(root, meta)
    _check_stats(meta)  # last: a wrong shape in info.json is blamed on info.json, not stats
    return meta
