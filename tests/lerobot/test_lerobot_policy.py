"""LeRobot's diffusion policy in the toolkit: ``lerobot-train`` trains one on a toolkit dataset,
the toolkit loads it, acts exactly as LeRobot does for the same observations and noise,
recomputes DPPO log-probs with gradients, evaluates and fine-tunes it, and LeRobot loads the
result back."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_helpers import (
    fine_tune,
    lerobot_actions,
    observations,
    save_lerobot_policy,
    tiny_progress_model,
)
from tiny_policies import unexecuted_rows_scored

from embodied.apps.cli import main
from embodied.datasets import LeRobotDataset
from embodied.policies import LeRobotPolicy, Policy

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRAIN_STEPS = 2


def lerobot_train(dataset: Path, out: Path, *options: str) -> str:
    """Run ``lerobot-train`` (diffusion, CPU, tiny) on a dataset; its log."""
    command = [
        sys.executable, "-P", "-m", "lerobot.scripts.lerobot_train",
        f"--dataset.repo_id=local/{dataset.name}", f"--dataset.root={dataset}",
        "--dataset.video_backend=pyav", "--policy.type=diffusion", "--policy.device=cpu",
        "--policy.push_to_hub=false", "--policy.pretrained_backbone_weights=null",
        "--policy.use_group_norm=true", "--policy.horizon=8", "--policy.n_action_steps=4",
        "--policy.down_dims=[16,32]", "--wandb.enable=false", f"--steps={TRAIN_STEPS}",
        "--batch_size=2", "--num_workers=0", f"--save_freq={TRAIN_STEPS}", "--log_freq=1",
        f"--output_dir={out}", *options,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=out.parent, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    return log


@pytest.fixture(scope="module")
def trained(toolkit_datasets, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A DDIM diffusion policy ``lerobot-train`` trained on the toolkit's camera + state dataset:
    its ``pretrained_model`` directory and the training log."""
    out = tmp_path_factory.mktemp("lerobot-train") / "run"
    log = lerobot_train(
        toolkit_datasets["video"], out,
        "--policy.noise_scheduler_type=DDIM", "--policy.num_inference_steps=5",
    )  # fmt: skip
    return out / f"checkpoints/{TRAIN_STEPS:06d}/pretrained_model", log


@pytest.fixture(scope="module")
def ddpm(toolkit_datasets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DDPM diffusion policy built and saved by LeRobot's own classes (state-only dataset,
    the environment state as its only other input)."""
    keys = ("observation.state", "observation.environment_state", "action")
    root = tmp_path_factory.mktemp("ddpm") / "policy"
    return save_lerobot_policy(
        toolkit_datasets["state-only"], keys, "diffusion", root, horizon=8, n_action_steps=4,
        down_dims=(16, 32), num_inference_steps=5, noise_scheduler_type="DDPM",
    )  # fmt: skip


def test_lerobot_train_trains_on_a_toolkit_dataset(trained) -> None:
    directory, log = trained
    losses = [float(x) for x in re.findall(r"loss:([0-9.]+)", log)]
    assert len(losses) == TRAIN_STEPS and all(np.isfinite(losses))
    for name in ("config.json", "model.safetensors", "policy_preprocessor.json"):
        assert (directory / name).is_file()
    config = json.loads((directory / "config.json").read_text())
    assert config["input_features"]["observation.image"]["shape"] == [3, 48, 48]


def test_scheduler_steps_are_diffusers_steps(trained, ddpm) -> None:
    for directory in (trained[0], ddpm):
        policy = Policy.from_pretrained(directory).eval()
        scheduler, steps = policy.model.diffusion.noise_scheduler, policy.chain.steps
        x = torch.randn(3, 8, 4)
        output = torch.randn(3, 8, 4)
        for t in scheduler.timesteps:
            t_batch = torch.full((3,), int(t))
            terms = steps.terms(output, x, t_batch)
            for eta in (0.0, 1.0) if steps.ddim else (0.0,):
                mean, sigma = steps.mean_std(terms, x, t_batch, eta)
                noise = torch.randn(3, 8, 4, generator=torch.Generator().manual_seed(int(t)))
                if steps.ddim:
                    theirs = scheduler.step(output, t, x, eta=eta, variance_noise=noise)
                else:
                    generator = torch.Generator().manual_seed(int(t))
                    theirs = scheduler.step(output, t, x, generator=generator)
                ours = mean + sigma * noise
                torch.testing.assert_close(ours, theirs.prev_sample, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("noise", ["zeros", "gaussian"])
def test_actions_match_lerobot_for_the_same_observations_and_noise(trained, noise: str) -> None:
    directory = trained[0]
    policy = Policy.from_pretrained(directory).eval()
    assert isinstance(policy, LeRobotPolicy) and policy.observation_spec.privileged
    obs = observations(policy, 3)
    shape = (3, 8, 4)
    x = torch.zeros(shape) if noise == "zeros" else torch.randn(shape)
    ours = policy.act(obs, ["open the drawer"] * 3, deterministic=True, initial_noise=x)
    torch.testing.assert_close(ours.actions, lerobot_actions(directory, obs, x))
    if noise == "zeros":  # what deterministic acting starts from
        plain = policy.act(obs, ["open the drawer"] * 3, deterministic=True)
        torch.testing.assert_close(plain.actions, ours.actions)


@pytest.mark.parametrize("which", ["ddim-images", "ddpm-state"])
def test_log_prob_recomputes_with_gradients(trained, ddpm, which: str) -> None:
    directory = trained[0] if which == "ddim-images" else ddpm
    policy = Policy.from_pretrained(directory).eval()
    obs = observations(policy, 4, seed=1)
    generators = [torch.Generator().manual_seed(i) for i in range(4)]
    out = policy.act(obs, ["task"] * 4, deterministic=False, generator=generators)
    k = policy.config.finetune_steps
    assert out.policy_outputs["chain"].shape == (4, k + 1, 8, 4)
    log_prob = policy.log_prob(obs, ["task"] * 4, out.policy_outputs)
    assert log_prob.shape == (4, policy.chain_steps) and log_prob.requires_grad
    worst = (log_prob.detach() - out.policy_outputs["log_probs"]).abs().max().item()
    assert worst <= 1e-4, worst
    torch.testing.assert_close(log_prob.detach().sum(1), out.log_prob, rtol=0, atol=1e-3)
    log_prob.sum().backward()
    networks = [policy.model.diffusion.unet]
    if which == "ddim-images":
        networks.append(policy.model.diffusion.rgb_encoder)
    for network in networks:  # gradients reach LeRobot's own network
        assert sum(p.grad.abs().sum() for p in network.parameters() if p.grad is not None) > 0
    with torch.no_grad():  # and the log-prob depends on its weights
        for p in policy.model.diffusion.unet.parameters():
            p.add_(0.01 * torch.randn_like(p))
        moved = policy.log_prob(obs, ["task"] * 4, out.policy_outputs)
    assert (moved - log_prob.detach()).abs().max() > 1e-3


@pytest.mark.parametrize("which", ["ddim-images", "ddpm-state"])
def test_explore_executed_scores_only_the_rows_lerobot_executes(trained, ddpm, which: str) -> None:
    """explore_executed: the noise and the log-prob cover the chunk rows LeRobot executes only
    (moving another row of the final chunk leaves the log-prob as it was; by default it moves)."""
    directory = trained[0] if which == "ddim-images" else ddpm
    policy = Policy.from_pretrained(directory).eval()
    obs = observations(policy, 4, seed=1)
    rows = policy.chain.executed_rows
    assert rows.stop - rows.start == policy.model.config.n_action_steps < 8  # rows left over
    for explore_executed in (True, False):
        settings = {**policy.config.__dict__, "explore_executed": explore_executed}
        sampler = LeRobotPolicy(policy.config.__class__(**settings))
        sampler.load_state_dict(policy.state_dict())
        scored = unexecuted_rows_scored(sampler.eval(), obs, ["task"] * 4, rows)
        assert scored != explore_executed


def test_init_noise_zero_samples_around_the_greedy_chain(trained) -> None:
    """With init_noise = 0 RL samples around the chain deterministic acting runs: with the steps'
    noise shrunk, sampled actions are the greedy ones; from LeRobot's N(0, I) start they are not."""
    policy = Policy.from_pretrained(trained[0]).eval()
    obs = observations(policy, 3, seed=2)
    greedy = policy.act(obs, ["t"] * 3, deterministic=True).actions
    for init_noise, close in ((0.0, True), (1.0, False)):
        settings = {**policy.config.__dict__, "min_std": 1e-5, "ddim_eta": 0.0}
        sampler = LeRobotPolicy(policy.config.__class__(**settings | {"init_noise": init_noise}))
        sampler.load_state_dict(policy.state_dict())
        sampled = sampler.eval().act(obs, ["t"] * 3, generator=torch.Generator().manual_seed(0))
        assert torch.allclose(sampled.actions, greedy, atol=1e-3) == close
    with pytest.raises(ValueError, match="init_noise >= 0"):
        policy.config.__class__(**{**policy.config.__dict__, "init_noise": -1.0})


def test_saved_in_lerobots_layout_and_loaded_both_ways(trained, tmp_path: Path) -> None:
    policy = Policy.from_pretrained(trained[0]).eval()
    settings = {**policy.config.__dict__, "min_std": 0.05, "init_noise": 0.0}
    tuned = LeRobotPolicy(policy.config.__class__(**settings))
    tuned.load_state_dict(policy.state_dict())
    with torch.no_grad():
        for p in tuned.model.diffusion.unet.parameters():
            p.add_(0.01)  # a "fine-tuned" policy
    saved = tuned.save_pretrained(tmp_path / "policy")
    names = {p.name for p in saved.iterdir()}
    assert {"config.json", "model.safetensors", "policy_preprocessor.json"} <= names
    assert {"policy_postprocessor.json", "embodied_finetuning.json"} <= names
    obs, x = observations(policy, 2, seed=3), torch.randn(2, 8, 4)
    ours = tuned.act(obs, ["t"] * 2, deterministic=True, initial_noise=x).actions
    torch.testing.assert_close(ours, lerobot_actions(saved, obs, x))  # LeRobot loads it
    again = Policy.from_pretrained(saved).eval()  # and the toolkit does
    assert again.config.min_std == 0.05 and again.config.init_noise == 0.0
    assert again.config.stats == tuned.config.stats
    torch.testing.assert_close(
        again.act(obs, ["t"] * 2, deterministic=True, initial_noise=x).actions, ours
    )


def test_bc_trains_a_lerobot_policy_that_lerobot_loads(toolkit_datasets, tmp_path: Path) -> None:
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    argv = ["train", "bc", str(CONFIGS / "bc_mlp.yaml"), "policy=lerobot",
            f"dataset={toolkit_datasets['state-only']}", f"out={tmp_path}", "steps=2",
            "batch_size=4", "n_obs_steps=2", "horizon=8", "eval_episodes=0", "save_every=2",
            "log_every=1", "policy_overrides.down_dims=[16,32]",
            "policy_overrides.n_action_steps=4"]  # fmt: skip
    assert main(argv) == 0
    saved = next(tmp_path.glob("*/policy"))
    ours = Policy.from_pretrained(saved)
    assert isinstance(ours, LeRobotPolicy) and ours.observation_spec.privileged  # no camera
    theirs = DiffusionPolicy.from_pretrained(saved)
    assert theirs.config.horizon == 8 and theirs.config.n_obs_steps == 2
    for key, value in ours.model.state_dict().items():
        assert torch.equal(theirs.state_dict()[key], value), key
    stats = LeRobotDataset(toolkit_datasets["state-only"]).stats["action"]
    np.testing.assert_allclose(ours.config.stats["action"]["max"], stats["max"], rtol=1e-6)


def test_eval_grpo_and_tpo_run_on_it_and_save_for_lerobot(ddpm, tmp_path: Path) -> None:
    """The commands on the (cheaper) state policy, on Reach (the shortest task; the policy's
    inputs fit every tabletop task); LeRobot then loads what each fine-tuning run saved."""

    directory = str(ddpm)
    assert main(["eval", "--policy", directory, "--tasks", "Reach", "--episodes", "2",
                 "--videos", "0", "--out", str(tmp_path / "eval")]) == 0  # fmt: skip
    results = json.loads(next((tmp_path / "eval").rglob("results.json")).read_text())
    assert "Reach" in json.dumps(results)
    tpo_config = tmp_path / "tpo.yaml"
    tpo_config.write_text("name: tpo-lerobot\nobjective: success\n")
    short = ["task=Reach", "groups=1", "group_size=2", "epochs=1", "eval_episodes=0",
             "save_every=1", f"policy={directory}", "policy_overrides.finetune_steps=2",
             "distributed.backend=local"]  # fmt: skip
    # An untrained progress model: its scores differ between rollouts, so the group has a signal
    # (the privileged stage progress of two rollouts of an untrained policy is 0 for both).
    tiny_progress_model(tmp_path / "reward", image_size=32)
    runs = {
        "grpo": ["train", "grpo", str(CONFIGS / "grpo_pickplace.yaml"), "iterations=1",
                 "keep_low=0.0", "keep_high=1.0", "max_refills=0", "reward=learned",
                 f"reward_model={tmp_path / 'reward'}", *short],
        "tpo": ["train", "tpo", str(tpo_config), "rounds=1", "pairs=all", "margin=0.0",
                "reward=privileged", *short],
    }  # fmt: skip
    saved = fine_tune(runs, tmp_path, Policy.from_pretrained(directory))
    for path in saved.values():
        assert json.loads((path / "embodied_finetuning.json").read_text())["finetune_steps"] == 2
