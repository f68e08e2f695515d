"""``LeRobotDatasetWriter``: buffers Trajectories and writes each batch as new files, then the
metadata with info.json last, so a crash never loses committed episodes."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embodied.core.features import observation_feature
from embodied.core.trajectory import Trajectory
from embodied.datasets.lerobot.add_feature import _add_frame_feature, _extra_features
from embodied.datasets.lerobot.arrow import _arrow_spec, _to_arrow
from embodied.datasets.lerobot.files import _read_table, _write_json, _write_parquet
from embodied.datasets.lerobot.frames import (
    LEGACY_ACTION_PAD,
    _check_episode_scalars,
    _Column,
    _feature_spec,
    _trajectory_columns,
)
from embodied.datasets.lerobot.layout import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_SIZE_MB,
    DATA_PATH,
    DEFAULT_FEATURES,
    EPISODES_PATH,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_FILE_SIZE_MB,
    VIDEO_PATH,
    _data_path,
    _first_free_location,
    _next_location,
    _video_keys,
)
from embodied.datasets.lerobot.metadata import _load_metadata, _Metadata
from embodied.datasets.lerobot.stats import (
    _episode_stats,
    _stats_from_row,
    _stats_json,
    _stats_row,
)
from embodied.datasets.lerobot.videos import LOSSY_CRF, _video_info, _VideoEncoder


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
        names: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Create a new dataset at ``root`` (which must not exist, or be an empty directory).

        ``names`` labels the values of state observations, keyed by observation key (an env's
        ``feature_names``, e.g. ``{"environment_state": ["block_red.x", ...]}``): info.json
        records them as the features' ``names``, as LeRobot does for motors.
        """
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
                else _arrow_spec(schema.field(name).type, feature["shape"])
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
        self._names: dict[str, list[str]] = {}  # feature -> value names, for a new dataset

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
        legacy_pad = LEGACY_ACTION_PAD in self._info["features"]  # a dataset written before
        columns = _trajectory_columns(traj, legacy_pad)  # validates the trajectory
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
            unknown = sorted(set(self._names) - set(spec))
            if unknown:
                raise ValueError(f"names given for {unknown}, which the episode does not have")
            for name, labels in self._names.items():
                if [len(labels)] != list(spec[name][1][-1:]):
                    raise ValueError(
                        f"{len(labels)} names given for {name!r}, whose values have shape "
                        f"{list(spec[name][1])}"
                    )
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

        video_names = _video_keys(features)
        data_names = [name for name in features if name not in video_names]
        table = pa.table({name: _to_arrow(values[name]) for name in data_names})
        stats = {name: _episode_stats(values[name], name in video_names) for name in features}
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
