"""Rewards: progress-reward models, labels, success detectors, costs, metrics (core only)."""

from embodied.rewards.labels import (
    label_trajectories,
    median_stage_change,
    observation_stages,
    procedure_labels,
    rewind,
    stage_budgets,
    time_labels,
    trajectory_frames,
    visual_change,
)
from embodied.rewards.metrics import (
    calibration_error,
    success_auroc,
    value_order_correlation,
    voc_summary,
)

__all__ = [
    "calibration_error",
    "label_trajectories",
    "median_stage_change",
    "observation_stages",
    "procedure_labels",
    "rewind",
    "stage_budgets",
    "success_auroc",
    "time_labels",
    "trajectory_frames",
    "value_order_correlation",
    "visual_change",
    "voc_summary",
]
