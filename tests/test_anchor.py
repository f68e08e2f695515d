"""The on-policy BC anchor (GRPO and TPO): each update also fits expert windows, so the policy is
pulled to the demonstrations (which a plain run never sees); bad anchor settings are refused by
name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.apps.collect import CollectConfig, run_collect
from embodied.core.nn import build_vocab
from embodied.core.run import read_metrics
from embodied.datasets import LeRobotDataset
from embodied.policies import Policy, make_policy
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.train.anchor import DemoAnchor
from embodied.train.grpo import GRPOConfig, train_grpo
from embodied.train.tpo import TPOConfig, train_tpo

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

STATS = {
    "observation.state": {"mean": np.zeros(4), "std": np.full(4, 0.1)},
    "observation.environment_state": {"mean": np.zeros(39), "std": np.ones(39)},
    "action": {"min": -np.ones(4), "max": np.ones(4), "q01": -np.ones(4), "q99": np.ones(4)},
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wide-sampling state policy that never saw a demo, a reward model, and Reach demos."""
    root = tmp_path_factory.mktemp("anchor")
    torch.manual_seed(0)
    policy = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=39, hidden=[32],
                         init_log_std=0.5)  # fmt: skip
    policy.fit_normalizers(STATS).save_pretrained(root / "policy")
    ProgressRewardModel(
        ProgressConfig(image_size=16, vocab=build_vocab(["reach the red block"]),
                       vision_channels=[4, 8], num_keypoints=4, d_model=16, n_heads=2,
                       n_layers=1, ff_dim=32, num_bins=8)
    ).save_pretrained(root / "reward")  # fmt: skip
    run_collect(CollectConfig(task="Reach", episodes=4, out=str(root / "demos"), obs_mode="state"))
    return {"policy": root / "policy", "reward": root / "reward", "demos": root / "demos"}


def _cfg(saved: dict[str, Path], out: Path, **overrides) -> GRPOConfig:
    values = dict(
        policy=str(saved["policy"]), task="Reach", reward="learned",
        reward_model=str(saved["reward"]), iterations=2, groups=2, group_size=3, keep_low=0.0,
        keep_high=1.0, epochs=2, minibatch_size=16, eval_episodes=0, save_every=1,
        out=str(out), device="cpu",
    )  # fmt: skip
    cfg = GRPOConfig(**{**values, **overrides})
    cfg.optim.lr = 1e-3
    return cfg


def _tpo_cfg(saved: dict[str, Path], out: Path, **overrides) -> TPOConfig:
    """Two rounds of every-pair trajectory DPO on Reach (privileged progress ranks the groups), a
    step per pair."""
    values = dict(
        policy=str(saved["policy"]), task="Reach", rounds=2, groups=2, group_size=3, pairs="all",
        length_normalize=True, pairs_per_batch=1, epochs=10, eval_episodes=0, save_every=1,
        out=str(out), device="cpu",
    )  # fmt: skip
    cfg = TPOConfig(**{**values, **overrides})
    cfg.optim.lr = 1e-3
    return cfg


# each trainer: its config, its entry point, and a metric its update rows carry
TRAINERS = {
    "grpo": (_cfg, train_grpo, "update/policy_loss"),
    "tpo": (_tpo_cfg, train_tpo, "update/loss"),
}


def _demo_loss(policy_dir: Path, demos: Path) -> float:
    """The policy's BC loss on a fixed set of 256 demo windows."""
    policy = Policy.from_pretrained(policy_dir)
    anchor = DemoAnchor(str(demos), policy, batch_size=256)
    with torch.no_grad():
        return float(anchor.loss(policy, np.random.default_rng(7)))


@pytest.mark.parametrize("algorithm", sorted(TRAINERS))
def test_the_anchor_pulls_the_policy_to_the_demonstrations(
    saved, tmp_path: Path, algorithm: str
) -> None:
    make_cfg, train, update_key = TRAINERS[algorithm]
    plain = train(make_cfg(saved, tmp_path / "plain"))
    anchored = train(make_cfg(saved, tmp_path / "anchored", anchor_dataset=str(saved["demos"]),
                              anchor_coef=100.0))  # fmt: skip
    rows = [r for r in read_metrics(anchored.path / "metrics.jsonl") if update_key in r]
    assert len(rows) == 2 and all(np.isfinite(r["update/anchor_loss"]) for r in rows)
    assert all("update/anchor_loss" not in r for r in read_metrics(plain.path / "metrics.jsonl"))
    start = _demo_loss(saved["policy"], saved["demos"])
    after_plain = _demo_loss(plain.path / "policy", saved["demos"])
    after_anchored = _demo_loss(anchored.path / "policy", saved["demos"])
    # the demos' negative log-likelihood falls only where the update fitted them as it went
    assert after_anchored < start - 0.5
    assert after_anchored < after_plain - 0.3  # TPO ranking by progress on Reach moves it too


def test_the_anchor_can_read_only_the_first_demos_of_each_task(saved) -> None:
    """A policy trained on one demo per task (BC's ``episodes_per_task``) is anchored to those."""
    policy = Policy.from_pretrained(saved["policy"])
    every = DemoAnchor(str(saved["demos"]), policy, batch_size=4)
    first = DemoAnchor(str(saved["demos"]), policy, batch_size=4, episodes_per_task=1)
    lengths = LeRobotDataset(saved["demos"]).episode_lengths()
    assert len(lengths) == 4
    assert len(first.windows) == lengths[0] and len(every.windows) == sum(lengths)
    assert {episode for episode, _ in first.windows.index} == {0}


def test_bad_anchor_settings_are_refused_by_name(saved, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs both anchor_dataset and anchor_coef > 0; got "
                       "anchor_dataset='', anchor_coef=1.0"):  # fmt: skip
        train_grpo(_cfg(saved, tmp_path, anchor_coef=1.0))
    with pytest.raises(ValueError, match="anchor_dataset=.*, anchor_coef=0.0"):
        train_grpo(_cfg(saved, tmp_path, anchor_dataset=str(saved["demos"])))
    missing = tmp_path / "no-such-dataset"
    with pytest.raises(ValueError, match=f"anchor_dataset='{missing}': "):
        train_grpo(_cfg(saved, tmp_path / "runs", anchor_dataset=str(missing), anchor_coef=1.0))
    with pytest.raises(ValueError, match="anchor_episodes_per_task = 5, but .* has only 4 "
                       "episodes of task 'Reach'"):  # fmt: skip
        train_grpo(_cfg(saved, tmp_path / "runs", anchor_dataset=str(saved["demos"]),
                        anchor_coef=1.0, anchor_episodes_per_task=5))  # fmt: skip
    with pytest.raises(ValueError, match="anchor_episodes_per_task = 1 picks demos of the BC "):
        train_grpo(_cfg(saved, tmp_path / "runs", anchor_episodes_per_task=1))
    with pytest.raises(ValueError, match="needs both anchor_dataset and anchor_coef > 0"):
        train_tpo(_tpo_cfg(saved, tmp_path / "runs", anchor_coef=1.0))
    with pytest.raises(ValueError, match=f"anchor_dataset='{missing}': "):
        train_tpo(_tpo_cfg(saved, tmp_path / "runs", anchor_dataset=str(missing), anchor_coef=1.0))
    assert not (tmp_path / "runs").exists()  # refused before the run directory is made
    # demos the policy cannot read: a 2-D state policy against Reach's 4-D state
    narrow = make_policy("mlp", state_dim=2, action_dim=4, env_state_dim=39, hidden=[8])
    narrow.fit_normalizers({**STATS, "observation.state": {"mean": np.zeros(2),
                                                           "std": np.ones(2)}})  # fmt: skip
    with pytest.raises(ValueError, match=f"anchor_dataset='{saved['demos']}': "):
        DemoAnchor(str(saved["demos"]), narrow, batch_size=4)
