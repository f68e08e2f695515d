"""GRPO's self-imitation: the decisions of rollouts that beat their group, cut as BC windows of
the policy's own actions; fitting them moves the greedy action there, for every policy type."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_policies import STATS, TASK_WORDS, tiny_policies

from embodied.core.run import read_metrics
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.rollout.backends import LocalRollouts
from embodied.rollout.episodes import decision_windows
from embodied.train.anchor import SelfImitation
from embodied.train.grpo import GRPOConfig, train_grpo
from embodied.train.onpolicy import rollout_groups

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _policy(kind: str):
    """A tiny untrained policy of each kind; the planner predicts a (training-only) state."""
    torch.manual_seed(0)
    policy = tiny_policies(aux_state_dim=39, aux_state_weight=1.0)[kind]
    return policy.fit_normalizers(STATS).eval()


def _rollouts(policy, steps: int = 14) -> list:
    """Two sampled episodes of Reach from one state."""
    rollouts = LocalRollouts("Reach", {"image_size": 32, "max_episode_steps": steps}, policy, 2)
    try:
        return rollout_groups(rollouts, [3], group_size=2, sample_seed=0)
    finally:
        rollouts.close()


def test_windows_are_the_chosen_rollouts_own_actions_cut_as_bc_windows() -> None:
    """Only the trajectory with a positive advantage is kept; each decision's window holds the
    observations it saw and the actions executed from its oldest observation on, padded outside
    the episode, as ``BCDataset`` cuts a demonstration."""
    policy = _policy("diffusion")
    trajs = _rollouts(policy)
    chosen, other = trajs
    imitation = SelfImitation(trajs, np.array([0.7, -0.7]), policy, batch_size=8)
    assert len(imitation) == chosen.num_decisions == 4  # 14 steps in chunks of 4
    assert imitation.instructions == [chosen.instruction] * 4
    for key, value in decision_windows(chosen, policy.observation_spec).items():
        np.testing.assert_array_equal(imitation.windows[key], value)
    actions, pad = imitation.windows["action"], imitation.windows["action_is_pad"]
    assert actions.shape == (4, 8, 4) and pad.shape == (4, 8)
    for k, step in enumerate(chosen.decision_steps):  # window k starts at step - 1
        for j in range(8):
            t = int(step) - 1 + j
            assert pad[k, j] == (t < 0 or t >= 14)
            np.testing.assert_array_equal(actions[k, j], chosen.actions[min(max(t, 0), 13)])
    assert not np.array_equal(chosen.actions, other.actions)  # the other one is not in it
    assert len(SelfImitation(trajs, np.array([0.0, -0.0]), policy, batch_size=8)) == 0


@pytest.mark.parametrize("kind", ["mlp", "diffusion", "flow", "vla"])
def test_fitting_the_windows_moves_the_greedy_action_to_the_imitated_one(kind: str) -> None:
    """A policy's greedy action on the observations a rollout saw moves to the actions that
    rollout took: what self-imitation is for (here one action every step, away from the untrained
    policy's own). The planner's auxiliary state target is absent from a rollout's windows, and
    its BC loss runs without it."""
    policy = _policy(kind)
    rollout = _rollouts(policy)[0]
    taken = np.tile(np.array([0.6, -0.5, 0.3, -0.2], np.float32), (len(rollout.actions), 1))
    rollout = dataclasses.replace(rollout, actions=taken)
    imitation = SelfImitation([rollout], np.ones(1), policy, batch_size=len(taken))
    n = policy.observation_spec.n_obs_steps
    chunk = policy.action_spec.chunk
    obs = {k: torch.from_numpy(v) for k, v in imitation.windows.items() if k.startswith("obs")}
    target = torch.from_numpy(imitation.windows["action"][:, n - 1 : n - 1 + chunk])
    keep = ~torch.from_numpy(imitation.windows["action_is_pad"][:, n - 1 : n - 1 + chunk])

    def distance() -> float:
        with torch.no_grad():
            greedy = policy.act(obs, imitation.instructions, deterministic=True).actions
        return float(((greedy - target).pow(2).sum(-1) * keep).sum() / keep.sum())

    before = distance()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    for _ in range(150):
        optimizer.zero_grad()
        imitation.loss(policy, rng).backward()
        optimizer.step()
    assert distance() < 0.2 * before


def test_grpo_logs_self_imitation_of_the_decisions_that_beat_their_group(tmp_path: Path) -> None:
    """``imitate_coef > 0``: every iteration builds the windows of its positive-advantage
    trajectories and each update adds their BC loss; at 0 there is none."""
    policy = _policy("mlp")
    policy.save_pretrained(tmp_path / "policy")
    ProgressRewardModel(
        ProgressConfig(image_size=16, vocab=TASK_WORDS, vision_channels=[4, 8], num_keypoints=4,
                       d_model=16, n_heads=2, n_layers=1, ff_dim=32, num_bins=8)
    ).save_pretrained(tmp_path / "reward")  # fmt: skip

    def run(out: str, **overrides) -> list[dict]:
        cfg = GRPOConfig(
            policy=str(tmp_path / "policy"), task="Reach", reward="learned",
            reward_model=str(tmp_path / "reward"), iterations=2, groups=2, group_size=3,
            keep_low=0.0, keep_high=1.0, epochs=1, minibatch_size=16, eval_episodes=0,
            out=str(tmp_path / out), device="cpu", env={"max_episode_steps": 20}, **overrides,
        )  # fmt: skip
        return [r for r in read_metrics(train_grpo(cfg).path / "metrics.jsonl")
                if "update/policy_loss" in r]  # fmt: skip

    rows = run("imitate", imitate_coef=1.0, imitate_batch_size=8)
    assert len(rows) == 2
    for row in rows:  # some of every kept group's trajectories beat its mean
        assert 0 < row["update/imitate_decisions"] < row["update/decisions"]
        assert np.isfinite(row["update/imitate_loss"]) and row["update/imitate_loss"] > 0
    assert all("update/imitate_loss" not in r for r in run("plain"))
