"""LeRobot's SmolVLA in the toolkit, built offline on a tiny local SmolVLM: the toolkit loads what
LeRobot saved, acts exactly as LeRobot does for the same observations, instructions and noise,
recomputes ReinFlow log-probs with gradients, trains it by BC, fine-tunes it with GRPO, and
LeRobot loads each result back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lerobot_helpers import (
    assert_lerobot_loads,
    fine_tune,
    lerobot_actions,
    observations,
    save_lerobot_policy,
    tiny_progress_model,
    tiny_smolvlm,
)

from embodied.apps.cli import main
from embodied.policies import LeRobotPolicy, Policy

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TASKS = ["pick up the red block", "open the drawer", "push the green block", "reach the plate"]
WORDS = sorted({word for task in TASKS for word in task.split()})  # the tiny tokenizer's vocabulary
SMALL = {  # a SmolVLA small enough for a CPU test, on the tiny VLM
    "num_vlm_layers": 2, "chunk_size": 8, "n_action_steps": 4, "num_steps": 4,
    "resize_imgs_with_padding": (64, 64), "tokenizer_max_length": 16,
}  # fmt: skip


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_smolvlm(tmp_path_factory.mktemp("vlm") / "smolvlm", WORDS)


@pytest.fixture(scope="module")
def smolvla(toolkit_datasets, vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SmolVLA built and saved by LeRobot's own classes for the toolkit's camera + state
    dataset (48 px front camera, agent_pos), with the dataset's statistics."""
    keys = ("observation.image", "observation.state", "action")
    root = tmp_path_factory.mktemp("smolvla") / "policy"
    return save_lerobot_policy(
        toolkit_datasets["video"], keys, "smolvla", root, vlm_model_name=str(vlm), **SMALL
    )


def test_it_reads_cameras_state_and_the_instruction_only(smolvla: Path) -> None:
    policy = Policy.from_pretrained(smolvla).eval()
    assert isinstance(policy, LeRobotPolicy) and not policy.observation_spec.privileged
    assert dict(policy.observation_spec.cameras) == {"observation.image": (48, 48)}
    assert policy.action_spec.chunk == 4 and policy.bc_horizon == 8
    obs = observations(policy, 2)
    a = policy.act(obs, [TASKS[0]] * 2, deterministic=True).actions
    b = policy.act(obs, [TASKS[1]] * 2, deterministic=True).actions
    assert (a - b).abs().max() > 1e-4  # the instruction reaches the actions


@pytest.mark.parametrize("noise", ["zeros", "gaussian"])
def test_actions_match_lerobot_for_the_same_inputs_and_noise(smolvla: Path, noise: str) -> None:
    policy = Policy.from_pretrained(smolvla).eval()
    obs, tasks = observations(policy, 3), TASKS[:3]
    shape = (3, 8, 32)  # LeRobot's padded chunk: chunk_size x max_action_dim
    x = torch.zeros(shape) if noise == "zeros" else torch.randn(shape)
    ours = policy.act(obs, tasks, deterministic=True, initial_noise=x).actions
    theirs = lerobot_actions(smolvla, obs, x, tasks)
    assert theirs.shape == (3, 8, 4) and ours.shape == (3, 4, 4)
    torch.testing.assert_close(ours, theirs[:, :4])
    if noise == "zeros":  # what deterministic acting starts from
        plain = policy.act(obs, tasks, deterministic=True).actions
        torch.testing.assert_close(plain, ours)


def test_log_prob_recomputes_with_gradients(smolvla: Path) -> None:
    policy = Policy.from_pretrained(smolvla).eval()
    obs, tasks = observations(policy, 4, seed=1), TASKS
    generators = [torch.Generator().manual_seed(i) for i in range(4)]
    out = policy.act(obs, tasks, deterministic=False, generator=generators)
    chain = out.policy_outputs["chain"]
    assert chain.shape == (4, 5, 8, 32) and out.policy_outputs["taus"].shape == (4, 4)
    log_prob = policy.log_prob(obs, tasks, out.policy_outputs)
    assert log_prob.shape == (4, 4) and log_prob.requires_grad
    worst = (log_prob.detach() - out.policy_outputs["log_probs"]).abs().max().item()
    assert worst <= 1e-4, worst
    log_prob.sum().backward()
    expert = policy.model.model.vlm_with_expert.lm_expert
    for network in (expert, policy.model.model.action_out_proj, policy.model.model.state_proj):
        assert sum(p.grad.abs().sum() for p in network.parameters() if p.grad is not None) > 0
    with torch.no_grad():  # and the log-prob depends on the expert's weights
        for p in expert.parameters():
            p.add_(0.01 * torch.randn_like(p))
        moved = policy.log_prob(obs, tasks, out.policy_outputs)
    assert (moved - log_prob.detach()).abs().max() > 1e-3


@pytest.mark.parametrize("explore_executed", [False, True])
def test_noise_moves_the_action_values_only(smolvla: Path, explore_executed: bool) -> None:
    """Each recorded step adds noise to the action's 4 values; the padding is the expert's Euler
    mean exactly (so it adds nothing to the log-density). With explore_executed the noise is on
    the 4 rows of the 8-row chunk a decision executes only."""
    policy = Policy.from_pretrained(smolvla).eval()
    settings = {**policy.config.__dict__, "explore_executed": explore_executed}
    policy = LeRobotPolicy(policy.config.__class__(**settings)).eval()
    policy.load_state_dict(Policy.from_pretrained(smolvla).state_dict())
    obs = observations(policy, 2, seed=4)
    out = policy.act(obs, TASKS[:2], generator=torch.Generator().manual_seed(0))
    chain, taus = out.policy_outputs["chain"], out.policy_outputs["taus"]
    noisy_rows = slice(0, 4) if explore_executed else slice(0, 8)
    with torch.no_grad():
        context = policy.chain.context(policy.lerobot_batch(obs, TASKS[:2]))
        for k in range(taus.shape[1]):
            mean = policy.chain.gaussian_step(chain[:, k], taus[:, k], context).mean
            noise = (chain[:, k + 1] - mean) / policy.config.min_std
            action = noise[:, noisy_rows, :4]
            assert 0.5 < action.std() < 2.0  # N(0, 1) draws on the action values
            noise[:, noisy_rows, :4] = 0
            torch.testing.assert_close(noise, torch.zeros_like(noise))  # the rest: the mean


def test_saved_in_lerobots_layout_and_loaded_both_ways(smolvla: Path, tmp_path: Path) -> None:
    policy = Policy.from_pretrained(smolvla).eval()
    tuned = LeRobotPolicy(policy.config.__class__(**{**policy.config.__dict__, "min_std": 0.05}))
    tuned.load_state_dict(policy.state_dict())
    with torch.no_grad():
        for p in tuned.model.model.action_out_proj.parameters():
            p.add_(0.01)  # a "fine-tuned" policy
    saved = tuned.save_pretrained(tmp_path / "policy")
    assert json.loads((saved / "config.json").read_text())["type"] == "smolvla"
    obs, x = observations(policy, 2, seed=3), torch.randn(2, 8, 32)
    ours = tuned.act(obs, TASKS[:2], deterministic=True, initial_noise=x).actions
    torch.testing.assert_close(ours, lerobot_actions(saved, obs, x, TASKS[:2])[:, :4])
    again = Policy.from_pretrained(saved).eval()
    assert again.config.min_std == 0.05
    torch.testing.assert_close(
        again.act(obs, TASKS[:2], deterministic=True, initial_noise=x).actions, ours
    )


def test_a_missing_vlm_is_an_error_naming_it(smolvla: Path, tmp_path: Path) -> None:
    moved = tmp_path / "policy"
    moved.mkdir()
    for path in smolvla.iterdir():
        (moved / path.name).write_bytes(path.read_bytes())
    config = json.loads((moved / "config.json").read_text())
    config["vlm_model_name"] = str(tmp_path / "no-such-vlm")
    (moved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="cannot load its VLM .*no-such-vlm"):
        Policy.from_pretrained(moved)


def test_other_lerobot_types_are_refused_naming_the_supported_ones() -> None:
    from embodied.policies import LeRobotPolicyConfig

    with pytest.raises(
        ValueError, match="'pi0' is not supported here; supported: diffusion, smolvla"
    ):
        LeRobotPolicyConfig(lerobot={"type": "pi0"})


def test_bc_eval_grpo_and_tpo_and_lerobot_loads_each(toolkit_datasets, vlm, tmp_path) -> None:
    """``embodied train bc ... policy=lerobot policy_overrides.type=smolvla`` on the toolkit's
    camera dataset, ``embodied eval`` on Reach from its camera, then one GRPO and one TPO round;
    LeRobot loads what each saved."""

    overrides = [f"policy_overrides.{k}={list(v) if isinstance(v, tuple) else v}"
                 for k, v in SMALL.items() if k != "chunk_size"]  # fmt: skip
    argv = ["train", "bc", str(CONFIGS / "bc_mlp.yaml"), "policy=lerobot",
            f"dataset={toolkit_datasets['video']}", f"out={tmp_path / 'bc'}", "steps=2",
            "batch_size=2", "n_obs_steps=1", "horizon=8", "eval_episodes=0", "save_every=2",
            "log_every=1", "policy_overrides.type=smolvla",
            f"policy_overrides.vlm_model_name={vlm}", *overrides]  # fmt: skip
    assert main(argv) == 0
    bc = next((tmp_path / "bc").glob("*/policy"))
    ours = Policy.from_pretrained(bc)
    assert isinstance(ours, LeRobotPolicy) and ours.lerobot_config.type == "smolvla"
    assert ours.bc_horizon == 8 and not ours.observation_spec.privileged
    assert main(["eval", "--policy", str(bc), "--tasks", "Reach", "--episodes", "2",
                 "--videos", "0", "--out", str(tmp_path / "eval")]) == 0  # fmt: skip
    results = json.loads(next((tmp_path / "eval").rglob("results.json")).read_text())
    assert "Reach" in json.dumps(results)
    tiny_progress_model(tmp_path / "reward", image_size=48)
    (tmp_path / "tpo.yaml").write_text("name: tpo-smolvla\nobjective: success\n")
    short = ["task=Reach", "groups=1", "group_size=2", "epochs=1", "eval_episodes=0",
             "save_every=1", f"policy={bc}", "policy_overrides.finetune_steps=2",
             "distributed.backend=local"]  # fmt: skip
    runs = {
        "grpo": ["train", "grpo", str(CONFIGS / "grpo_pickplace.yaml"), "iterations=1",
                 "keep_low=0.0", "keep_high=1.0", "max_refills=0", "reward=learned",
                 f"reward_model={tmp_path / 'reward'}", *short],
        "tpo": ["train", "tpo", str(tmp_path / "tpo.yaml"), "rounds=1", "pairs=all",
                "margin=0.0", "reward=learned", f"reward_model={tmp_path / 'reward'}", *short],
    }  # fmt: skip
    fine_tune(runs, tmp_path, ours)
    assert_lerobot_loads(bc, ours)  # and what BC saved
