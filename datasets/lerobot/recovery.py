"""Picking up a dataset where a writer left it: the settings an append must match, what a
killed writer left half-done (deleted), and the committed state an appending writer continues
from (tasks, episode rows, running statistics, column types)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.datasets.lerobot.add_feature import _extra_features
from embodied.datasets.lerobot.arrow import _arrow_spec
from embodied.datasets.lerobot.drop_feature import _drop_added_features, _finish_drops
from embodied.datasets.lerobot.files import _open_parquet, _read_table
from embodied.datasets.lerobot.layout import (
    DATA_FILE_SIZE_MB,
    DEFAULT_FEATURES,
    INFO_PATH,
    LOCK_NAME,
    VIDEO_FILE_SIZE_MB,
    DatasetError,
    _data_path,
    _video_keys,
    _video_path,
)
from embodied.datasets.lerobot.lock import DatasetLock
from embodied.datasets.lerobot.metadata import _load_metadata, _Metadata, _stats_count
from embodied.datasets.lerobot.stats import _stats_from_row, _StatsTotals
from embodied.datasets.lerobot.videos import CODEC, LOSSY_CRF, PIX_FMT, _video_info


@dataclass
class _Reopened:
    """What ``LeRobotDatasetWriter.open`` starts from: the committed state, under the lock."""

    info: dict[str, Any]
    video_info: dict[str, Any]
    lock: DatasetLock
    tasks: list[str]  # the committed ones, by index
    episodes: list[dict[str, Any]]
    stats_totals: _StatsTotals
    needs_commit: bool  # metadata an interrupted commit left half-updated
    frame_spec: dict[str, tuple[np.dtype, tuple[int, ...]]] | None


def _claim_new(root: Path) -> DatasetLock:
    """Create ``root`` and lock it for a new dataset, deleting what a writer killed before its
    first commit left there (FileExistsError if it holds a dataset or anything else)."""
    root.mkdir(parents=True, exist_ok=True)
    lock = DatasetLock(root, "LeRobotDatasetWriter (new dataset)")
    lock.acquire()
    try:
        for path in _leftovers_of_a_new_dataset(root):
            path.unlink()
    except BaseException:
        lock.release()
        raise
    return lock


def _reopen(
    root: Path,
    fps: int | None,
    lossless: bool | None,
    data_file_size_mb: float | None,
    video_file_size_mb: float | None,
    drop_added_features: bool = False,
) -> _Reopened:
    """Lock ``root``, check this run's settings against it, delete what an interrupted writer
    left (finishing an interrupted feature drop), drop the features ``add_frame_feature`` added
    when asked, and read the committed state an appending writer continues from."""
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory (no dataset to append to)")
    lock = DatasetLock(root, "LeRobotDatasetWriter.open (appending)")
    lock.acquire()
    try:
        meta = _load_metadata(root)
        _check_settings(root, meta.info, fps, lossless)
        meta = _finish_drops(root, meta)
        added = _extra_features(meta.info["features"])
        if added and drop_added_features:
            meta = _drop_added_features(root, meta, added)
            warnings.warn(
                f"{root}: dropped {added}, added after writing (add_frame_feature), to append "
                "episodes that do not carry them; add them again afterwards (progress labels: "
                "embodied label)",
                stacklevel=3,
            )
        features = meta.info["features"]
        stats_totals = _read_episode_stats(root, meta)
        last_schema = None
        if meta.episodes:
            last_data_file = _data_path(meta.episodes[-1])
            last_schema = _open_parquet(root, last_data_file, INFO_PATH).schema_arrow
        _delete_leftovers(root, meta)
    except BaseException:
        lock.release()
        raise
    info = dict(meta.info)
    info.setdefault("data_files_size_in_mb", DATA_FILE_SIZE_MB)
    info.setdefault("video_files_size_in_mb", VIDEO_FILE_SIZE_MB)
    if data_file_size_mb is not None:
        info["data_files_size_in_mb"] = data_file_size_mb
    if video_file_size_mb is not None:
        info["video_files_size_in_mb"] = video_file_size_mb
    video_keys = _video_keys(features)
    if video_keys:  # encode like the existing videos (LeRobot's info may leave settings out)
        video_info = _video_info(info["fps"], CODEC, LOSSY_CRF, False, "yuv420p")
        video_info.update(features[video_keys[0]].get("info", {}))
    else:  # no video yet (a run stopped before its first episode): as a new dataset's, this run's
        video_info = _video_info(info["fps"], CODEC, LOSSY_CRF, bool(lossless), PIX_FMT)
    # Tasks beyond total_tasks were added by an interrupted commit: no episode uses them.
    committed_tasks = meta.tasks[: info["total_tasks"]]
    frame_spec = None
    if last_schema is not None:
        frame_spec = {
            name: (np.dtype(np.uint8), tuple(feature["shape"]))
            if feature["dtype"] == "video"
            else _arrow_spec(last_schema.field(name).type, feature["shape"])
            for name, feature in features.items()
            if name not in DEFAULT_FEATURES
        }
    needs_commit = (
        len(meta.tasks) != len(committed_tasks) or _stats_count(meta.stats) != info["total_frames"]
    )
    return _Reopened(
        info, video_info, lock, committed_tasks, meta.episodes, stats_totals, needs_commit,
        frame_spec,
    )  # fmt: skip


def _check_settings(
    root: Path, info: Mapping[str, Any], fps: int | None, lossless: bool | None
) -> None:
    """Refuse to append with another frame rate or video encoding than the dataset's."""
    if fps is not None and fps != info["fps"]:
        raise ValueError(
            f"fps: the dataset at {root} is recorded at {info['fps']} fps but this run asks for "
            f"{fps} (one dataset has one frame rate)"
        )
    video_keys = _video_keys(info["features"])
    if lossless is not None and video_keys:
        video_info = info["features"][video_keys[0]].get("info", {})
        theirs = bool(video_info.get("video.lossless", False))
        if theirs != bool(lossless):
            raise ValueError(
                f"lossless: the dataset at {root} stores {'lossless' if theirs else 'lossy'} "
                f"videos (lossless={str(theirs).lower()}) but this run asks for "
                f"lossless={str(bool(lossless)).lower()}"
            )


# What a writer leaves in a dataset directory before its first commit (info.json is written last).
_LEFTOVER_PATTERNS = (
    r"(meta|data|videos)/(.*/)?\.[^/]*\.tmp",
    r"data/chunk-\d+/file-\d+\.parquet",
    r"meta/episodes/chunk-\d+/file-\d+\.parquet",
    r"meta/(tasks\.parquet|stats\.json)",
    r"videos/[^/]+/chunk-\d+/file-\d+\.mp4",
)


def _leftovers_of_a_new_dataset(root: Path) -> list[Path]:
    """Files a writer killed before its first commit left in ``root`` (to delete); raise
    FileExistsError if ``root`` holds a dataset or anything else."""
    if (root / INFO_PATH).exists():
        raise FileExistsError(
            f"{root} holds a dataset already; use LeRobotDatasetWriter.open(root) to append to it"
        )
    leftovers = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_dir() or relative == LOCK_NAME:
            continue
        if not any(re.fullmatch(pattern, relative) for pattern in _LEFTOVER_PATTERNS):
            raise FileExistsError(
                f"{root} exists and is not an empty directory ({relative} is not part of a "
                "dataset); use LeRobotDatasetWriter.open(root) to append to a dataset"
            )
        leftovers.append(path)
    return leftovers


def _delete_leftovers(root: Path, meta: _Metadata) -> None:
    """Delete what an interrupted writer left: temporary files, uncommitted episodes files, and
    data and video files after the last one that committed episodes use (nothing else)."""
    doomed = [root / relative for relative in meta.uncommitted_files]
    for directory in ("meta", "data", "videos"):
        doomed += [p for p in (root / directory).rglob(".*.tmp") if p.is_file()]
    used = {_location_of(root / _data_path(row)) for row in meta.episodes}
    doomed += _files_after(root / "data", ".parquet", max(used, default=None))
    for key in _video_keys(meta.info["features"]):
        used = {_location_of(root / _video_path(row, key)) for row in meta.episodes}
        doomed += _files_after(root / "videos" / key, ".mp4", max(used, default=None))
    for path in doomed:
        path.unlink(missing_ok=True)


def _location_of(path: Path) -> tuple[int, int]:
    """(chunk, file) of ``.../chunk-XXX/file-YYY.ext``."""
    return int(path.parent.name.split("-")[1]), int(path.stem.split("-")[1])


def _files_after(directory: Path, suffix: str, last: tuple[int, int] | None) -> list[Path]:
    """The ``chunk-XXX/file-YYY<suffix>`` files under ``directory`` after location ``last``."""
    found = []
    for path in directory.glob(f"chunk-*/file-*{suffix}"):
        numbered = re.fullmatch(r"chunk-\d+", path.parent.name) and re.fullmatch(
            r"file-\d+" + re.escape(suffix), path.name
        )
        if numbered and (last is None or _location_of(path) > last):
            found.append(path)
    return found


def _read_episode_stats(
    root: Path, meta: _Metadata, episodes: Sequence[int] | None = None
) -> _StatsTotals:
    """Totals of the per-episode stats (``stats/...`` columns) of the committed episodes, or of
    ``episodes`` only."""
    features = meta.info["features"]
    wanted = None if episodes is None else set(episodes)
    stats: dict[int, dict[str, dict[str, np.ndarray]]] = {}
    for relative in meta.episode_files:
        for row in _read_table(root, relative, INFO_PATH).to_pylist():
            if wanted is not None and row["episode_index"] not in wanted:
                continue
            try:
                stats[row["episode_index"]] = _stats_from_row(row, features)
            except (KeyError, TypeError, ValueError) as error:
                raise DatasetError(
                    f"{relative}: the per-episode statistics of episode {row['episode_index']} "
                    f"are missing or malformed ({type(error).__name__}: {error}); appending "
                    "and the statistics of some episodes need them"
                ) from None
    totals = _StatsTotals()
    for index in range(len(meta.episodes)) if episodes is None else episodes:
        totals.add(stats[index])
    return totals
