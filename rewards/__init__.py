"""Rewards: progress reward models behind one interface, labels, returns and rankings, metrics.

The torch model (``ProgressRewardModel``) is imported on first use, so labelling and metrics do
not pay for importing torch.
"""

from typing import Any

from embodied.rewards.judge_prompt import (
    JudgeRequest,
    JudgeResult,
    build_prompt,
    judged_voc,
    make_permutation,
    parse_completion,
    unshuffle,
)
from embodied.rewards.labels import (
    label_trajectories,
    median_stage_change,
    observation_stages,
    procedure_labels,
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
from embodied.rewards.models import (
    REWARD_TYPES,
    JudgeProgress,
    LearnedProgress,
    PrivilegedProgress,
    SuccessOnly,
    make_reward_model,
)
from embodied.rewards.returns import OBJECTIVES, TrajectoryScore, preference_pairs
from embodied.rewards.rewind import rewind, rewind_order, rewind_split
from embodied.rewards.vlm_judge import VLMJudge

__all__ = [
    "JudgeProgress",
    "JudgeRequest",
    "JudgeResult",
    "LearnedProgress",
    "OBJECTIVES",
    "PrivilegedProgress",
    "ProgressConfig",
    "ProgressRewardModel",
    "REWARD_TYPES",
    "SuccessOnly",
    "TrajectoryScore",
    "VLMJudge",
    "augment_frames",
    "build_prompt",
    "calibration_error",
    "judged_voc",
    "label_trajectories",
    "make_permutation",
    "make_reward_model",
    "median_stage_change",
    "observation_stages",
    "parse_completion",
    "preference_pairs",
    "procedure_labels",
    "rewind",
    "rewind_order",
    "rewind_split",
    "stage_budgets",
    "success_auroc",
    "time_labels",
    "trajectory_frames",
    "unshuffle",
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
