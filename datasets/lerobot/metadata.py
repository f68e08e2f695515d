"""Loading a dataset's committed metadata (info, stats, tasks, episode rows) with every check
that needs no decoding; the reader, the writer's ``open`` and ``validate_dataset`` use it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.datasets.lerobot.arrow import _arrow_spec, _shape_fits
from embodied.datasets.lerobot.files import _open_parquet, _read_json, _read_table
from embodied.datasets.lerobot.layout import (
    CODEBASE_VERSION,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    DatasetError,
    _episodes_path,
    _group_by_file,
    _video_keys,
)
from embodied.datasets.lerobot.videos import _video_num_frames

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


def _read_info(root: Path) -> dict[str, Any]:
    """meta/info.json, checked for the version and the keys this package relies on."""
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
            # An image feature is a column of PNG structs (sizes known only once decoded).
            expected = "uint8" if feature["dtype"] == "image" else feature["dtype"]
            if dtype.name != expected or not _shape_fits(shape, feature["shape"]):
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
