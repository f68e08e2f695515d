"""Rewards: progress-reward models, labels, success detectors, costs, metrics (core only).

The torch model (``ProgressRewardModel``) is imported on first use, so labelling and metrics do
not pay for importing torch.
"""

from typing import Any

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
from embodied.rewards.shaping import (
    RewardShaper,
    ShapedRewards,
    chunk_rewards,
    collision_costs,
    corrected_success,
    discounted_returns,
    potential_rewards,
    step_costs,
    success_bonus,
)
from embodied.rewards.vlm_judge import (
    JudgeRequest,
    JudgeResult,
    VLMJudge,
    build_prompt,
    judged_voc,
    make_permutation,
    parse_completion,
    unshuffle,
)

__all__ = [
    "RewardShaper",
    "ShapedRewards",
    "chunk_rewards",
    "collision_costs",
    "corrected_success",
    "discounted_returns",
    "potential_rewards",
    "step_costs",
    "success_bonus",
    "JudgeRequest",
    "JudgeResult",
    "VLMJudge",
    "build_prompt",
    "judged_voc",
    "make_permutation",
    "parse_completion",
    "unshuffle",
    "ProgressConfig",
    "ProgressRewardModel",
    "augment_frames",
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

_LAZY = {"ProgressConfig", "ProgressRewardModel", "augment_frames"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from embodied.rewards import progress

        return getattr(progress, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
