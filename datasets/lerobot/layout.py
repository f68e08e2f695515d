"""Where things live in a LeRobot v3.0 dataset: format constants, file path patterns,
the files that hold an episode, and ``DatasetError`` for anything wrong on disk."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

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
LOCK_NAME = ".embodied.lock"  # the writers' lock file in a dataset's root (see ``lock``)
COMMIT_INTERVAL_S = 2.0  # a finished episode is committed within about this many seconds

DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


class DatasetError(ValueError):
    """A dataset on disk is missing a file, is corrupted, or is not LeRobot v3.0.

    The message starts with the file at fault (relative to the dataset root where it lies inside
    it) and fits on one line, so command-line tools print it as it is.
    """

    def __init__(self, message: object = "") -> None:
        """Keep the message on one line (errors of the libraries below may span several)."""
        super().__init__(" ".join(str(message).split()))


class DatasetBusyError(DatasetError):
    """Another process is writing the dataset (it holds the dataset's writer lock)."""


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


def _group_by_file(
    rows: Sequence[Mapping[str, Any]], video_key: str | None = None
) -> dict[str, list]:
    """Episode rows grouped by their data file (or video file of ``video_key``), in order."""
    groups: dict[str, list] = {}
    for row in rows:
        path = _data_path(row) if video_key is None else _video_path(row, video_key)
        groups.setdefault(path, []).append(row)
    return groups


def _video_keys(features: Mapping[str, Any]) -> list[str]:
    """Names of the video features."""
    return [name for name, feature in features.items() if feature["dtype"] == "video"]


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


def _new_info(
    robot_type: str, fps: int, data_file_size_mb: float, video_file_size_mb: float
) -> dict[str, Any]:
    """meta/info.json of a new, empty dataset (features come with the first episode)."""
    return {
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
