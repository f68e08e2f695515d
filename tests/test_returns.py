"""Trajectory scores: the terms by hand, GRPO's return as the telescoped potential-based reward,
TPO's objectives and pairs, and terms a trajectory cannot give refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embodied.core.reward import ProgressScore
from embodied.core.trajectory_builder import TrajectoryBuilder
from embodied.evaluation.results import summarize
from embodied.rewards.returns import (
    OBJECTIVES,
    TrajectoryScore,
    preference_pairs,
    progress_gain,
    score_terms,
)


def _traj(success: bool, ee, goal, collisions, progress_end: float = 0.0):
    builder = TrajectoryBuilder({"agent_pos": np.zeros(4, np.float32)})
    for t in range(len(ee)):
        last = t == len(ee) - 1
        info = {
            "success": success and last,
            "progress": progress_end if last else 0.0,
            "collisions": collisions[t],
            "ee_pos": np.array(ee[t], np.float32),
            "goal_pos": np.array(goal, np.float32),
        }
        builder.add_step(np.zeros(4, np.float32), {"agent_pos": np.zeros(4, np.float32)}, 0.0,
                         False, False, info)  # fmt: skip
    return builder.build()


def test_score_terms_and_objectives_by_hand() -> None:
    traj = _traj(False, ee=[[0, 0, 0], [0.3, 0, 0]], goal=[0.3, 0.1, 0], collisions=[1, 0])
    progress = ProgressScore(np.array([0.1, 0.2, 0.5]))
    terms = score_terms(traj, progress, limit=8)
    assert terms["success"] == 0.0 and terms["progress"] == pytest.approx(0.4)
    assert terms["collisions"] == 1.0 and terms["steps"] == pytest.approx(2 / 8)
    # |ee - goal| = |(0, 0, 0) - (0.3, 0.1, 0)| then |(0.3, 0, 0) - (0.3, 0.1, 0)|
    assert terms["keypoints"] == pytest.approx((math.sqrt(0.1) + 0.1) / 2, abs=1e-6)
    safety = TrajectoryScore.objective("safety", limit=8)
    want = 1.0 * 0.0 + 0.5 * 0.4 - 1.0 * terms["keypoints"] - 0.5 * 1.0
    assert safety(traj, progress) == pytest.approx(want)
    assert OBJECTIVES["safety"]["collisions"] == 0.5
    tuned = TrajectoryScore.objective("success", {"keypoints": 0.0})
    assert tuned(traj, progress) == pytest.approx(0.5 * 0.4)
    with pytest.raises(ValueError, match="unknown score terms \\['speed'\\]"):
        TrajectoryScore({"speed": 1.0})
    with pytest.raises(ValueError, match="unknown objective 'fast'"):
        TrajectoryScore.objective("fast")


def test_success_term_counts_a_success_at_any_step_as_evaluation_does() -> None:
    """An episode that ran on past its success (``terminate_on_success=false``) and lost it
    scores as the success evaluation counts; ``success`` keeps the last step's flag."""
    builder = TrajectoryBuilder({"agent_pos": np.zeros(4, np.float32)})
    for flag in (False, True, False):
        builder.add_step(np.zeros(4, np.float32), {"agent_pos": np.zeros(4, np.float32)}, 0.0,
                         False, False, {"success": flag})  # fmt: skip
    traj = builder.build()
    assert not traj.success and traj.ever_succeeded
    assert score_terms(traj, None, limit=None)["success"] == 1.0
    assert summarize("t", [traj]).successes == 1


def test_grpo_return_is_the_telescoped_potential_reward() -> None:
    """R = w_s * success + w_p * sum_t (p_{t+1} - p_t), and the sum is p_T - p_0."""
    rng = np.random.default_rng(0)
    p = rng.uniform(size=9)
    traj = _traj(True, ee=[[0, 0, 0]] * 8, goal=[0, 0, 0], collisions=[0] * 8)
    returns = TrajectoryScore({"success": 2.0, "progress": 3.0})
    step_rewards = p[1:] - p[:-1]
    assert returns(traj, ProgressScore(p)) == pytest.approx(2.0 + 3.0 * step_rewards.sum())


def test_the_reward_model_s_success_head_is_a_term_where_it_has_one() -> None:
    """``success_prob``: the learned model's success probability at the end, weighted like the
    other terms; a model without a success head cannot give it, and weighting it then refuses."""
    traj = _traj(False, ee=[[0, 0, 0]] * 2, goal=[0, 0, 0], collisions=[0, 0])
    score = TrajectoryScore({"success": 1.0, "progress": 1.0, "success_prob": 2.0})
    assert score(traj, ProgressScore(np.array([0.1, 0.5, 0.9]), 0.8)) == pytest.approx(0.8 + 1.6)
    with pytest.raises(ValueError, match=r"cannot give score terms \['success_prob'\]"):
        score(traj, ProgressScore(np.array([0.1, 0.5, 0.9])))


def test_a_judge_s_unanswered_frames_are_skipped_not_filled() -> None:
    nan = float("nan")
    assert progress_gain(ProgressScore(np.array([0.0, nan, 0.4, nan]))) == pytest.approx(0.4)
    assert progress_gain(ProgressScore(np.array([nan, 0.3, nan]))) == 0.0


def test_a_weighted_term_the_trajectory_lacks_is_refused() -> None:
    """A safety ranking on an env that records no collisions (Meta-World) must not score every
    rollout as collision-free; the success objective, which does not weigh them, still works."""
    traj = _traj(True, ee=[[0, 0, 0], [0.3, 0, 0]], goal=[0.3, 0.1, 0], collisions=[0, 0])
    del traj.info["collisions"]
    progress = ProgressScore(np.array([0.0, 0.5, 1.0]))
    assert "collisions" not in score_terms(traj, progress, None)
    with pytest.raises(ValueError, match=r"score terms \['collisions'\].*info keys"):
        TrajectoryScore.objective("safety")(traj, progress)
    keypoints = (math.sqrt(0.1) + 0.1) / 2
    assert TrajectoryScore.objective("success")(traj, progress) == pytest.approx(
        1.0 + 0.5 - keypoints, abs=1e-6
    )
    with pytest.raises(ValueError, match=r"score terms \['progress'\].*no progress scored"):
        TrajectoryScore.objective("success")(traj)


def test_preference_pairs_within_groups() -> None:
    scores = [-0.5, -0.1, -0.9, -0.3, 1.0, 1.0, 1.0, 1.0]
    assert preference_pairs(scores, 4) == [(1, 2)]  # the tied group gives no pair
    assert preference_pairs(scores, 4, mode="all", margin=0.3) == [(0, 2), (1, 0), (1, 2), (3, 2)]
    with pytest.raises(ValueError, match="groups of 3"):
        preference_pairs(scores, 3)
