"""The reward models GRPO, TPO and ``embodied eval reward`` choose between by name, all behind
``embodied.core.reward.RewardModel``:

- ``learned``: a trained ``ProgressRewardModel`` scores ``frames`` evenly spaced observations of
  each trajectory in one batch (first and last included: the clip length it was trained on, so
  its time embedding sees familiar positions), linearly interpolated to every observation; its
  success head gives the success probability.
- ``judge``: a zero-shot ``VLMJudge`` (GVL) over a local image-text-to-text model, on the same
  frames; unanswered frames stay NaN and are counted.
- ``privileged``: the simulator's progress labels (``info["progress"]``, the reset's value first).
- ``success``: no progress at all (zeros), so returns come from success alone (the ablation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embodied.core.reward import ProgressScore, RewardModel, camera_frames, evenly_spaced
from embodied.core.trajectory import Trajectory

REWARD_TYPES = ("learned", "judge", "privileged", "success")
NEEDS_PATH = ("learned", "judge")  # the types that load a model from a directory


class LearnedProgress(RewardModel):
    """A trained progress reward model (see the module docstring)."""

    reward_type = "learned"

    def __init__(self, model: Any, frames: int = 8) -> None:
        self.model, self.frames = model.eval(), int(frames)

    @property
    def image_size(self) -> tuple[int, int]:
        size = self.model.config.image_size
        return (size, size)

    @property
    def image_key(self) -> str | None:
        return self.model.config.image_key or None

    def score(self, trajectories: Sequence[Trajectory]) -> list[ProgressScore]:
        import torch

        picks = [evenly_spaced(t.length + 1, self.frames) for t in trajectories]
        width = max(len(p) for p in picks)
        clips = []
        for traj, pick in zip(trajectories, picks, strict=True):
            pick = np.concatenate([pick, np.repeat(pick[-1:], width - len(pick))])  # causal pad
            clips.append(camera_frames(traj, self.image_key)[pick])
        frames = torch.from_numpy(np.stack(clips)).to(self.model.device)
        with torch.no_grad():
            out = self.model(frames, [t.instruction for t in trajectories])
        progress = out["progress"].cpu().numpy().astype(np.float64)
        success = torch.sigmoid(out["success_logits"]).cpu().numpy().astype(np.float64)
        scores = []
        for i, (traj, pick) in enumerate(zip(trajectories, picks, strict=True)):
            p = progress[i, : len(pick)]
            if not np.isfinite(p).all():
                raise FloatingPointError(
                    f"the reward model returned NaN progress for trajectory {i}"
                )
            curve = np.interp(np.arange(traj.length + 1), pick, p)
            scores.append(ProgressScore(curve, float(success[i, len(pick) - 1])))
        return scores


class JudgeProgress(RewardModel):
    """A zero-shot VLM judge (see the module docstring)."""

    reward_type = "judge"

    def __init__(self, judge: Any, frames: int = 8) -> None:
        self.judge, self.frames = judge, int(frames)

    @property
    def image_size(self) -> tuple[int, int] | None:
        return None  # the judge's processor resizes whatever it is given

    def score(self, trajectories: Sequence[Trajectory]) -> list[ProgressScore]:
        scores = []
        for traj in trajectories:
            pick = evenly_spaced(traj.length + 1, self.frames)
            result = self.judge.judge(camera_frames(traj)[pick], traj.instruction)
            answers = np.asarray(result.progress, dtype=np.float64)
            known = np.isfinite(answers)
            curve = np.full(traj.length + 1, np.nan)
            if known.any():  # between answered frames, interpolate
                span = np.arange(pick[known][0], pick[known][-1] + 1)
                curve[span] = np.interp(span, pick[known], answers[known])
            curve[pick[~known]] = np.nan  # an unanswered frame is never filled in
            scores.append(ProgressScore(curve, None, int(result.n_missing)))
        return scores


class PrivilegedProgress(RewardModel):
    """The simulator's progress labels: the reset's value, then each step's."""

    reward_type = "privileged"

    def score(self, trajectories: Sequence[Trajectory]) -> list[ProgressScore]:
        scores = []
        for traj in trajectories:
            if "progress" not in traj.info:
                raise ValueError(
                    f"privileged progress needs info['progress'], which {traj.task or 'the env'} "
                    f"does not record (info keys: {sorted(traj.info)})"
                )
            first = float(traj.metadata.get("reset_info", {}).get("progress", 0.0))
            steps = np.asarray(traj.info["progress"], dtype=np.float64)
            scores.append(ProgressScore(np.concatenate([[first], steps])))
        return scores


class SuccessOnly(RewardModel):
    """No progress (zeros): returns from success alone."""

    reward_type = "success"

    def score(self, trajectories: Sequence[Trajectory]) -> list[ProgressScore]:
        return [ProgressScore(np.zeros(t.length + 1)) for t in trajectories]


def make_reward_model(
    reward_type: str, path: str = "", frames: int = 8, device: Any = "cpu"
) -> RewardModel:
    """The reward model ``reward_type`` names; ``path`` is a saved progress model (``learned``)
    or a local image-text-to-text model directory (``judge``)."""
    if reward_type not in REWARD_TYPES:
        raise ValueError(f"reward must be one of {REWARD_TYPES}, got {reward_type!r}")
    if reward_type in NEEDS_PATH and not path:
        what = "saved progress model" if reward_type == "learned" else "local VLM"
        raise ValueError(f"reward={reward_type} needs reward_model=<{what} directory>")
    if reward_type == "learned":
        from embodied.rewards.progress import ProgressRewardModel

        return LearnedProgress(ProgressRewardModel.from_pretrained(path, device=device), frames)
    if reward_type == "judge":
        from embodied.rewards.vlm_judge import VLMJudge

        return JudgeProgress(VLMJudge.from_pretrained(path), frames)
    return PrivilegedProgress() if reward_type == "privileged" else SuccessOnly()
