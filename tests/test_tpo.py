"""TPO: the trajectory DPO loss by hand, and the training loop."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.policies import Policy, make_policy
from embodied.rewards.models import SuccessOnly
from embodied.train.onpolicy import checked_env, env_kwargs
from embodied.train.tpo import TPOConfig, per_trajectory, probe_env, tpo_loss, train_tpo

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_tpo_loss_by_hand() -> None:
    beta = 0.5
    lw, rw, ll, rl = [-3.0, -1.0], [-3.5, -1.0], [-2.0, -4.0], [-1.0, -4.5]
    loss, stats = tpo_loss(*(torch.tensor(x) for x in (lw, rw, ll, rl)), beta=beta)
    margins = [beta * ((a - b) - (c - d)) for a, b, c, d in zip(lw, rw, ll, rl, strict=True)]
    want = np.mean([-math.log(1 / (1 + math.exp(-m))) for m in margins])
    assert loss.item() == pytest.approx(want)
    assert stats["accuracy"] == 0.5 and stats["reward_margin"] == pytest.approx(np.mean(margins))
    # At the reference the loss is log 2 whatever the trajectories.
    same, _ = tpo_loss(torch.tensor(lw), torch.tensor(lw), torch.tensor(ll), torch.tensor(ll), 1.0)
    assert same.item() == pytest.approx(math.log(2))
    # RPO: plus sft_weight times the winners' mean negative log-likelihood.
    rpo, stats = tpo_loss(*(torch.tensor(x) for x in (lw, rw, ll, rl)), beta=beta, sft_weight=0.3)
    assert rpo.item() == pytest.approx(want + 0.3 * 2.0) and stats["winner_nll"] == 2.0


def test_trajectory_log_prob_sum_and_length_normalised_mean_by_hand() -> None:
    """log pi(tau) sums the unmasked elements of a trajectory's decisions; ``normalize`` divides
    by their count (length-normalised DPO), so trajectories of different lengths compare."""
    from types import SimpleNamespace

    values = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -4.0, -5.0], [-6.0, -7.0, -8.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    batch = SimpleNamespace(mask=mask, trajectory=torch.tensor([1, 1, 0]))
    sums = per_trajectory(values, batch, 3)
    assert sums.tolist() == [-6.0, -15.0, 0.0]
    means = per_trajectory(values, batch, 3, normalize=True)
    assert means.tolist() == [-6.0, -3.0, 0.0]  # (-1-2-3-4-5) / 5 elements; none for the third


def _save_policy(path: Path) -> None:
    """A tiny Gaussian MLP policy for Reach's state observations, saved at ``path``."""
    torch.manual_seed(0)
    stats = {
        "observation.state": {"mean": np.zeros(4), "std": np.full(4, 0.1)},
        "observation.environment_state": {"mean": np.zeros(39), "std": np.ones(39)},
        "action": {"min": -np.ones(4), "max": np.ones(4)},
    }
    policy = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=39, hidden=[32])
    policy.fit_normalizers(stats).save_pretrained(path)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_tpo_trains_and_logs(tmp_path: Path, length_normalize: bool) -> None:
    _save_policy(tmp_path / "policy")
    cfg = TPOConfig(
        policy=str(tmp_path / "policy"), task="Reach", rounds=2, groups=2, group_size=3,
        eval_episodes=2, eval_every=1, out=str(tmp_path), device="cpu", pairs="all",
        length_normalize=length_normalize,
    )  # fmt: skip
    cfg.optim.lr = 1e-3
    run = train_tpo(cfg)
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in rows if "update/loss" in r]
    assert [r["step"] for r in rounds] == [1, 2]
    first = rounds[0]
    assert first["update/first_ratio_error"] < 1e-4
    assert first["rank/pairs"] > 0 and "eval/Reach/collisions" in first
    # The first round's first minibatch starts at the reference: loss log 2 on average.
    assert 0.0 < first["update/loss"] < 1.0
    from safetensors.torch import load_file

    before = load_file(str(tmp_path / "policy" / "model.safetensors"))
    after = load_file(str(run.path / "policy" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match="config key 'objective' = 'speed': expected one of"):
        train_tpo(TPOConfig(policy=str(tmp_path / "policy"), objective="speed"))
    with pytest.raises(ValueError, match="sft_weight"):
        train_tpo(TPOConfig(policy=str(tmp_path / "policy"), sft_weight=-1.0))


def test_tpo_trains_one_policy_on_several_tasks(tmp_path: Path) -> None:
    """tasks=[Reach, Push]: the groups take the tasks in turn, each task's rollouts and held-out
    success are logged, its pairs come from its own groups, and the one policy is updated."""
    _save_policy(tmp_path / "policy")
    cfg = TPOConfig(
        policy=str(tmp_path / "policy"), tasks=["Reach", "Push"], rounds=1, groups=4,
        group_size=3, eval_episodes=2, out=str(tmp_path), device="cpu", pairs="all",
        objective="efficiency", env={"max_episode_steps": 12},
    )  # fmt: skip
    cfg.optim.lr = 1e-3
    run = train_tpo(cfg)
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    row = rows[-1]
    for task in ("Reach", "Push"):
        assert 0.0 <= row[f"rollout/{task}/success_rate"] <= 1.0
        assert f"eval/{task}/success_rate" in row
    assert row["rank/Reach/pairs"] + row["rank/Push/pairs"] == row["rank/pairs"] > 0
    assert row["rollout/mean_length"] <= 12  # the run's env options reach every task's envs
    from safetensors.torch import load_file

    before = load_file(str(tmp_path / "policy" / "model.safetensors"))
    after = load_file(str(run.path / "policy" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_round_without_pairs_skips_its_update_quietly(tmp_path: Path) -> None:
    """A round whose groups give no pair (every score within ``margin``) takes no step, but its
    place in the schedule passes, without torch's warning about a schedule step before any
    optimiser step reaching the user."""
    import warnings

    _save_policy(tmp_path / "policy")
    cfg = TPOConfig(
        policy=str(tmp_path / "policy"), task="Reach", rounds=1, groups=2, group_size=2,
        eval_episodes=0, out=str(tmp_path), device="cpu", margin=100.0,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = train_tpo(cfg)
    (row,) = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert row["rank/pairs"] == 0 and row["update/skipped"] == 1.0
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]


def test_the_steps_term_divides_by_the_runs_step_limit(tmp_path: Path) -> None:
    """The ``steps`` score term divides a length by the env's limit as the run sets it
    (``env.max_episode_steps``), where it read the task's default; Meta-World, which enforces its
    own limit, has one too (it had none: every episode scored 1). A term the env's info cannot
    give (Meta-World has no ``goal_pos`` for ``keypoints``) is refused before any rollout."""
    _save_policy(tmp_path / "policy")
    policy = Policy.from_pretrained(tmp_path / "policy")

    def probe(task: str, extra: dict) -> tuple[int | None, set[str]]:
        with checked_env(policy, task, env_kwargs(task, policy, SuccessOnly(), extra)) as env:
            return probe_env(env)

    assert probe("Reach", {})[0] == 80
    limit, info = probe("Reach", {"max_episode_steps": 12})
    assert limit == 12 and {"ee_pos", "goal_pos", "collisions"} <= info
    pytest.importorskip("metaworld")
    assert probe("metaworld/reach-v3", {})[0] == 500
    limit, info = probe("metaworld/reach-v3", {"max_episode_steps": 200})
    assert limit == 200 and "ee_pos" in info and "goal_pos" not in info
    cfg = TPOConfig(policy=str(tmp_path / "policy"), task="metaworld/reach-v3",
                    out=str(tmp_path / "runs"), device="cpu")  # fmt: skip
    message = (
        r"metaworld/reach-v3 \(objective='success'\) cannot give score terms \['keypoints'\]: its "
        r"info has no \['goal_pos'\]; set their weights to 0 \(score_weights.keypoints=0\)"
    )
    with pytest.raises(ValueError, match=message):
        train_tpo(cfg)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("length_normalize", [False, True])
def test_tpo_round_starts_at_the_reference_and_moves_winners_up(
    tmp_path: Path, length_normalize: bool
) -> None:
    """One minibatch per epoch, two epochs: the first sits exactly at the round's reference (each
    trajectory's recomputed log pi(tau) against its own sampling log-prob: margin 0, loss log 2);
    the second, after one update, ranks every winner above its loser."""
    _save_policy(tmp_path / "policy")
    cfg = TPOConfig(
        policy=str(tmp_path / "policy"), task="Reach", rounds=1, groups=2, group_size=3,
        eval_episodes=0, out=str(tmp_path), device="cpu", pairs="all", epochs=2,
        pairs_per_batch=100, length_normalize=length_normalize,
    )  # fmt: skip
    cfg.optim.lr = 1e-3
    run = train_tpo(cfg)
    (row,) = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert row["rank/pairs"] > 0
    # Means over the two minibatches: (0 + m2) / 2 with m2 > 0, (0 + 1) / 2 of pairs ranked right.
    assert row["update/reward_margin"] > 0 and row["update/accuracy"] == 0.5
    assert math.log(2) / 2 < row["update/loss"] < math.log(2)


def test_max_minutes_ends_an_onpolicy_run_after_the_round_that_fits(tmp_path: Path) -> None:
    """Under a budget shorter than one round, the first round runs, the second is the last (a
    third would end past it), and it is saved and the policy written as at a schedule's end."""
    _save_policy(tmp_path / "policy")
    cfg = TPOConfig(
        policy=str(tmp_path / "policy"), task="Reach", rounds=10**6, groups=2, group_size=3,
        eval_episodes=0, save_every=10**6, out=str(tmp_path), device="cpu", pairs="all",
        max_minutes=0.001,
    )  # fmt: skip
    run = train_tpo(cfg)
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert [p.name for p in (run.path / "checkpoints").iterdir()] == ["step-0000002"]
    assert (run.path / "policy" / "model.safetensors").is_file()


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_tpo_resumes_exactly(tmp_path: Path, backend: str) -> None:
    """Killed after round 1 and resumed from its checkpoint, a run ends with the uninterrupted
    run's weights; with Ray the workers must roll round 2 out with the resumed weights, not the
    starting ones."""
    from safetensors.torch import load_file

    if backend == "ray":
        ray = pytest.importorskip("ray")
    _save_policy(tmp_path / "policy")

    def cfg(out: Path, resume: str = "") -> TPOConfig:
        c = TPOConfig(
            policy=str(tmp_path / "policy"), task="Reach", rounds=2, groups=2, group_size=3,
            eval_episodes=0, save_every=1, out=str(out), device="cpu", pairs="all",
            resume=resume,
        )  # fmt: skip
        c.optim.lr = 1e-2  # large enough that round 1's update changes round 2's rollouts
        c.distributed.backend = backend
        c.distributed.workers, c.distributed.envs_per_worker, c.distributed.num_cpus = 2, 3, 2
        return c

    try:
        run = train_tpo(cfg(tmp_path / "full"))
        part = tmp_path / "part"
        shutil.copytree(run.path, part)
        shutil.rmtree(part / "checkpoints" / "step-0000002")
        shutil.rmtree(part / "policy")
        resumed = train_tpo(cfg(tmp_path / "unused", resume=str(part)))
    finally:
        if backend == "ray":
            ray.shutdown()
    assert resumed.path == part
    final = load_file(str(run.path / "policy" / "model.safetensors"))
    again = load_file(str(part / "policy" / "model.safetensors"))
    for key in final:
        torch.testing.assert_close(again[key], final[key], rtol=0, atol=0)
    rows = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    full = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/success_rate"] == full[-1]["rollout/success_rate"]
    assert rows[-1]["rank/score_mean"] == full[-1]["rank/score_mean"]


def test_shipped_config_loads_with_the_command_line_overrides() -> None:
    from embodied.apps.cli import build_parser
    from embodied.core.config import load_config

    config = Path(__file__).parents[1] / "configs" / "tpo_vla.yaml"
    args = build_parser().parse_args(["train", "tpo", str(config), "policy=p", "rounds=3"])
    cfg = load_config(TPOConfig, args.config, args.overrides)
    assert (cfg.policy, cfg.rounds, cfg.task, cfg.pairs) == ("p", 3, "Reach", "all")
    assert (cfg.beta, cfg.sft_weight, cfg.length_normalize) == (0.1, 0.05, False)
    assert cfg.policy_overrides == {"temperature": 0.7}
