"""Behaviour cloning end to end: learning, exact resume, the diffusion planner on pixels, NaN."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from embodied.apps.collect import CollectConfig, run_collect
from embodied.core.config import validate
from embodied.core.run import read_metrics
from embodied.datasets import LeRobotDataset
from embodied.policies import Policy
from embodied.train.bc import BCConfig, first_episodes_per_task, train_bc
from embodied.train.checkpoints import latest_checkpoint
from embodied.train.optim import OptimConfig, make_optimizer


@pytest.fixture(scope="module")
def drawer_states(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Expert DrawerOpen demos, state only (one goal: the MLP needs no language)."""
    root = tmp_path_factory.mktemp("bc") / "drawer"
    run_collect(CollectConfig(task="DrawerOpen", episodes=12, out=str(root), obs_mode="state"))
    return root


def _mlp_config(dataset: Path, out: Path, **overrides) -> BCConfig:
    values = dict(
        dataset=str(dataset),
        out=str(out),
        policy="mlp",
        n_obs_steps=1,
        horizon=1,
        batch_size=128,
        steps=800,
        eval_every=800,
        eval_episodes=10,
        save_every=400,
    )
    cfg = BCConfig(**{**values, **overrides})
    cfg.optim.lr, cfg.optim.warmup_steps = 1e-3, 50
    return cfg


def test_mlp_bc_learns_to_open_the_drawer(drawer_states: Path, tmp_path: Path) -> None:
    run = train_bc(_mlp_config(drawer_states, tmp_path))
    metrics = read_metrics(run.path / "metrics.jsonl")
    losses = [m["bc/loss"] for m in metrics if "bc/loss" in m]
    assert losses[-1] < losses[0] - 1.0  # the negative log-likelihood falls
    success = [m for m in metrics if "eval/DrawerOpen/success_rate" in m][-1]
    assert success["eval/DrawerOpen/success_rate"] >= 0.3  # a random policy never opens it
    policy = Policy.from_pretrained(run.path / "policy")
    assert policy.policy_type == "mlp"


def test_episodes_per_task_keeps_the_first_episodes_of_each_task(
    drawer_states: Path, tmp_path: Path
) -> None:
    dataset = LeRobotDataset(drawer_states)
    assert first_episodes_per_task(dataset, 0) is None  # every episode
    assert first_episodes_per_task(dataset, 5) == [0, 1, 2, 3, 4]
    rows = [{"episode_index": i, "tasks": [task]} for i, task in enumerate("ABABBA")]
    mixed = SimpleNamespace(root="mixed", episodes_table=lambda: rows)
    assert first_episodes_per_task(mixed, 2) == [0, 1, 2, 3]  # A: 0, 2; B: 1, 3
    # The policy is normalised by the statistics of the episodes it trains on, not the dataset's.
    run = train_bc(_mlp_config(drawer_states, tmp_path / "five", steps=1, eval_episodes=0,
                               episodes_per_task=5))  # fmt: skip
    states = np.concatenate([dataset.episode_frames(e)["observation.state"] for e in range(5)])
    policy = Policy.from_pretrained(run.path / "policy")
    np.testing.assert_allclose(policy.state_normalizer.shift, states.mean(0), atol=1e-5)
    whole = dataset.stats["observation.state"]["mean"]
    assert not np.allclose(policy.state_normalizer.shift, whole)
    cfg = _mlp_config(drawer_states, tmp_path, steps=1, eval_episodes=0, episodes_per_task=13)
    with pytest.raises(ValueError, match=r"episodes_per_task = 13, but .*drawer has only 12 "):
        train_bc(cfg)


def test_resume_continues_exactly(drawer_states: Path, tmp_path: Path) -> None:
    cfg = _mlp_config(drawer_states, tmp_path / "a", steps=20, save_every=10, eval_episodes=0)
    full = train_bc(cfg)
    # A run stopped after its step-10 checkpoint, then resumed: the same final weights.
    stopped = tmp_path / "b"
    shutil.copytree(full.path, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-0000020")
    shutil.rmtree(stopped / "policy")
    assert latest_checkpoint(stopped / "checkpoints").name == "step-0000010"
    resumed = train_bc(
        _mlp_config(
            drawer_states,
            tmp_path / "unused",
            steps=20,
            save_every=10,
            eval_episodes=0,
            resume=str(stopped),
        )
    )
    assert resumed.path == stopped
    a = Policy.from_pretrained(full.path / "policy").state_dict()
    b = Policy.from_pretrained(stopped / "policy").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_finished_run_extends_under_a_constant_schedule(
    drawer_states: Path, tmp_path: Path
) -> None:
    """Resumed with more ``steps``, a finished constant-schedule run ends with the weights of a run
    that was that long from the start, and records its new length; under a cosine schedule (its
    learning rate depends on the length) the change is refused, naming why."""

    def config(out: Path, steps: int, schedule: str = "constant", **overrides) -> BCConfig:
        cfg = _mlp_config(drawer_states, out, steps=steps, save_every=10, eval_episodes=0,
                          **overrides)  # fmt: skip
        cfg.optim.schedule = schedule
        return cfg

    full = train_bc(config(tmp_path / "a", 20))
    short = train_bc(config(tmp_path / "b", 10))
    extended = train_bc(config(tmp_path / "unused", 20, resume=str(short.path)))
    assert extended.path == short.path
    a = Policy.from_pretrained(full.path / "policy").state_dict()
    b = Policy.from_pretrained(short.path / "policy").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert "steps: 20" in (short.path / "config.yaml").read_text().splitlines()
    with pytest.raises(ValueError, match=r"has a checkpoint at step 20, past steps=10"):
        train_bc(config(tmp_path / "unused", 10, resume=str(short.path)))
    cosine = train_bc(config(tmp_path / "c", 10, "cosine"))
    with pytest.raises(ValueError, match=r"steps \(10 -> 20\) \(steps may change only under "):
        train_bc(config(tmp_path / "unused", 20, "cosine", resume=str(cosine.path)))


def test_init_policy_continues_a_saved_policy_on_other_data(
    drawer_states: Path, tmp_path: Path
) -> None:
    """``init_policy``: training starts from the saved policy's weights and keeps its
    normalisation, though the new data (noisy, DAgger-like) has other statistics; a policy of
    another type than ``policy`` names is refused."""
    first = train_bc(_mlp_config(drawer_states, tmp_path / "a", steps=20, eval_episodes=0))
    noisy = tmp_path / "noisy"
    run_collect(CollectConfig(task="DrawerOpen", episodes=3, out=str(noisy), obs_mode="state",
                              noise=0.5, seed=50))  # fmt: skip
    saved = first.path / "policy"
    cfg = _mlp_config(noisy, tmp_path / "b", steps=3, eval_episodes=0, init_policy=str(saved))
    cfg.optim.lr, cfg.optim.weight_decay = 0.0, 0.0  # no update: the result is the start
    again = train_bc(cfg)
    a = Policy.from_pretrained(saved).state_dict()
    b = Policy.from_pretrained(again.path / "policy").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    fresh = train_bc(_mlp_config(noisy, tmp_path / "c", steps=1, eval_episodes=0))
    c = Policy.from_pretrained(fresh.path / "policy").state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a if "normal" in k)  # other data, other stats
    with pytest.raises(ValueError, match="is a 'mlp' policy, but policy = 'diffusion'"):
        train_bc(_mlp_config(noisy, tmp_path / "d", policy="diffusion", init_policy=str(saved)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_checkpoint_restores_the_gpu_generator(tmp_path: Path) -> None:
    """Diffusion BC draws its training noise from the GPU's generator: a run resumed from a
    checkpoint must draw what the uninterrupted run drew next."""
    from test_policy_base import small_policy

    from embodied.train.checkpoints import load_checkpoint, save_checkpoint

    policy = small_policy().to("cuda")
    optimizer, scheduler = make_optimizer(policy.parameters(), OptimConfig(), 10)
    torch.cuda.manual_seed(3)
    torch.randn(4, device="cuda")
    saved = save_checkpoint(tmp_path, 1, policy, optimizer, scheduler)
    uninterrupted = torch.randn(4, device="cuda")
    torch.randn(4, device="cuda")  # the generator moves on, as a killed run's did
    load_checkpoint(saved, policy, optimizer, scheduler)
    assert torch.equal(torch.randn(4, device="cuda"), uninterrupted)


def test_diffusion_bc_on_pixels_runs_evaluates_and_saves(tmp_path: Path) -> None:
    root = tmp_path / "buttons"
    run_collect(CollectConfig(task="ButtonPress", episodes=2, out=str(root), image_size=32))
    tiny = {
        "down_dims": [16, 32],
        "vision_channels": [8, 16],
        "num_keypoints": 8,
        "embed_dim": 16,
        "n_action_steps": 4,
        "num_inference_steps": 3,
    }
    cfg = BCConfig(
        dataset=str(root),
        out=str(tmp_path),
        horizon=8,
        steps=6,
        batch_size=4,
        eval_every=6,
        eval_episodes=1,
        save_every=6,
        policy_overrides=tiny,
    )
    run = train_bc(cfg)
    metrics = read_metrics(run.path / "metrics.jsonl")
    assert any("eval/ButtonPress/success_rate" in m for m in metrics)
    policy = Policy.from_pretrained(run.path / "policy")
    assert policy.config.image_keys == ["observation.image"] and policy.config.image_size == 32
    # The vocabulary covers the dataset's instructions and the names of its state's objects.
    from embodied.core.nn import build_vocab
    from embodied.datasets import LeRobotDataset

    dataset = LeRobotDataset(root)
    names = dataset.features["observation.environment_state"]["names"]
    assert policy.config.env_state_names == names and "block_red.x" in names
    objects = [name.split(".")[0] for name in names]  # block_red -> "block", "red"
    assert policy.config.vocab == build_vocab([*dataset.tasks, *objects])
    assert "button" in policy.config.vocab and "drawer" in policy.config.vocab


def test_nan_loss_stops_with_the_step_and_keeps_the_checkpoint(
    drawer_states: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embodied.policies.mlp import MLPPolicy

    real = MLPPolicy.bc_loss
    calls = {"n": 0}

    def flaky(self, batch):
        calls["n"] += 1
        loss = real(self, batch)
        return loss * float("nan") if calls["n"] == 13 else loss

    monkeypatch.setattr(MLPPolicy, "bc_loss", flaky)
    cfg = _mlp_config(drawer_states, tmp_path, steps=30, save_every=10, eval_episodes=0)
    with pytest.raises(FloatingPointError, match="non-finite BC loss at step 12.*step-0000010"):
        train_bc(cfg)


def test_evaluating_a_policy_of_another_action_size_names_both_shapes() -> None:
    from embodied.evaluation.suite import evaluate_policy
    from embodied.policies import MLPConfig, MLPPolicy

    policy = MLPPolicy(MLPConfig(state_dim=4, action_dim=7))
    with pytest.raises(ValueError, match="outputs 7-D actions, Reach takes 4-D"):
        evaluate_policy(policy, "Reach", 1, 0, {"obs_mode": "state"})


def test_learning_rate_schedules_warm_up_then_decay_or_hold() -> None:
    """Cosine ends at 0 on the last step; constant holds lr after the warm-up; a typo is named."""

    def rates(schedule: str) -> list[float]:
        param = torch.nn.Parameter(torch.zeros(1))
        cfg = OptimConfig(lr=1e-3, warmup_steps=2, schedule=schedule)
        optimizer, scheduler = make_optimizer([param], cfg, total_steps=6)
        seen = []
        for _ in range(7):
            seen.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return seen

    assert rates("constant") == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    cosine = rates("cosine")
    assert cosine[:3] == pytest.approx([5e-4, 1e-3, 1e-3])
    assert cosine[4] == pytest.approx(5e-4) and cosine[6] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="'schedule' = 'cosin': expected one of"):
        validate(OptimConfig(schedule="cosin"))


def test_max_minutes_ends_the_run_at_a_step_it_logs_evaluates_and_saves(
    drawer_states: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A time budget stops a run of far more steps than fit in it; the step it stops at gets the
    log, the evaluation and the checkpoint of a schedule's end, and the policy is saved."""
    big = 10**7
    cfg = _mlp_config(drawer_states, tmp_path, steps=big, max_minutes=0.02, log_every=big,
                      eval_every=big, eval_episodes=2, save_every=big)  # fmt: skip
    run = train_bc(cfg)
    end = int(latest_checkpoint(run.path / "checkpoints").name.removeprefix("step-"))
    assert 2 <= end < big
    assert f"max_minutes=0.02: stopped after step {end} of {big}" in capsys.readouterr().err
    metrics = read_metrics(run.path / "metrics.jsonl")
    assert {m["step"] for m in metrics if "bc/loss" in m} == {end}
    assert [m["step"] for m in metrics if "eval/DrawerOpen/success_rate" in m] == [end]
    assert Policy.from_pretrained(run.path / "policy").policy_type == "mlp"
    with pytest.raises(ValueError, match="max_minutes"):
        train_bc(_mlp_config(drawer_states, tmp_path, max_minutes=-1.0))


def test_save_every_zero_checkpoints_only_at_the_end(drawer_states: Path, tmp_path: Path) -> None:
    """``save_every=0``: no periodic checkpoints, one at the run's end (where a resume starts)."""
    run = train_bc(_mlp_config(drawer_states, tmp_path, steps=6, eval_episodes=0, save_every=0))
    assert [p.name for p in (run.path / "checkpoints").iterdir()] == ["step-0000006"]
