"""GRPO's formulas against hand computation: group advantages, the clipped surrogate under every
loss aggregation, asymmetric clipping and the k3 KL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embodied.train.grpo import group_advantages, grpo_loss, holder_mean, kl_k3


# --- formulas, by hand ------------------------------------------------------------------------
def test_group_advantages_by_hand() -> None:
    returns = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 6.0])
    adv = group_advantages(returns, group_size=4, eps=0.0)
    # group 1: mean 0.5, population std 0.5; group 2: mean 3, std sqrt(3)
    np.testing.assert_allclose(adv[:4], [1, -1, -1, 1])
    s = math.sqrt((1 + 1 + 1 + 9) / 4)
    np.testing.assert_allclose(adv[4:], [-1 / s, -1 / s, -1 / s, 3 / s])
    np.testing.assert_allclose(group_advantages(np.ones(4), 4), 0.0)  # no variance: no signal


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_scaled_as_trl_by_hand(scale: str) -> None:
    """A success against failures and an all-fail group ranked by slivers of progress: scaled by
    its group's std the sliver weighs as much as the success; by the batch's std, or unscaled, it
    weighs what it is."""
    returns = np.array([1.0, 0.0, 0.0, 0.0, 0.02, 0.0, 0.0, 0.0])
    adv = group_advantages(returns, group_size=4, eps=0.0, scale=scale)
    centred = np.array([0.75, -0.25, -0.25, -0.25, 0.015, -0.005, -0.005, -0.005])
    divisor = {
        "group": np.repeat([math.sqrt(0.1875), math.sqrt(0.1875) * 0.02], 4),
        "batch": np.std(returns),
        "none": 1.0,
    }[scale]
    np.testing.assert_allclose(adv, centred / divisor)
    sliver = 1.0 if scale == "group" else 0.02  # its weight against the success's
    assert adv[4] / adv[0] == pytest.approx(sliver)


def _by_hand(logp, old, adv, mask, lo, hi, agg, p=1.0):
    """The clipped objective element by element with Python floats."""
    per_seq, elements = [], []
    for n in range(len(logp)):
        terms, ratios = [], []
        for k in range(len(logp[n])):
            if not mask[n][k]:
                continue
            r = math.exp(logp[n][k] - old[n][k])
            ratios.append(r)
            terms.append(-min(r * adv[n], min(max(r, 1 - lo), 1 + hi) * adv[n]))
        elements += terms
        if agg == "holder":
            m = (
                math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                if p == 0
                else (sum(r**p for r in ratios) / len(ratios)) ** (1 / p)
            )
            per_seq.append(-min(m * adv[n], min(max(m, 1 - lo), 1 + hi) * adv[n]))
        else:
            per_seq.append(sum(terms) / len(terms))
    if agg == "token-mean":
        return sum(elements) / len(elements)
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize(
    ("agg", "p"),
    [("token-mean", 1.0), ("seq-mean-token-mean", 1.0), ("holder", 1.0), ("holder", 0.0),
     ("holder", -2.0)],
)  # fmt: skip
def test_grpo_loss_matches_hand_computation(agg: str, p: float) -> None:
    logp = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.1], [-2.0, -0.7, -0.9]]
    old = [[-1.1, -0.2, -2.0], [-0.3, -1.0, -0.6], [-1.5, -0.7, -1.0]]
    adv = [1.5, -0.8, 0.4]
    mask = [[1, 1, 1], [1, 1, 0], [1, 0, 1]]
    loss, stats = grpo_loss(
        torch.tensor(logp), torch.tensor(old), torch.tensor(adv), torch.tensor(mask),
        0.2, 0.28, agg, p,
    )  # fmt: skip
    assert loss.item() == pytest.approx(_by_hand(logp, old, adv, mask, 0.2, 0.28, agg, p), 1e-6)
    if agg != "holder":  # elements whose ratio left [0.8, 1.28]
        ratios = [math.exp(a - b) for la, lo, m in zip(logp, old, mask, strict=True)
                  for a, b, k in zip(la, lo, m, strict=True) if k]  # fmt: skip
        outside = sum(not 0.8 <= r <= 1.28 for r in ratios) / len(ratios)
        assert stats["clip_fraction"] == pytest.approx(outside) and outside > 0


def test_traj_mean_weighs_every_trajectory_equally_however_long() -> None:
    """Two rollouts of one group, advantages +1 (a 1-decision success) and -1 (a 3-decision
    timeout), ratio 1: token-mean pushes down on balance, traj-mean does not."""
    logp = torch.full((4, 2), -1.0)
    adv = torch.tensor([1.0, -1.0, -1.0, -1.0])
    mask = torch.ones(4, 2, dtype=torch.bool)
    owner = torch.tensor([0, 1, 1, 1])
    elements = torch.zeros(2).index_add(0, owner, mask.sum(-1).float())  # [2, 6]
    weights = 1.0 / elements[owner]
    token, _ = grpo_loss(logp, logp, adv, mask, agg="token-mean")
    traj, _ = grpo_loss(logp, logp, adv, mask, agg="traj-mean", weights=weights)
    assert token.item() == pytest.approx((-1 * 2 + 1 * 6) / 8)  # -mean(A) over 8 elements
    assert traj.item() == pytest.approx(0.0, abs=1e-6)  # each rollout's mean (-1, +1), then theirs
    # with the ratios off 1: each trajectory's clipped element mean, then the mean of the two
    new = logp + torch.tensor([[0.1, -0.1], [0.3, 0.0], [-0.3, 0.2], [0.0, 0.0]])
    loss, _ = grpo_loss(new, logp, adv, mask, agg="traj-mean", weights=weights)
    r = torch.exp(new - logp)
    first = -torch.minimum(r[0], r[0].clamp(0.8, 1.28)).mean()
    second = torch.maximum(r[1:], r[1:].clamp(0.8, 1.28)).mean()  # -min(-r, -clip) = max
    assert loss.item() == pytest.approx(((first + second) / 2).item(), rel=1e-5)
    with pytest.raises(ValueError, match="traj-mean"):
        grpo_loss(logp, logp, adv, mask, agg="traj-mean")


def test_asymmetric_clip_and_kl_by_hand() -> None:
    # One element, ratio e^0.5 = 1.65 with A > 0: clipped at 1 + clip_high = 1.28.
    one = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = grpo_loss(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.tensor([2.0]), one)
    assert loss.item() == pytest.approx(-1.28 * 2.0) and stats["clip_fraction"] == 1.0
    # ratio e^-0.5 = 0.61 with A < 0: clipped at 1 - clip_low = 0.8 (the min picks -0.8 * -1).
    loss, _ = grpo_loss(torch.tensor([[-0.5]]), torch.zeros(1, 1), torch.tensor([-1.0]), one)
    assert loss.item() == pytest.approx(0.8)
    # k3 = e^d - d - 1 with d = ref - new
    d = 0.3
    assert kl_k3(torch.tensor(-1.0), torch.tensor(-1.0 + d)).item() == pytest.approx(
        math.exp(d) - d - 1
    )
    assert kl_k3(torch.tensor(0.4), torch.tensor(0.4)).item() == 0.0
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.2, -1.5]])
    loss, stats = grpo_loss(
        logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_log_prob=ref, kl_coef=0.5
    )
    want = np.mean([math.exp(-0.2) + 0.2 - 1, math.exp(0.5) - 0.5 - 1])
    assert stats["kl"] == pytest.approx(want) and loss.item() == pytest.approx(0.5 * want)
    assert holder_mean(torch.tensor([[1.0, 4.0]]), torch.ones(1, 2), 0).item() == pytest.approx(2)


def test_sampling_kl_is_k3_from_the_sampling_policy_over_real_elements() -> None:
    """``sampling_kl`` (what ``target_kl`` reads): mean over real elements of rho - 1 - log rho,
    the k3 estimate of KL(pi_old || pi) from samples of pi_old; padding does not count."""
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    new = torch.tensor([[-0.7, -2.4, 5.0]])
    mask = torch.tensor([[True, True, False]])
    _, stats = grpo_loss(new, old, torch.tensor([1.0]), mask)
    want = np.mean([math.exp(r) - 1 - r for r in (0.3, -0.4)])
    assert stats["sampling_kl"] == pytest.approx(want)
    _, same = grpo_loss(old, old, torch.tensor([1.0]), mask)
    assert same["sampling_kl"] == 0.0
