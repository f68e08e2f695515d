"""Reward shaping: potential rewards, bonuses, costs, chunks, noisy-verifier correction."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.core.trajectory import Trajectory, TrajectoryBatch
from embodied.rewards.shaping import (
    RewardShaper,
    chunk_rewards,
    collision_costs,
    corrected_success,
    discounted_returns,
    potential_rewards,
    step_costs,
    success_bonus,
)


def test_potential_rewards_hand_values_and_mask():
    progress = np.array([[0.0, 0.2, 0.5, 0.4], [0.1, 0.3, np.nan, np.nan]])
    mask = np.array([[True, True, True], [True, False, False]])
    rewards = potential_rewards(progress, mask)
    np.testing.assert_allclose(rewards, [[0.2, 0.3, -0.1], [0.2, 0.0, 0.0]])
    rewards = potential_rewards(progress, mask, gamma=0.5)
    np.testing.assert_allclose(rewards, [[0.1, 0.05, -0.3], [0.05, 0.0, 0.0]])
    np.testing.assert_allclose(potential_rewards([0.0, 0.5, 1.0]), [0.5, 0.5])


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_potential_rewards_telescope(gamma):
    rng = np.random.default_rng(0)
    progress = rng.uniform(size=(5, 9))
    rewards = potential_rewards(progress, gamma=gamma)
    returns = discounted_returns(rewards, gamma=gamma)
    np.testing.assert_allclose(returns, gamma**8 * progress[:, -1] - progress[:, 0])
    if gamma == 1.0:
        np.testing.assert_allclose(rewards.sum(axis=1), progress[:, -1] - progress[:, 0])


def test_nan_progress_names_the_trajectory():
    progress = np.zeros((3, 4))
    progress[2, 1] = np.nan
    with pytest.raises(ValueError, match="trajectory 2"):
        potential_rewards(progress)
    mask = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0]], dtype=bool)
    potential_rewards(progress, mask)  # NaN only on a padded row: fine
    with pytest.raises(ValueError, match="trajectory 2"):
        RewardShaper()(progress, np.ones((3, 3), bool))


def test_success_bonus_costs():
    mask = np.array([[True, True, True], [True, True, False]])
    np.testing.assert_allclose(
        success_bonus(np.array([True, True]), mask, 2.0), [[0, 0, 2], [0, 2, 0]]
    )
    np.testing.assert_allclose(success_bonus(np.array([False, True]), mask), [[0, 0, 0], [0, 1, 0]])
    flags = np.array([[False, True, True], [False, False, True]])  # per step; row 1 flag padded
    np.testing.assert_allclose(success_bonus(flags, mask), [[0, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(step_costs(mask), mask.astype(float))
    collisions = np.array([[0, 2, 1], [1, 0, 5]])
    np.testing.assert_allclose(collision_costs(collisions, mask), [[0, 2, 1], [1, 0, 0]])


def test_chunk_rewards_partial_last_chunk_and_mask():
    rewards = np.arange(1.0, 8.0)[None].repeat(2, axis=0)  # 7 steps
    mask = np.ones((2, 7), bool)
    mask[1, 3:] = False
    sums, chunk_mask = chunk_rewards(rewards, 3, mask)
    np.testing.assert_allclose(sums, [[6, 15, 7], [6, 0, 0]])
    np.testing.assert_array_equal(chunk_mask, [[True, True, True], [True, False, False]])
    sums, chunk_mask = chunk_rewards(rewards[0], 1)
    np.testing.assert_allclose(sums, rewards[0])
    with pytest.raises(ValueError, match="chunk"):
        chunk_rewards(rewards, 0)


def test_corrected_success_is_unbiased():
    rng = np.random.default_rng(0)
    a, b, rate = 0.2, 0.1, 0.3
    success = rng.uniform(size=400_000) < rate
    flip = rng.uniform(size=success.shape)
    observed = np.where(success, flip >= b, flip < a).astype(float)  # FN rate b, FP rate a
    assert abs(observed.mean() - rate) > 0.05  # the raw detector is biased
    estimate = corrected_success(observed, a, b).mean()
    assert estimate == pytest.approx(rate, abs=0.005)
    np.testing.assert_allclose(corrected_success([0.0, 1.0], 0.2, 0.1), [-0.2 / 0.7, 0.8 / 0.7])
    with pytest.raises(ValueError, match=">= 1"):
        corrected_success(1.0, 0.6, 0.4)
    with pytest.raises(ValueError):
        RewardShaper(verifier_fpr=0.5, verifier_fnr=0.5)


def test_reward_shaper_arrays_hand_values():
    progress = np.array([[0.0, 0.5, 1.0, 1.0], [0.0, 0.25, 0.0, 0.0]])
    mask = np.array([[True, True, False], [True, True, True]])
    collisions = np.array([[0, 1, 1], [1, 0, 0]])
    shaper = RewardShaper(progress=2.0, success=10.0, step=0.1, collision=1.0, chunk=2)
    out = shaper(progress, mask, np.array([True, False]), collisions)
    expected = np.array(
        [[2 * 0.5 - 0.1, 2 * 0.5 + 10 - 0.1 - 1, 0.0], [0.5 - 0.1 - 1, -0.5 - 0.1, -0.1]]
    )
    np.testing.assert_allclose(out.rewards, expected)
    np.testing.assert_allclose(out.returns, expected.sum(axis=1))
    chunks = [[expected[0, :2].sum(), 0.0], [expected[1, :2].sum(), expected[1, 2]]]
    np.testing.assert_allclose(out.chunk_rewards, chunks)
    np.testing.assert_array_equal(out.chunk_mask, [[True, False], [True, True]])
    with pytest.raises(ValueError, match="no collisions"):
        shaper(progress, mask, np.array([True, False]))


def test_reward_shaper_verifier_correction():
    mask = np.ones((2, 2), bool)
    out = RewardShaper(progress=0.0, success=1.0, verifier_fpr=0.2, verifier_fnr=0.1)(
        None, mask, np.array([1.0, 0.0])
    )
    np.testing.assert_allclose(out.rewards, [[0, 0.8 / 0.7], [0, -0.2 / 0.7]])


def _trajectory(steps: int, success: bool, collisions: list[int]) -> Trajectory:
    return Trajectory(
        observations={"agent_pos": np.zeros((steps + 1, 2), np.float32)},
        actions=np.zeros((steps, 2), np.float32),
        rewards=np.zeros(steps, np.float32),
        terminated=np.zeros(steps, bool),
        truncated=np.zeros(steps, bool),
        success=success,
        instruction="pick",
        task="pick",
        suite="test",
        info={"collisions": np.array(collisions, dtype=np.int64)},
    )


def test_reward_shaper_from_batch():
    batch = TrajectoryBatch.from_trajectories(
        [_trajectory(3, True, [0, 1, 0]), _trajectory(2, False, [1, 1])]
    )
    progress = np.array([[0.0, 0.3, 0.6, 1.0], [0.0, 0.2, 0.1, np.nan]])  # NaN is padding
    shaper = RewardShaper(success=1.0, collision=0.5)
    out = shaper.from_batch(batch, progress)
    expected = [[0.3, 0.3 - 0.5, 0.4 + 1.0], [0.2 - 0.5, -0.1 - 0.5, 0]]
    np.testing.assert_allclose(out.rewards, expected)
    np.testing.assert_allclose(out.returns, [1.0 + 1.0 - 0.5, 0.1 - 1.0])
    with pytest.raises(ValueError, match="info\\['bumps'\\]"):
        RewardShaper(collision=1.0, collision_key="bumps").from_batch(batch, progress)
