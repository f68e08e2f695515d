"""Dropping features that ``add_frame_feature`` added (derived data such as ``progress.label``)
so that episodes, which do not carry them, can be appended; and finishing a drop or an add that
was interrupted.

info.json is the commit point: it loses the features first, then stats.json, the data files'
columns and, last, the episodes files' ``stats/<feature>/*`` columns. Until that last step the
episodes files still name every feature left half-removed, which is how ``_finish_drops`` finds
them when the dataset is next opened for appending.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from embodied.datasets.lerobot.files import _open_parquet, _read_table, _write_json, _write_parquet
from embodied.datasets.lerobot.layout import INFO_PATH, STATS_PATH, _group_by_file
from embodied.datasets.lerobot.metadata import _load_metadata, _Metadata


def _drop_added_features(root: Path, meta: _Metadata, names: Sequence[str]) -> _Metadata:
    """Remove the added features ``names`` from the dataset at ``root`` (metadata ``meta``);
    return the metadata read back."""
    info = json.loads(json.dumps(meta.info))
    for name in names:
        del info["features"][name]
    _write_json(root / INFO_PATH, info)
    return _finish_drops(root, dataclasses.replace(meta, info=info))  # only info.json changed


def _finish_drops(root: Path, meta: _Metadata) -> _Metadata:
    """Remove what info.json no longer lists but an added feature left: its stats.json entry,
    its data column and its per-episode stats columns (only features the episodes files hold
    stats of, as ``add_frame_feature`` writes them). Return the metadata read back."""
    features = meta.info["features"]
    stale: set[str] = set()
    for relative in meta.episode_files:
        columns = _open_parquet(root, relative, INFO_PATH).schema_arrow.names
        stale |= {c.split("/")[1] for c in columns if c.startswith("stats/")} - set(features)
    if not stale:
        return meta
    if stale & set(meta.stats):
        stats = {name: value for name, value in meta.stats.items() if name not in stale}
        _write_json(root / STATS_PATH, stats)
    for relative, rows in _group_by_file(meta.episodes).items():
        columns = _open_parquet(root, relative, f"episode {rows[0]['episode_index']}")
        doomed = [c for c in columns.schema_arrow.names if c in stale]
        if doomed:
            table = _read_table(root, relative, f"episode {rows[0]['episode_index']}")
            _write_parquet(root / relative, table.drop_columns(doomed))
    for relative in meta.episode_files:
        table = _read_table(root, relative, INFO_PATH)
        doomed = [c for c in table.column_names if c.startswith("stats/") and
                  c.split("/")[1] in stale]  # fmt: skip
        if doomed:
            _write_parquet(root / relative, table.drop_columns(doomed), compact=True)
    return _load_metadata(root)
