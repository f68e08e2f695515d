"""GRPO's pieces on real rollouts: the ratio is 1 before the first update for every policy,
chain-step blocks recompute exactly, a drifted recomputation stops, and the reward monitor."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tiny_policies import STATS, tiny_policies

from embodied.rollout.backends import LocalRollouts
from embodied.train.grpo import grpo_loss
from embodied.train.monitor import RewardMonitor, reward_correlation, success_ranking
from embodied.train.onpolicy import (
    Decisions,
    check_ratio,
    collect_decisions,
    element_log_probs,
    rollout_groups,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_monitor_tracks_curves_when_every_rollout_succeeds() -> None:
    """All rollouts succeed (final privileged progress constant): the per-step correlation still
    says whether the learned reward rises with the task, where final values would be NaN."""
    rising = [np.linspace(0, 1, n) for n in (20, 30, 25)]
    tracking = [np.clip(c + 0.05 * np.sin(7 * c), 0, 1) for c in rising]
    assert reward_correlation(tracking, rising) > 0.95
    assert reward_correlation([c[::-1] for c in rising], rising) < -0.95  # a reward that falls
    hacked = [np.full_like(c, 0.9) for c in rising[:2]] + [rising[2]]
    assert reward_correlation(hacked, rising) < 0.5  # high from the start, whatever happens
    assert math.isnan(reward_correlation([np.ones(3)], [np.linspace(0, 1, 3)]))


def test_success_ranking_counts_pairs_within_groups() -> None:
    """How often a group's returns put a success above a failure: the part of the reward GRPO's
    group-normalised advantage passes on. Pairs never cross groups; a tie counts half."""
    success = np.array([1, 0, 1, 0, 1, 1, 0, 0])
    # group 1: (0 > 1) yes, (0 > 3) yes, (2 > 1) no, (2 > 3) yes; group 2: four ties
    returns = np.array([2.0, 1.0, 0.5, 0.4, 7.0, 7.0, 7.0, 7.0])
    assert success_ranking(success, returns, 4) == pytest.approx((3 + 4 * 0.5) / 8)
    assert success_ranking(success[:4], returns[:4], 4) == pytest.approx(3 / 4)
    # a high return in another group beats nothing: groups of 2 pair (1, 0), (1, 0), (1, 1), (0, 0)
    assert success_ranking(success, returns, 2) == pytest.approx(1.0)
    assert success_ranking(success, success.astype(float), 4) == 1.0  # the success-only reward
    assert math.isnan(success_ranking(np.ones(4), np.arange(4.0), 4))  # no failure to rank


# --- the importance ratio is 1 before the first update, for every policy ---------------------


@pytest.mark.parametrize("kind", ["mlp", "diffusion", "flow", "vla"])
def test_ratio_is_one_before_the_first_update(kind: str) -> None:
    torch.manual_seed(0)
    policy = tiny_policies()[kind].fit_normalizers(STATS).eval()
    rollouts = LocalRollouts("Reach", {"image_size": 32, "max_episode_steps": 12}, policy, 4)
    try:
        trajs = rollout_groups(rollouts, [3, 4], group_size=2, sample_seed=0)
    finally:
        rollouts.close()
    assert [t.seed for t in trajs] == [3, 3, 4, 4]
    np.testing.assert_array_equal(
        trajs[0].observations["agent_pos"][0], trajs[1].observations["agent_pos"][0]
    )
    assert not np.array_equal(trajs[0].actions, trajs[1].actions)  # stochastic within a group
    data = collect_decisions(trajs, np.array([1.0, -1.0, 0.5, -0.5]), policy.observation_spec)
    assert len(data) == sum(t.num_decisions for t in trajs) > 0
    log_prob = element_log_probs(policy, data, torch.device("cpu"))
    assert log_prob.shape == data.old_log_prob.shape
    assert check_ratio(log_prob, data, tolerance=1e-4) <= 1e-4
    torch.testing.assert_close(
        log_prob.sum(-1).detach(), data.sampled_log_prob, atol=1e-3, rtol=1e-5
    )
    # ...and the loss has gradients for the parameters
    loss, _ = grpo_loss(log_prob, data.old_log_prob, data.advantages, data.mask)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


@pytest.mark.parametrize(("kind", "size"), [("diffusion", 1), ("flow", 1), ("diffusion", 3)])
def test_step_blocks_recompute_exactly_the_chain_steps_they_keep(kind: str, size: int) -> None:
    """update_steps: each decision keeps one aligned block of ``size`` of its K recorded steps,
    every block as likely; the policy recomputes just those, ratio 1 before any update."""
    torch.manual_seed(0)
    policy = tiny_policies()[kind].fit_normalizers(STATS).eval()
    rollouts = LocalRollouts("Reach", {"image_size": 32, "max_episode_steps": 8}, policy, 2)
    try:
        trajs = rollout_groups(rollouts, [0], group_size=2, sample_seed=0)
    finally:
        rollouts.close()
    data = collect_decisions(trajs, np.array([1.0, -1.0]), policy.observation_spec)
    n, k = data.old_log_prob.shape
    assert k == policy.chain_steps == policy.config.finetune_steps
    rng = np.random.default_rng(0)
    cut = data.step_blocks(size, rng)
    assert cut.old_log_prob.shape == cut.mask.shape == (n, size)
    assert cut.outputs["chain"].shape[1] == size + 1
    log_prob = element_log_probs(policy, cut, torch.device("cpu"))
    assert check_ratio(log_prob, cut, tolerance=1e-4) <= 1e-4

    def starts(part: Decisions) -> list[int]:  # where each decision's kept block begins
        pairs = zip(data.old_log_prob, part.old_log_prob, strict=True)
        return [next(j for j in range(0, k, size) if torch.equal(row[j : j + size], kept))
                for row, kept in pairs]  # fmt: skip

    assert len(starts(cut)) == n
    torch.testing.assert_close(log_prob.detach(), cut.old_log_prob, atol=1e-4, rtol=0)
    # every aligned block is drawn about equally often over many minibatches
    draws = np.concatenate([starts(data.step_blocks(size, rng)) for _ in range(100)])
    counts = np.bincount(draws // size, minlength=k // size)
    assert counts.sum() == 100 * n and counts.min() > 100 * n / (k // size) * 0.7, counts


def test_step_blocks_are_refused_for_policies_without_a_chain_they_tile() -> None:
    from embodied.train.onpolicy import check_step_blocks

    policies = tiny_policies()
    check_step_blocks(policies["mlp"], 0)  # off: any policy
    check_step_blocks(policies["diffusion"], 3)
    with pytest.raises(ValueError, match="update_steps = 2 recomputes blocks of denoising steps; "
                       "the mlp policy samples no chain"):  # fmt: skip
        check_step_blocks(policies["mlp"], 2)
    with pytest.raises(ValueError, match="the vla policy samples no chain"):
        check_step_blocks(policies["vla"], 1)
    with pytest.raises(ValueError, match="update_steps = 2 must divide the policy's "
                       "finetune_steps = 3"):  # fmt: skip
        check_step_blocks(policies["diffusion"], 2)


def test_drifted_recomputation_stops_with_a_message() -> None:
    policy = tiny_policies()["mlp"].fit_normalizers(STATS).eval()
    rollouts = LocalRollouts("Reach", {"obs_mode": "state", "max_episode_steps": 5}, policy, 2)
    try:
        trajs = rollout_groups(rollouts, [0], group_size=2, sample_seed=0)
    finally:
        rollouts.close()
    data = collect_decisions(trajs, np.zeros(2), policy.observation_spec)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    with pytest.raises(RuntimeError, match="drifted from sampling"):
        check_ratio(element_log_probs(policy, data, torch.device("cpu")), data, 1e-3)


# --- the loop ---------------------------------------------------------------------------------


def test_the_monitor_tells_a_reward_that_never_tracked_from_one_that_fell() -> None:
    """A low correlation on the first rollouts is the reward model not fitting the policy's
    episodes, not the policy exploiting it; a fall of the last five iterations' mean below the
    threshold (or 0.3 below the first five's) is said once, again only after a recovery; an
    iteration's noise around a low start says nothing."""

    def said(corrs: list[float], warn: float = 0.3) -> list[tuple[int, str]]:
        monitor = RewardMonitor(warn)
        return [(i, m) for i, c in enumerate(corrs) if (m := monitor.update(i, c))]

    ((i, first),) = said([0.28, 0.2, 0.31, 0.22, 0.27, 0.19, 0.25, 0.3])
    assert i == 0 and "is 0.28 on the first rollouts" in first and "fell" not in first
    assert said([0.9, float("nan"), 0.85, 0.92, 0.88]) == []
    # noise around the threshold, as in a real MT10 run: one iteration below it is not a fall
    assert said([0.39, 0.31, 0.33, 0.29, 0.35, 0.36, 0.32, 0.28, 0.34]) == []
    tracked, fallen = [0.9, 0.88, 0.92, 0.9, 0.9], [0.2] * 6
    ((i, fell),) = said(tracked + fallen)
    assert i == 7 and "fell to 0.48 over the last 5 iterations (first 0.90)" in fell
    assert [i for i, _ in said(tracked + fallen + [0.9] * 6 + fallen)] == [7, 19]

    # A run resumed mid-fall from its checkpoint's monitor state neither forgets its first
    # iterations nor says the fall again.
    corrs = tracked + fallen + [0.9] * 6 + fallen
    before = RewardMonitor(0.3)
    for i, c in enumerate(corrs[:9]):
        before.update(i, c)
    after = RewardMonitor(0.3, state=json.loads(json.dumps(before.state())))
    assert [i for i, c in enumerate(corrs) if i >= 9 and after.update(i, c)] == [19]
