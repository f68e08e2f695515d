"""Adding a per-frame feature (e.g. ``progress.label``) to every episode of a written dataset:
rewrites data and episodes files, then stats.json, then info.json (the commit point)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embodied.datasets.lerobot.arrow import _from_arrow, _to_arrow
from embodied.datasets.lerobot.files import _read_table, _write_json, _write_parquet
from embodied.datasets.lerobot.frames import DERIVED_FEATURES
from embodied.datasets.lerobot.layout import (
    DEFAULT_FEATURES,
    INFO_PATH,
    STATS_PATH,
    DatasetError,
    _group_by_file,
)
from embodied.datasets.lerobot.metadata import _Metadata
from embodied.datasets.lerobot.stats import _episode_stats, _stats_json, _stats_row


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

    stats = [_episode_stats(array, video=False) for array in values]
    for relative in meta.episode_files:
        table = _read_table(root, relative, INFO_PATH)
        table = table.drop_columns(
            [c for c in table.column_names if c.startswith(f"stats/{name}/")]
        )
        rows = [_stats_row({name: stats[e]}) for e in table["episode_index"].to_pylist()]
        for column in rows[0]:
            table = table.append_column(column, pa.array([row[column] for row in rows]))
        _write_parquet(root / relative, table, compact=True)

    all_stats = {**meta.stats, **_stats_json([{name: s} for s in stats])}
    _write_json(root / STATS_PATH, all_stats)
    new_info = json.loads(json.dumps(meta.info))
    spec = {"dtype": values[0].dtype.name, "shape": list(values[0].shape[1:]) or [1]}
    new_info["features"][name] = {**spec, "names": None, **({"info": info} if info else {})}
    _write_json(root / INFO_PATH, new_info)
