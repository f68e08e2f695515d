"""Metrics for progress reward models (GVL / OpenGVL): value-order correlation, AUROC, calibration.

VOC only checks that predicted progress rises in time order, so a failed episode whose progress
plateaus can score as well as a success (TOPReward's blind spot). Report a success-detection metric
(``success_auroc`` of the final progress) and calibration (``calibration_error``) beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# scipy.stats is imported where it is used: importing it takes ~1 s, which every process that
# imports embodied.rewards (collection workers, Ray actors, each CLI command) would pay.
__all__ = ["calibration_error", "success_auroc", "value_order_correlation", "voc_summary"]


def _finite_1d(name: str, values: np.ndarray) -> np.ndarray:
    """Return values as float64 [N], raising ValueError unless 1-D and finite."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} has a non-finite value")
    return values


def value_order_correlation(pred: np.ndarray) -> float:
    """Value-Order Correlation: Spearman rank correlation of ``pred`` [T] with 0..T-1, in [-1, 1].

    0.0 when all predictions are equal or T < 2 (no order to measure).
    """
    pred = _finite_1d("pred", pred)
    if len(pred) < 2 or np.all(pred == pred[0]):
        return 0.0
    from scipy import stats

    result = stats.spearmanr(pred, np.arange(len(pred)))
    return float(result.statistic)


def voc_summary(preds: Sequence[np.ndarray]) -> dict[str, float]:
    """VOC aggregated over episodes: ``{"mean", "median", "std", "n"}`` (std with ddof 0)."""
    if len(preds) == 0:
        raise ValueError("voc_summary needs at least one episode's predictions")
    vocs = np.array([value_order_correlation(pred) for pred in preds], dtype=np.float64)
    return {
        "mean": float(vocs.mean()),
        "median": float(np.median(vocs)),
        "std": float(vocs.std()),
        "n": len(vocs),
    }


def success_auroc(final_progress: np.ndarray, success: np.ndarray) -> float:
    """AUROC of final progress as a success detector: P(score of a success > score of a failure).

    Mann-Whitney U with average ranks (ties count half)::

        U = sum(rank of successes) - n_pos * (n_pos + 1) / 2,   AUROC = U / (n_pos * n_neg)
    """
    scores = _finite_1d("final_progress", final_progress)
    success = np.asarray(success, dtype=bool)
    if success.shape != scores.shape:
        raise ValueError(f"success {success.shape} and final_progress {scores.shape} differ")
    n_pos = int(success.sum())
    n_neg = len(success) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"success_auroc needs both successes and failures, got {n_pos} and {n_neg}"
        )
    from scipy import stats

    ranks = stats.rankdata(scores)  # 1-based, ties get their average rank
    u = ranks[success].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def calibration_error(pred_prob: np.ndarray, outcome: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error of success probabilities, over equal-width bins of [0, 1].

    ``ECE = sum_b (n_b / N) * |mean(pred_prob in b) - mean(outcome in b)|``; a probability of
    exactly 1 falls in the last bin.
    """
    probs = _finite_1d("pred_prob", pred_prob)
    outcome = np.asarray(outcome, dtype=np.float64)
    if outcome.shape != probs.shape:
        raise ValueError(f"outcome {outcome.shape} and pred_prob {probs.shape} differ")
    if len(probs) == 0:
        raise ValueError("calibration_error needs at least one prediction")
    if np.any(probs < 0) or np.any(probs > 1):
        raise ValueError("pred_prob must lie in [0, 1]")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    bin_index = np.minimum((probs * bins).astype(np.int64), bins - 1)
    error = 0.0
    for b in range(bins):
        in_bin = bin_index == b
        if in_bin.any():
            gap = abs(probs[in_bin].mean() - outcome[in_bin].mean())
            error += in_bin.mean() * gap
    return float(error)
