"""The reward-model interface: each implementation scores real rollouts, one value per
observation, and ``embodied eval reward`` scores the VLM judge through it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embodied.sims as sims
from embodied.core.reward import camera_frames, evenly_spaced
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.rewards.models import (
    JudgeProgress,
    LearnedProgress,
    PrivilegedProgress,
    SuccessOnly,
    make_reward_model,
)
from embodied.rollout.episodes import ExpertActor, rollout_vector

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def rollouts():
    vec = sims.make_vec_env("Reach", 2, autoreset_mode="disabled", obs_mode="pixels_state",
                            image_size=16, max_episode_steps=12)  # fmt: skip
    try:
        return list(rollout_vector(vec, ExpertActor(vec, noise=0.3), [0, 1, 2]))
    finally:
        vec.close()


def _tiny_model() -> ProgressRewardModel:
    torch.manual_seed(0)
    return ProgressRewardModel(
        ProgressConfig(image_size=16, vision_channels=[4, 8], num_keypoints=4, d_model=16,
                       n_heads=2, n_layers=1, ff_dim=32, num_bins=8)
    ).eval()  # fmt: skip


def test_privileged_and_success_only(rollouts) -> None:
    for traj, score in zip(rollouts, PrivilegedProgress().score(rollouts), strict=True):
        assert score.progress.shape == (traj.length + 1,)
        np.testing.assert_array_equal(score.progress[1:], traj.info["progress"])
    assert all(not s.progress.any() for s in SuccessOnly().score(rollouts))


def test_learned_scores_evenly_spaced_frames_and_interpolates(rollouts) -> None:
    model = _tiny_model()
    scores = LearnedProgress(model, frames=4).score(rollouts)
    for traj, score in zip(rollouts, scores, strict=True):
        picks = evenly_spaced(traj.length + 1, 4)
        clip = torch.from_numpy(camera_frames(traj)[picks])[None]
        with torch.no_grad():
            alone = model(clip, [traj.instruction])
        # scored in one padded batch, the same as scoring each clip alone (causal model)
        torch.testing.assert_close(
            torch.from_numpy(score.progress[picks]).float(), alone["progress"][0],
            rtol=1e-5, atol=1e-5,
        )  # fmt: skip
        assert score.success_prob == pytest.approx(
            float(torch.sigmoid(alone["success_logits"][0, -1])), abs=1e-5
        )
        assert np.all(np.diff(picks) > 0) and score.progress.shape == (traj.length + 1,)


def test_judge_leaves_unanswered_frames_unfilled(rollouts, judge_dir) -> None:
    judge = make_reward_model("judge", str(judge_dir), frames=4)
    assert isinstance(judge, JudgeProgress)
    for traj, score in zip(rollouts, judge.score(rollouts), strict=True):
        picks = evenly_spaced(traj.length + 1, 4)
        answered = np.isfinite(score.progress[picks])
        assert score.missing == int((~answered[1:]).sum())  # the anchor frame is given, not asked


def test_make_reward_model_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="reward must be one of"):
        make_reward_model("vibes")
    with pytest.raises(ValueError, match="reward=learned needs reward_model"):
        make_reward_model("learned")
    with pytest.raises(ValueError, match="reward=judge needs reward_model"):
        make_reward_model("judge")


def test_eval_reward_scores_the_judge_through_the_interface(tmp_path, judge_dir) -> None:
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.apps.label import run_label
    from embodied.evaluation.reward import evaluate_reward

    root = tmp_path / "reach"
    run_collect(CollectConfig(task="Reach", episodes=3, out=str(root), image_size=16, cutoff=0.5))
    run_label(root)
    (time_row, judge_row) = evaluate_reward(str(root), ["time", f"judge:{judge_dir}"], 4)
    assert judge_row["method"] == f"judge:{judge_dir}" and judge_row["episodes"] == 3
    assert 0 <= judge_row["missing"] <= 3 * 3  # three queried frames per episode at most
    assert time_row["voc_success_mean"] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def two_cameras():
    """A Reach rollout seen by the front and the wrist camera."""
    vec = sims.make_vec_env("Reach", 1, autoreset_mode="disabled", obs_mode="pixels_state",
                            image_size=16, cameras=["front", "wrist"],
                            max_episode_steps=8)  # fmt: skip
    try:
        return list(rollout_vector(vec, ExpertActor(vec, noise=0.3), [0]))[0]
    finally:
        vec.close()


def test_a_learned_model_scores_the_camera_it_was_trained_on(two_cameras, rollouts) -> None:
    """A model trained on the wrist camera scores the wrist, not the first camera a rollout has
    (it used to score ``front`` whatever it was trained on); one trained on a camera the rollout
    lacks is refused, naming both; a named camera is the only image of an env built with it."""
    model = _tiny_model()
    model.config.image_key = "observation.images.wrist"
    traj = two_cameras
    score = LearnedProgress(model, frames=4).score([traj])[0]
    picks = evenly_spaced(traj.length + 1, 4)
    wrist = torch.from_numpy(traj.observations["pixels"]["wrist"][picks])[None]
    with torch.no_grad():
        alone = model(wrist, [traj.instruction])["progress"][0]
    torch.testing.assert_close(torch.from_numpy(score.progress[picks]).float(), alone)
    model.config.image_key = "observation.images.top"
    with pytest.raises(ValueError, match=r"scores observation.images.top; the trajectory has "
                       r"\['observation.images.front', 'observation.images.wrist'\]"):  # fmt: skip
        LearnedProgress(model, frames=4).score([traj])
    model.config.image_key = "observation.images.front"
    front = camera_frames(rollouts[0], "observation.images.front")  # built with front alone
    np.testing.assert_array_equal(front, rollouts[0].observations["pixels"])
