"""Checks of a dataset's data and video files against its metadata: row counts, columns and
their types, frame sizes, frame rates, lengths and the LeRobot index columns."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embodied.datasets.lerobot.arrow import UNKNOWN, _arrow_spec, _shape_fits
from embodied.datasets.lerobot.files import _open_parquet
from embodied.datasets.lerobot.layout import (
    INFO_PATH,
    TASKS_PATH,
    DatasetError,
    _episodes_path,
    _group_by_file,
    _video_keys,
)
from embodied.datasets.lerobot.videos import _video_header

if TYPE_CHECKING:
    from embodied.datasets.lerobot.metadata import _Metadata

_INDEX_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")


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
            try:
                dtype, shape = _arrow_spec(schema.field(name).type)
            except (NotImplementedError, TypeError, ValueError, pa.ArrowException):
                raise DatasetError(
                    f"{relative}: column {name!r} holds {schema.field(name).type}, which is not "
                    f"the {feature['dtype']} {list(feature['shape'])} that {INFO_PATH} says"
                ) from None
            # An image feature is a column of PNG structs (sizes known only once decoded).
            expected = "uint8" if feature["dtype"] == "image" else feature["dtype"]
            if dtype.name != expected or not _shape_fits(shape, feature["shape"]):
                stored = schema.field(name).type
                held = stored if UNKNOWN in shape else f"{dtype.name} {list(shape) or [1]}"
                raise DatasetError(
                    f"{relative}: column {name!r} holds {held} but "
                    f"{INFO_PATH} says {feature['dtype']} {list(feature['shape'])}"
                )
        for name in schema.names:
            if name not in features:
                meta.warnings.append(
                    f"{relative}: column {name!r} is not a feature in {INFO_PATH}; ignored"
                )


def _check_video_files(root: Path, meta: _Metadata) -> None:
    """Every referenced video opens, has the frame size, rate and length the metadata says."""
    fps = meta.info["fps"]
    for key in _video_keys(meta.info["features"]):
        shape = meta.info["features"][key]["shape"]
        for relative, rows in _group_by_file(meta.episodes, key).items():
            if not (root / relative).is_file():
                raise DatasetError(
                    f"{relative}: missing (referenced by episode {rows[0]['episode_index']})"
                )
            header = _video_header(root / relative, relative)
            _check_frame_size(relative, (header.height, header.width), key, shape)
            if header.fps is not None and abs(header.fps - fps) > 1e-3 * fps:
                raise DatasetError(
                    f"{relative}: plays at {header.fps:g} fps but {INFO_PATH} says fps = {fps}"
                )
            for row in rows:
                start = row[f"videos/{key}/from_timestamp"]
                stop = row[f"videos/{key}/to_timestamp"]
                if abs((stop - start) * fps - row["length"]) > 1e-3:
                    raise DatasetError(
                        f"{_episodes_path(row)}: episode {row['episode_index']} spans "
                        f"{stop - start:.4f} s of {relative} but has {row['length']} frames"
                    )
                if stop * fps > header.num_frames + 1e-3:
                    raise DatasetError(
                        f"{relative}: episode {row['episode_index']} ends at {stop:.4f} s but the "
                        f"video holds {header.num_frames} frames ({header.num_frames / fps:.4f} s)"
                    )


def _check_frame_size(relative: str, size: tuple[int, int], key: str, shape: list[int]) -> None:
    """A video's frames (height, width) fit the feature's shape (odd sizes padded by one)."""
    height, width = shape[:2]
    if size not in ((height, width), (height + height % 2, width + width % 2)):
        raise DatasetError(
            f"{relative}: frames are {size[0]}x{size[1]} (height x width) but {INFO_PATH} says "
            f"{key!r} has shape {list(shape)}"
        )


def _check_index_columns(
    relative: str, table: pa.Table, rows: list[dict[str, Any]], meta: _Metadata
) -> None:
    """A data file's LeRobot columns (``_INDEX_COLUMNS``) agree with the episodes placed in it
    (``rows``, in order): global and per-episode indices, timestamps, tasks."""
    fps = meta.info["fps"]
    values = {name: table[name].to_numpy() for name in _INDEX_COLUMNS}
    frame_index = np.concatenate([np.arange(r["length"]) for r in rows])
    expected = {
        "index": np.concatenate(
            [np.arange(r["dataset_from_index"], r["dataset_to_index"]) for r in rows]
        ),
        "episode_index": np.concatenate([np.full(r["length"], r["episode_index"]) for r in rows]),
        "frame_index": frame_index,
    }
    for name, want in expected.items():
        if not np.array_equal(values[name], want):
            raise DatasetError(f"{relative}: column {name!r} disagrees with the episodes metadata")
    if np.abs(values["timestamp"] - frame_index / fps).max(initial=0) > 1e-3:
        raise DatasetError(
            f"{relative}: column 'timestamp' is not frame_index / fps (fps = {fps} in {INFO_PATH})"
        )
    task_of = {task: index for index, task in enumerate(meta.tasks)}
    start = 0
    for row in rows:
        allowed = [task_of[task] for task in row["tasks"]]
        if not np.isin(values["task_index"][start : start + row["length"]], allowed).all():
            raise DatasetError(
                f"{relative}: episode {row['episode_index']} has frames whose task_index is not "
                f"one of its tasks ({allowed} in {TASKS_PATH})"
            )
        start += row["length"]
