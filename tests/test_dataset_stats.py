"""Per-episode feature stats: the quantiles read off the sorted values equal those LeRobot
interpolates in its 5000-bin histogram, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.datasets.lerobot.stats import QUANTILE_BINS, QUANTILES, _row_stats


def histogram_quantiles(rows: np.ndarray) -> dict[str, np.ndarray]:
    """The quantiles as LeRobot computes them: a histogram per column, then each quantile
    interpolated in the cumulative counts (``RunningQuantileStats``)."""
    rows = rows.astype(np.result_type(rows.dtype, np.float32), copy=False)
    low, high = np.min(rows, axis=0), np.max(rows, axis=0)
    out = {}
    for name, q in QUANTILES.items():
        values = []
        for c in range(rows.shape[1]):
            edges = np.linspace(low[c] - 1e-10, high[c] + 1e-10, QUANTILE_BINS + 1)
            counts = np.histogram(rows[:, c], bins=edges)[0].astype(np.float64)
            cumulative, target = np.cumsum(counts), q * len(rows)
            i = int(np.searchsorted(cumulative, target))
            if i == 0:
                values.append(edges[0])
            elif i >= len(cumulative):
                values.append(edges[-1])
            elif (in_bin := cumulative[i] - cumulative[i - 1]) == 0:
                values.append(edges[i])
            else:
                step = edges[i + 1] - edges[i]
                values.append(edges[i] + (target - cumulative[i - 1]) / in_bin * step)
        out[name] = np.array(values)
    return out


def cases() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.normal(size=(24, 7)).astype(np.float32),  # a short episode's state
        rng.normal(3.0, 1e-4, size=(150, 4)).astype(np.float32),  # narrow range
        rng.integers(0, 256, size=(25_600, 3), dtype=np.uint8),  # image pixels: many ties
        np.repeat(rng.normal(size=(5, 3)), 7, axis=0),  # float64, every value 7 times
        np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]], dtype=np.float32),  # constant column
        rng.integers(-5, 5, size=(97, 2)),  # int64: stats in float64
        np.stack([np.arange(100), np.arange(100)[::-1] * 1e6], axis=1).astype(np.float32),
        rng.normal(size=(2, 3)).astype(np.float32),  # two rows: the fewest with quantiles
        np.zeros((10, 1), dtype=np.float32),  # constant at zero (edges +-1e-10)
    ]


@pytest.mark.parametrize("rows", cases(), ids=lambda r: f"{r.dtype}{list(r.shape)}")
def test_quantiles_equal_lerobots_histogram_bit_for_bit(rows: np.ndarray) -> None:
    stats, expected = _row_stats(rows), histogram_quantiles(rows)
    for name in QUANTILES:
        assert stats[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(stats[name], expected[name], err_msg=name)
