"""``validate_dataset``: the metadata checks plus the data files' index columns, and warnings
for files that interrupted writes left behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from embodied.datasets.lerobot.arrow import _from_arrow
from embodied.datasets.lerobot.files import _read_table
from embodied.datasets.lerobot.layout import (
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    DatasetError,
    _group_by_file,
    _video_keys,
)
from embodied.datasets.lerobot.metadata import _load_metadata, _Metadata


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
