"""``validate_dataset``: the metadata checks, then everything a training run reads (every data
column and, unless ``quick``, every video frame), and warnings for what interrupted writes left."""

from __future__ import annotations

import os
from pathlib import Path

from embodied.datasets.lerobot.arrow import _from_arrow
from embodied.datasets.lerobot.file_checks import (
    _INDEX_COLUMNS,
    _check_frame_size,
    _check_index_columns,
)
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
from embodied.datasets.lerobot.videos import _decode_all, _file_sha256


def _check_data_columns(root: Path, meta: _Metadata, quick: bool) -> None:
    """The index columns of every data file match the episodes metadata; unless ``quick``, every
    feature column is read (and its parquet pages' checksums verified) as training reads it."""
    features = [k for k, v in meta.info["features"].items() if v["dtype"] != "video"]
    for relative, rows in _group_by_file(meta.episodes).items():
        columns = list(_INDEX_COLUMNS) if quick else features
        table = _read_table(root, relative, f"episode {rows[0]['episode_index']}", columns=columns)
        for name in table.column_names:
            _from_arrow(table[name])
        _check_index_columns(relative, table, rows, meta)


def _check_videos_decode(root: Path, meta: _Metadata) -> None:
    """Every referenced video matches its recorded sha256 and decodes, every frame, to the size
    info.json gives, with as many frames as its episodes need."""
    fps = meta.info["fps"]
    for key in _video_keys(meta.info["features"]):
        shape = meta.info["features"][key]["shape"]
        for relative, rows in _group_by_file(meta.episodes, key).items():
            digests = {row.get(f"videos/{key}/sha256") for row in rows} - {None}
            if digests:
                try:
                    digest = _file_sha256(root / relative)
                except OSError as error:
                    raise DatasetError(f"{relative}: unreadable ({error})") from error
                if digest not in digests:
                    raise DatasetError(
                        f"{relative}: corrupt video: its sha256 is {digest[:12]}... but the "
                        f"episodes metadata recorded {sorted(digests)[0][:12]}... when it was "
                        "written"
                    )
            count, size = _decode_all(root / relative, relative, fps)
            _check_frame_size(relative, size, key, shape)
            needed = max(round(row[f"videos/{key}/to_timestamp"] * fps) for row in rows)
            if count < needed:
                raise DatasetError(
                    f"{relative}: decodes to {count} frames but its episodes need {needed}"
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
            if not path.is_file() or relative in referenced:
                continue
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                what = "a temporary file of an interrupted write"
            else:
                what = "not referenced by the metadata (interrupted write?)"
            warnings.append(f"{relative}: {what}")
    return warnings


def validate_dataset(root: str | os.PathLike[str], quick: bool = False) -> list[str]:
    """Check a dataset on disk; raise DatasetError naming the file at fault, return warnings.

    Reads every data column and decodes every video frame (checking frame sizes against
    info.json and recorded checksums), as training would; ``quick=True`` reads only the index
    columns and the videos' headers. Warnings name what interrupted writes left behind
    (opening the dataset with ``LeRobotDatasetWriter.open`` deletes it).
    """
    root = Path(root)
    meta = _load_metadata(root)
    _check_data_columns(root, meta, quick)
    if not quick:
        _check_videos_decode(root, meta)
    return meta.warnings + _unreferenced_files(root, meta)
