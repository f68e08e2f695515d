"""Feature statistics: per-episode min/max/mean/std/count/quantiles, their aggregate for
``meta/stats.json``, and their ``stats/<feature>/<stat>`` columns in the episode rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILES)
VIDEO_STATS_FRAMES = 16  # frames sampled per episode for image stats (aggregated over episodes)
VIDEO_STATS_SIZE = 32  # images are strided down to about this many pixels a side for stats


def _stats_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    """Shape of a feature's stats: (3, 1, 1) per channel for videos, else the feature shape."""
    return (3, 1, 1) if feature["dtype"] == "video" else tuple(feature["shape"])


def _real_steps(name: str, values: np.ndarray) -> np.ndarray:
    """The rows statistics are computed over: step-aligned columns (``action``, ``next.*``,
    ``decision.*``) leave out the last frame, whose padding zeros would skew normalisation."""
    step_aligned = name == "action" or name.startswith(("next.", "decision."))
    return values[:-1] if step_aligned and len(values) > 1 else values


def _episode_stats(values: np.ndarray, video: bool) -> dict[str, np.ndarray]:
    """Stats of one episode's column; images: per channel, scaled to [0, 1], sampled frames."""
    if video:
        picks = np.unique(np.linspace(0, len(values) - 1, VIDEO_STATS_FRAMES).round().astype(int))
        stride = max(1, max(values.shape[1:3]) // VIDEO_STATS_SIZE)
        samples = values[picks, ::stride, ::stride].reshape(-1, 3) / 255.0
        count, shape = len(picks), (3, 1, 1)
    else:
        samples = values.astype(np.float64).reshape(len(values), -1)
        count, shape = len(values), values.shape[1:] or (1,)
    stats = {
        "min": samples.min(axis=0),
        "max": samples.max(axis=0),
        "mean": samples.mean(axis=0),
        "std": samples.std(axis=0),
    }
    quantiles = np.quantile(samples, list(QUANTILES.values()), axis=0)
    stats.update(zip(QUANTILES, quantiles, strict=True))
    stats = {name: value.reshape(shape) for name, value in stats.items()}
    stats["count"] = np.array([count], dtype=np.int64)
    return {name: stats[name] for name in STAT_NAMES}


def _aggregate_stats(per_episode: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode stats of one feature (LeRobot's rule).

    min, max, mean, std and count are exact; quantiles are the count-weighted mean of the
    episodes' quantiles, an approximation.
    """
    counts = np.array([s["count"][0] for s in per_episode], dtype=np.float64)
    total = counts.sum()
    weights = (counts / total).reshape(-1, *[1] * per_episode[0]["mean"].ndim)

    def weighted(name: str) -> np.ndarray:
        return (np.stack([s[name] for s in per_episode]) * weights).sum(axis=0)

    mean = weighted("mean")
    spread = [s["std"] ** 2 + (s["mean"] - mean) ** 2 for s in per_episode]
    stats = {
        "min": np.min([s["min"] for s in per_episode], axis=0),
        "max": np.max([s["max"] for s in per_episode], axis=0),
        "mean": mean,
        "std": np.sqrt((np.stack(spread) * weights).sum(axis=0)),
        "count": np.array([int(total)], dtype=np.int64),
    }
    for name in QUANTILES:
        stats[name] = weighted(name)
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
    """Per-episode stats as episode-row columns ``stats/<feature>/<stat>`` (flat lists)."""
    return {
        f"stats/{name}/{stat}": value.reshape(-1).tolist()
        for name, feature_stats in stats.items()
        for stat, value in feature_stats.items()
    }


def _stats_from_row(row: Mapping[str, Any], features: Mapping[str, Any]) -> dict:
    """Inverse of ``_stats_row`` for the given features."""
    stats: dict[str, dict[str, np.ndarray]] = {}
    for name, feature in features.items():
        stats[name] = {}
        for stat in STAT_NAMES:
            value = np.array(row[f"stats/{name}/{stat}"])
            stats[name][stat] = value if stat == "count" else value.reshape(_stats_shape(feature))
    return stats
