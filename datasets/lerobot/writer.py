"""``LeRobotDatasetWriter``: commits finished episodes every few seconds as new files, then the
metadata with info.json last, so a crash loses at most the episodes of the last few seconds and
never an episode committed before; one writer at a time (a lock file in the dataset)."""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embodied.core.features import observation_feature
from embodied.core.trajectory import Trajectory
from embodied.datasets.lerobot.add_feature import _add_frame_feature, _extra_features
from embodied.datasets.lerobot.arrow import _to_arrow
from embodied.datasets.lerobot.files import (
    _write_json,
    _write_parquet,
)
from embodied.datasets.lerobot.frames import (
    LEGACY_ACTION_PAD,
    _check_columns_match,
    _check_value_names,
    _Column,
    _feature_spec,
    _index_columns,
)
from embodied.datasets.lerobot.layout import (
    COMMIT_INTERVAL_S,
    DATA_FILE_SIZE_MB,
    DATA_PATH,
    DEFAULT_FEATURES,
    EPISODES_PATH,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_FILE_SIZE_MB,
    VIDEO_PATH,
    _first_free_location,
    _new_info,
    _next_location,
    _tasks_table,
    _video_keys,
)
from embodied.datasets.lerobot.lock import DatasetLock, defer_interrupts
from embodied.datasets.lerobot.metadata import _load_metadata
from embodied.datasets.lerobot.prepared import EpisodeSettings, PreparedEpisode, prepare_episode
from embodied.datasets.lerobot.recovery import _claim_new, _reopen
from embodied.datasets.lerobot.stats import (
    _episode_stats,
    _stats_row,
    _StatsTotals,
)
from embodied.datasets.lerobot.videos import (
    CODEC,
    LOSSY_CRF,
    PIX_FMT,
    _video_info,
    _VideoEncoder,
)


@dataclass
class _PendingEpisode:
    """An episode added but not yet committed: its row, its data rows and its stats."""

    row: dict[str, Any]
    table: pa.Table
    stats: dict[str, dict[str, np.ndarray]]


class LeRobotDatasetWriter:
    """Writes Trajectories into a LeRobot v3.0 dataset, committing them as new files (crash-safe).

    ``add_episode`` encodes an episode's images and buffers its rows. The buffer is committed
    (one new data file, one new video file per camera, one new episodes file, then tasks, stats
    and info.json last, each atomically) when the oldest buffered episode would otherwise wait
    more than ``commit_interval_s`` seconds (judged from how fast episodes have been arriving, so
    slow episodes are committed one by one and fast ones a few seconds' worth at a time), when
    the buffered data reaches ``data_file_size_mb`` (in-memory arrow size, as LeRobot measures
    it) or a video ``video_file_size_mb`` (encoded bytes), on ``flush`` and on ``close``. Files
    committed earlier are never modified, so a process killed at any moment leaves a valid
    dataset with every episode committed before the kill; ``open`` deletes what the killed
    writer left half-done. ``commit_interval_s=0`` commits every episode as it is added.

    One writer at a time: the writer holds a lock on the dataset (``.embodied.lock``, an
    ``flock`` the kernel drops when the process dies) until ``close``; a second writer raises
    ``DatasetBusyError`` naming the process that holds it. Ctrl-C (SIGINT) is held back while an
    episode is buffered or committed, and raised once that is done, so the writer is never
    interrupted half-way and ``close`` (or the ``with`` block's end) commits every finished
    episode.

    Images are H.264 at ``crf`` with full colour resolution (``pix_fmt`` yuv444p) by default:
    at the 64-128 px a CPU renders, 4:2:0 chroma subsampling smears the colour of small objects,
    and colour is what the instructions name (PSNR ~28 dB with yuv420p vs ~36-39 with yuv444p).
    ``pix_fmt="yuv420p"`` makes files that browsers play;
    ``lossless=True`` stores them bit-exactly (H.264 RGB at qp 0; ``video_codec`` and ``crf``
    are then unused). Each episode row records the sha256 of its video files
    (``videos/<key>/sha256``), which the reader and ``validate_dataset`` check. If writing fails,
    the writer commits the episodes finished before (when it still can) and closes.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        fps: int = 16,
        robot_type: str = "embodied-gantry",
        video_codec: str = CODEC,
        crf: int = LOSSY_CRF,
        lossless: bool = False,
        pix_fmt: str = PIX_FMT,
        data_file_size_mb: float = DATA_FILE_SIZE_MB,
        video_file_size_mb: float = VIDEO_FILE_SIZE_MB,
        names: Mapping[str, Sequence[str]] | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
    ) -> None:
        """Create a new dataset at ``root`` (which must not exist, or be an empty directory, or
        hold only what a writer killed before its first commit left there: that is deleted).

        ``names`` labels the values of state observations, keyed by observation key (an env's
        ``feature_names``, e.g. ``{"environment_state": ["block_red.x", ...]}``): info.json
        records them as the features' ``names``, as LeRobot does for motors.
        """
        root = Path(root)
        if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
            raise ValueError(f"fps must be a positive int (LeRobot stores it as one), got {fps!r}")
        video_info = _video_info(fps, video_codec, crf, lossless, pix_fmt)
        if root.exists() and not root.is_dir():
            raise FileExistsError(f"{root} exists and is not a directory")
        lock = _claim_new(root)
        info = _new_info(robot_type, fps, data_file_size_mb, video_file_size_mb)
        self._start(root, info, video_info, lock, commit_interval_s)
        self._needs_commit = True  # an empty dataset is still written on close
        self._names = {
            observation_feature(tuple(key.split("/"))): [str(n) for n in values]
            for key, values in (names or {}).items()
        }

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        data_file_size_mb: float | None = None,
        video_file_size_mb: float | None = None,
        *,
        fps: int | None = None,
        lossless: bool | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        drop_added_features: bool = False,
    ) -> LeRobotDatasetWriter:
        """Append to an existing dataset; videos are encoded as the dataset's existing ones.
        ``drop_added_features`` first removes what ``add_frame_feature`` added (with a warning).

        ``fps`` and ``lossless``, when given, must match the dataset's (ValueError naming the
        setting and both values otherwise). What an interrupted writer left is deleted first:
        temporary files, episodes files beyond ``total_episodes``, and data and video files after
        the last one the committed episodes use; new files never reuse the name of a file on
        disk. Size limits default to the ones recorded in info.json.
        """
        root = Path(root)
        found = _reopen(
            root, fps, lossless, data_file_size_mb, video_file_size_mb, drop_added_features
        )
        writer = cls.__new__(cls)
        writer._start(root, found.info, found.video_info, found.lock, commit_interval_s)
        writer._tasks = {task: index for index, task in enumerate(found.tasks)}
        writer._episodes = found.episodes
        writer._stats_totals = found.stats_totals
        writer._needs_commit = found.needs_commit
        writer._frame_spec = found.frame_spec
        return writer

    def _start(
        self,
        root: Path,
        info: dict[str, Any],
        video_info: dict[str, Any],
        lock: DatasetLock,
        commit_interval_s: float,
    ) -> None:
        """Set up the writer's state (shared by ``__init__`` and ``open``)."""
        if not commit_interval_s >= 0:
            lock.release()
            raise ValueError(f"commit_interval_s must be >= 0, got {commit_interval_s!r}")
        self.root = root
        self._lock = lock
        self._info = info
        self._video_info = video_info
        self._commit_interval = float(commit_interval_s)
        self._tasks: dict[str, int] = {}
        self._episodes: list[dict[str, Any]] = []  # committed rows
        self._stats_totals = _StatsTotals()  # of the committed episodes
        self._frame_spec: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
        self._pending: list[_PendingEpisode] = []
        self._pending_bytes = 0
        self._pending_since: float | None = None  # when the oldest buffered episode came
        self._last_add: float | None = None
        self._gaps: collections.deque[float] = collections.deque(maxlen=4)  # between episodes
        self._needs_commit = False
        self._num_frames = info["total_frames"]  # committed and buffered
        self._encoders: dict[str, _VideoEncoder] = {}
        self._closed = False
        self._next_data = _first_free_location(root / "data", ".parquet")
        self._next_episodes = _first_free_location(root / "meta/episodes", ".parquet")
        self._next_video: dict[str, tuple[int, int]] = {}  # per camera, after a commit
        self._names: dict[str, list[str]] = {}  # feature -> value names, for a new dataset

    @property
    def num_episodes(self) -> int:
        """Episodes added so far, committed or buffered."""
        return len(self._episodes) + len(self._pending)

    @property
    def num_committed(self) -> int:
        """Episodes committed (on disk, in info.json) so far."""
        return len(self._episodes)

    @property
    def fps(self) -> int:
        """Frames per second of the dataset."""
        return int(self._info["fps"])

    @property
    def features(self) -> dict[str, Any]:
        """The feature specs (info.json's ``features``; empty for a new dataset until the first
        episode)."""
        return self._info["features"]

    def __enter__(self) -> LeRobotDatasetWriter:
        """Use as a context manager; ``close`` commits what was added."""
        return self

    def __exit__(self, exc_type: type | None, *exc_info: object) -> None:
        """Commit the buffered (complete) episodes even when the block raised (a block that
        raised before adding any episode leaves the directory as it found it)."""
        if exc_type is not None and not self._pending:
            self._needs_commit = False
        self.close()

    @property
    def settings(self) -> EpisodeSettings:
        """What ``prepare_episode`` needs to make episodes ready for this writer elsewhere."""
        legacy_pad = LEGACY_ACTION_PAD in self._info["features"]  # a dataset written before
        return EpisodeSettings(self.fps, self._video_info, legacy_pad)

    def add_episode(self, episode: Trajectory | PreparedEpisode) -> int:
        """Validate and buffer one trajectory, or one ``prepare_episode`` made ready with this
        writer's ``settings`` (committing when due); return its episode index.

        Raises ValueError when its keys, dtypes or shapes differ from the dataset's; the writer
        stays usable then.
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
                "writing (add_frame_feature) and trajectories do not carry them "
                "(LeRobotDatasetWriter.open(..., drop_added_features=True) drops them)"
            )
        prepared = episode
        if not isinstance(episode, PreparedEpisode):
            prepared = prepare_episode(episode, self.settings)
        if prepared.settings != self.settings:
            raise ValueError(f"the episode was prepared for another frame rate or video "
                             f"encoding than {self.root}'s (writer.settings)")  # fmt: skip
        self._check_columns(prepared.columns)
        with defer_interrupts():
            try:
                self._buffer(prepared)
            except BaseException:
                self._salvage()
                raise
            index = self.num_episodes - 1
            now = time.monotonic()
            if self._last_add is not None:
                self._gaps.append(now - self._last_add)
            self._last_add = now
            if self._commit_due(now):
                self._commit_or_fail()
        return index

    def flush(self) -> None:
        """Commit the buffered episodes now (nothing to do when none are buffered)."""
        if self._closed or not self._pending:
            return
        self._commit_or_fail()

    def close(self) -> None:
        """Commit the buffered episodes, release the dataset; safe to call twice."""
        if self._closed:
            return
        with defer_interrupts():
            self._commit_or_fail()
            self._closed = True
            self._lock.release()

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
        lock = self._lock
        if self._closed:  # add the feature all the same, under a lock of its own
            lock = DatasetLock(self.root, "add_frame_feature")
            lock.acquire()
        try:
            if not self._closed:
                self._commit_or_fail()
            self._closed = True
            _add_frame_feature(
                self.root, _load_metadata(self.root), name, values_per_episode, info, overwrite
            )
        finally:
            lock.release()

    def _commit_or_fail(self) -> None:
        """Commit the buffered episodes (and metadata an interrupted commit left stale), Ctrl-C
        held back; on an error drop the buffer, close, and raise."""
        with defer_interrupts():
            try:
                if self._pending or self._needs_commit:
                    self._commit()
            except BaseException:
                self._fail()
                raise

    def _commit_due(self, now: float) -> bool:
        """Whether to commit now: a size limit is reached, or waiting for the next episode (as
        long as the longest of the last few gaps between episodes) would keep the oldest buffered
        one waiting longer than the commit interval."""
        if self._pending_bytes >= self._info["data_files_size_in_mb"] * 1024**2 or any(
            encoder.encoded_bytes >= self._info["video_files_size_in_mb"] * 1024**2
            for encoder in self._encoders.values()
        ):
            return True
        if self._pending_since is None:
            return False
        next_episode = max(self._gaps) if self._gaps else float("inf")
        return now - self._pending_since + next_episode >= self._commit_interval

    def _check_columns(self, columns: Sequence[_Column]) -> None:
        """Raise ValueError naming the key if an episode does not match the dataset's columns."""
        spec = {c.name: (c.values.dtype, c.values.shape[1:]) for c in columns}
        if self._frame_spec is None:
            _check_value_names(self._names, spec)
            self._frame_spec = spec
            features = self._info["features"]
            for column in columns:
                features[column.name] = _feature_spec(
                    column, self._video_info if column.video else None
                )
                if column.name in self._names:
                    features[column.name]["names"] = self._names[column.name]
            features.update(json.loads(json.dumps(DEFAULT_FEATURES)))
            return
        _check_columns_match(self._frame_spec, self._info["features"], columns)

    def _buffer(self, prepared: PreparedEpisode) -> None:
        """Add the episode's images to the open videos; keep its data rows, row and stats for
        the commit.

        The writer's state changes only at the end, once nothing can fail any more (the
        episode's frames are in the open video files by then: a failure leaves them after the
        buffered episodes' frames, where no episode row points).
        """
        traj, fps = prepared.traj, self._info["fps"]
        episode_index, first_index = self.num_episodes, self._num_frames
        num_frames = traj.length + 1
        task_index = self._tasks.get(traj.instruction, len(self._tasks))
        values = _index_columns(num_frames, fps, episode_index, first_index, task_index)
        values.update({column.name: column.values for column in prepared.columns})
        features = self._info["features"]

        row: dict[str, Any] = {
            "episode_index": episode_index,
            "tasks": [traj.instruction],
            "length": num_frames,
            "dataset_from_index": first_index,
            "dataset_to_index": first_index + num_frames,
        }
        video_names = _video_keys(features)
        data_names = [name for name in features if name not in video_names]
        table = pa.table({name: _to_arrow(values[name]) for name in data_names})
        stats = {name: prepared.stats.get(name) for name in features}  # in the features' order
        for name in DEFAULT_FEATURES:  # the index columns, known only now
            stats[name] = _episode_stats(values[name], False)
        for name in _video_keys(features):
            if name not in self._encoders:
                self._encoders[name] = self._open_encoder(name, values[name].shape[1:])
            encoder = self._encoders[name]
            first_frame = encoder.add(values[name], prepared.videos.get(name))
            row[f"videos/{name}/chunk_index"], row[f"videos/{name}/file_index"] = encoder.location
            row[f"videos/{name}/from_timestamp"] = first_frame / fps
            row[f"videos/{name}/to_timestamp"] = (first_frame + num_frames) / fps
        row.update(
            success=bool(traj.success),
            seed=-1 if traj.seed is None else int(traj.seed),
            suite=traj.suite,
            task_name=traj.task,
            metadata=prepared.metadata_json,
        )
        self._tasks.setdefault(traj.instruction, task_index)
        self._pending.append(_PendingEpisode(row=row, table=table, stats=stats))
        self._pending_bytes += table.nbytes
        self._num_frames += num_frames
        if self._pending_since is None:
            self._pending_since = time.monotonic()

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
            digests = {name: encoder.finish() for name, encoder in self._encoders.items()}
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
                for name, digest in digests.items():
                    episode.row[f"videos/{name}/sha256"] = digest
                rows.append({**episode.row, **_stats_row(episode.stats)})
            _write_parquet(
                self.root
                / EPISODES_PATH.format(
                    chunk_index=episodes_location[0], file_index=episodes_location[1]
                ),
                pa.Table.from_pylist(rows),
                compact=True,
            )
            self._next_data = _next_location(data_location)
            self._next_episodes = _next_location(episodes_location)
            for name, encoder in self._encoders.items():
                self._next_video[name] = _next_location(encoder.location)
            self._encoders = {}

        num_episodes = self.num_episodes
        stats_totals = self._stats_totals.copy()
        for episode in self._pending:
            stats_totals.add(episode.stats)
        _write_parquet(self.root / TASKS_PATH, _tasks_table(list(self._tasks)))
        _write_json(self.root / STATS_PATH, stats_totals.json())
        info = {
            **self._info,
            "total_episodes": num_episodes,
            "total_frames": self._num_frames,
            "total_tasks": len(self._tasks),
            "splits": {"train": f"0:{num_episodes}"},
        }
        _write_json(self.root / INFO_PATH, info)  # the commit point
        self._info = info
        self._episodes.extend(episode.row for episode in self._pending)
        self._stats_totals = stats_totals
        self._pending = []
        self._pending_bytes = 0
        self._pending_since = None
        self._needs_commit = False

    def _salvage(self) -> None:
        """After buffering an episode failed: commit the episodes buffered before it (their
        video files end with some of its frames, which no row points to), then close."""
        try:
            if self._pending:
                self._commit()
        except BaseException:
            pass  # the error being raised says what went wrong
        self._fail()

    def _fail(self) -> None:
        """Drop the buffer and temporary videos after an error; the dataset stays as committed."""
        for encoder in self._encoders.values():
            encoder.abort()
        self._encoders = {}
        self._pending = []
        self._pending_since = None
        self._closed = True
        self._lock.release()
