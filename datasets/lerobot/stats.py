"""Feature statistics computed exactly as LeRobot 0.6 computes them (``compute_episode_stats``
and ``aggregate_stats``), so a dataset written here and one LeRobot appends to hold stats of the
same shapes, values and parquet types: per-episode stats in the episode rows
(``stats/<feature>/<stat>``, nested lists) and their aggregate in ``meta/stats.json``.

Per episode and feature, over every frame (LeRobot keeps no padding aside):

- numeric ``[N]`` (info shape ``[1]``): stats of shape ``(1,)``; ``[N, D]``: ``(D,)``;
  ``[N, ..., D]`` (e.g. ``object_pos`` ``[N, 8, 3]``): ``(D,)`` over all rows of the last axis,
  count N (LeRobot flattens the leading axes);
- images and videos: ``estimate_num_samples`` frames picked evenly, strided down when a side
  reaches 300 px, per-channel stats over their pixels divided by 255, shape ``(3, 1, 1)``, count =
  the frames picked;
- min, max, mean, std from one pass in float32 for float32 / integer-free data (numpy's
  ``result_type(dtype, float32)``, as LeRobot's ``RunningQuantileStats``), quantiles
  q01..q99 interpolated in a 5000-bin histogram per dimension; fewer than 2 rows: quantiles are
  the mean.

Aggregation: min/max elementwise, mean weighted by count, std from the weighted second moments,
quantiles as the count-weighted mean of the episodes' quantiles (approximate, as LeRobot's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILES)
QUANTILE_BINS = 5000  # histogram bins per dimension for the quantiles
# Frames an episode's image stats sample: all below 100, then n ** 0.75, at most 10 000.
IMAGE_SAMPLES_MIN, IMAGE_SAMPLES_MAX, IMAGE_SAMPLES_POWER = 100, 10_000, 0.75
# Images with a side of at least 300 px are strided down to about 150 px for their stats.
IMAGE_DOWNSAMPLE_FROM, IMAGE_DOWNSAMPLE_TO = 300, 150
IMAGE_DTYPES = ("video", "image")


def _stats_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    """Shape of a feature's stats: (3, 1, 1) per channel for images, else its last axis."""
    if feature["dtype"] in IMAGE_DTYPES:
        return (3, 1, 1)
    return (int(feature["shape"][-1]),)


def _image_sample_count(num_frames: int) -> int:
    """How many frames of an episode image stats use (LeRobot's ``estimate_num_samples``)."""
    low = min(num_frames, IMAGE_SAMPLES_MIN)
    return max(low, min(int(num_frames**IMAGE_SAMPLES_POWER), IMAGE_SAMPLES_MAX))


def _image_samples(frames: np.ndarray) -> np.ndarray:
    """The frames image stats read, channel first ``[n, 3, h, w]`` (``sample_images``)."""
    count = _image_sample_count(len(frames))
    picks = np.round(np.linspace(0, len(frames) - 1, count)).astype(int)
    images = frames[picks].transpose(0, 3, 1, 2)
    height, width = images.shape[2:]
    if max(height, width) >= IMAGE_DOWNSAMPLE_FROM:
        factor = int((width if width > height else height) / IMAGE_DOWNSAMPLE_TO)
        images = images[:, :, ::factor, ::factor]
    return images


def _quantiles(column: np.ndarray, low: np.generic, high: np.generic) -> list[float]:
    """``QUANTILES`` of one column as LeRobot interpolates them in its histogram of
    ``QUANTILE_BINS`` bins (``_compute_single_quantile``), read off the sorted column instead
    of building the histogram (the same values: tests/test_dataset_stats.py).

    The histogram's cumulative count at bin i is ``#(x < edges[i + 1])`` (every x in the last
    bin). A quantile's bin is the first whose count reaches ``target = q * n``, i.e. reaches
    ``k = ceil(target)``: the first edge above the k-th smallest value closes it.
    """
    edges = np.linspace(low - 1e-10, high + 1e-10, QUANTILE_BINS + 1)
    ordered = np.sort(column)
    values: list[float] = []
    for q in QUANTILES.values():
        target = q * len(column)
        kth = ordered[math.ceil(target) - 1]
        index = min(int(np.searchsorted(edges, kth, side="right")), QUANTILE_BINS) - 1
        if index <= 0:
            values.append(edges[0])
            continue
        before = np.float64(np.searchsorted(ordered, edges[index], side="left"))
        side = "left" if index + 1 < QUANTILE_BINS else "right"
        in_bin = np.float64(np.searchsorted(ordered, edges[index + 1], side=side)) - before
        if in_bin == 0:
            values.append(edges[index])
            continue
        step = edges[index + 1] - edges[index]
        values.append(edges[index] + (target - before) / in_bin * step)
    return values


def _row_stats(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Stats of ``rows`` ``[n, D]`` per column, as ``RunningQuantileStats`` after one update."""
    rows = rows.astype(np.result_type(rows.dtype, np.float32), copy=False)
    low, high = np.min(rows, axis=0), np.max(rows, axis=0)
    mean = np.mean(rows, axis=0)
    variance = np.mean(rows**2, axis=0) - mean**2
    stats = {
        "min": low.copy(),
        "max": high.copy(),
        "mean": mean,
        "std": np.sqrt(np.maximum(0, variance)),
    }
    columns = [_quantiles(rows[:, c], low[c], high[c]) for c in range(rows.shape[1])]
    for i, name in enumerate(QUANTILES):
        stats[name] = np.array([values[i] for values in columns])
    return stats


def _basic_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Stats of fewer than two rows: quantiles are the mean (``_compute_basic_stats``)."""
    mean = np.mean(values, axis=0)
    stats = {
        "min": np.min(values, axis=0),
        "max": np.max(values, axis=0),
        "mean": mean,
        "std": np.std(values, axis=0),
    }
    stats.update({name: mean.copy() for name in QUANTILES})
    return stats


def _episode_stats(values: np.ndarray, video: bool) -> dict[str, np.ndarray]:
    """One episode's stats of a feature's per-frame ``values`` ``[N, ...]`` in LeRobot's shapes
    (module docstring); ``video``: camera images ``uint8 [N, H, W, 3]`` (a video or an image
    feature)."""
    if video:
        images = _image_samples(values)
        rows, count = images.transpose(0, 2, 3, 1).reshape(-1, images.shape[1]), len(images)
    else:
        values = values.reshape(len(values)) if values.shape[1:] in ((), (1,)) else values
        rows = values.reshape(-1, 1) if values.ndim == 1 else values
        count = len(values)
    if rows.shape[0] < 2:
        stats = _basic_stats(rows)
    else:
        stats = _row_stats(rows.reshape(-1, rows.shape[-1]))
    if video:
        stats = {name: value.reshape(3, 1, 1) / 255.0 for name, value in stats.items()}
    elif values.ndim == 1:
        stats = {name: value.reshape(1) for name, value in stats.items()}
    stats["count"] = np.array([count])
    return {name: stats[name] for name in STAT_NAMES}


def _aggregate_stats(per_episode: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode stats of one feature (LeRobot's ``aggregate_feature_stats``)."""
    means = np.stack([s["mean"] for s in per_episode])
    variances = np.stack([s["std"] ** 2 for s in per_episode])
    counts = np.stack([s["count"] for s in per_episode])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    stats = {
        "min": np.min(np.stack([s["min"] for s in per_episode]), axis=0),
        "max": np.max(np.stack([s["max"] for s in per_episode]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": total,
    }
    for name in QUANTILES:
        stats[name] = (np.stack([s[name] for s in per_episode]) * counts).sum(axis=0) / total
    return {name: stats[name] for name in STAT_NAMES}


class _StatsTotals:
    """Running sums that give ``_aggregate_stats`` of every episode added so far, so a commit
    costs the same with 10 or 10,000 episodes committed before (the same rule, summed in
    another order: equal to rounding)."""

    def __init__(self) -> None:
        """No episodes yet."""
        self._sums: dict[str, dict[str, np.ndarray]] = {}

    def copy(self) -> _StatsTotals:
        """An independent copy (a commit adds to a copy and keeps it once written)."""
        other = _StatsTotals()
        other._sums = {name: dict(sums) for name, sums in self._sums.items()}
        return other

    def add(self, episode: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Add one episode's per-feature stats (``_episode_stats`` of each feature)."""
        for name, stats in episode.items():
            count = float(stats["count"][0])
            mean = np.asarray(stats["mean"], dtype=np.float64)
            terms = {
                "count": count,
                "mean": count * mean,
                "square": count * (np.asarray(stats["std"], dtype=np.float64) ** 2 + mean**2),
                **{q: count * np.asarray(stats[q], dtype=np.float64) for q in QUANTILES},
            }
            sums = self._sums.get(name)
            if sums is None:
                self._sums[name] = {**terms, "min": stats["min"], "max": stats["max"]}
                continue
            for key, value in terms.items():
                sums[key] = sums[key] + value
            sums["min"] = np.minimum(sums["min"], stats["min"])
            sums["max"] = np.maximum(sums["max"], stats["max"])

    def json(self) -> dict:
        """stats.json content: per feature, min/max/mean/std/count and the quantiles."""
        out = {}
        for name, sums in self._sums.items():
            total = sums["count"]
            mean = sums["mean"] / total
            stats = {
                "min": np.asarray(sums["min"]),
                "max": np.asarray(sums["max"]),
                "mean": mean,
                "std": np.sqrt(np.maximum(sums["square"] / total - mean**2, 0.0)),
                "count": np.array([int(total)], dtype=np.int64),
                **{q: sums[q] / total for q in QUANTILES},
            }
            out[name] = {stat: stats[stat].tolist() for stat in STAT_NAMES}
        return out


def _stats_json(per_episode: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> dict:
    """stats.json content from the per-episode stats of every committed episode."""
    if not per_episode:
        return {}
    return {
        name: {
            stat: value.tolist()
            for stat, value in _aggregate_stats([episode[name] for episode in per_episode]).items()
        }
        for name in per_episode[0]
    }


def _stats_row(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, list]:
    """Per-episode stats as episode-row columns ``stats/<feature>/<stat>``, nested like their
    arrays (images ``(3, 1, 1)`` -> lists of lists of lists), as LeRobot writes them."""
    return {
        f"stats/{name}/{stat}": value.tolist()
        for name, feature_stats in stats.items()
        for stat, value in feature_stats.items()
    }


def _stats_from_row(row: Mapping[str, Any], features: Mapping[str, Any]) -> dict:
    """Inverse of ``_stats_row`` for the given features.

    Rows written before the stats took LeRobot's shapes hold a ``[N, ..., D]`` feature's stats
    per entry (e.g. ``(8, 3)``, flattened); they are combined into LeRobot's ``(D,)`` by the
    aggregation rule, each entry counting N rows: exact for min, max, mean and std.
    """
    stats: dict[str, dict[str, np.ndarray]] = {}
    for name, feature in features.items():
        shape = _stats_shape(feature)
        values = {stat: np.array(row[f"stats/{name}/{stat}"]) for stat in STAT_NAMES}
        size = values["mean"].size
        if size != int(np.prod(shape)) and size % shape[-1] == 0:
            entries = [
                {
                    stat: value if stat == "count" else value.reshape(-1, shape[-1])[entry]
                    for stat, value in values.items()
                }
                for entry in range(size // shape[-1])
            ]
            combined = _aggregate_stats(entries)
            combined["count"] = values["count"]
            values = combined
        stats[name] = {
            stat: value if stat == "count" else value.reshape(shape)
            for stat, value in values.items()
        }
    return stats
