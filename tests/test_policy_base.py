"""The policy interface through the Gaussian MLP baseline: act, log-probs, BC, save/load, errors."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.nn import Normalizer
from embodied.policies import (
    POLICIES,
    MLPConfig,
    MLPPolicy,
    Policy,
    make_policy,
)

STATE, ENV_STATE = "observation.state", "observation.environment_state"


def small_policy(**overrides: object) -> MLPPolicy:
    """A tiny MLP policy with non-trivial normalisation statistics."""
    config = {"state_dim": 3, "action_dim": 2, "hidden": [16, 16], **overrides}
    policy = make_policy("mlp", **config)
    stats = {
        STATE: {"mean": [0.5, -1.0, 2.0], "std": [2.0, 0.5, 1.0]},
        "action": {"min": [-0.5, -1.0], "max": [0.5, 1.0]},
    }
    if policy.config.env_state_dim:
        stats[ENV_STATE] = {"mean": np.zeros(policy.config.env_state_dim), "std": [3.0] * 4}
    return policy.fit_normalizers(stats)


def obs(batch: int = 5, n_obs: int = 1, dim: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random observation batch ``[B, n_obs, dim]``."""
    g = torch.Generator().manual_seed(seed)
    return {STATE: torch.randn(batch, n_obs, dim, generator=g)}


def test_act_shapes_and_clipping() -> None:
    policy = small_policy(init_log_std=1.0)
    out = policy.act(obs(batch=64, n_obs=2), ["pick"] * 64)
    assert out.actions.shape == (64, 1, 2)
    assert out.log_prob.shape == (64,)
    assert out.policy_outputs["sample"].shape == (64, 2)
    assert out.actions.abs().max() <= 1.0
    # With std e^1 in normalised space some samples leave the box: the record keeps them unclipped.
    raw = policy.action_normalizer.unnormalize(out.policy_outputs["sample"])
    assert raw.abs().max() > 1.0
    assert torch.equal(out.actions[:, 0], raw.clamp(-1, 1))
    # [B, D] observations (one env step) give the same deterministic action as [B, 1, D].
    o = obs(batch=4)
    a = policy.act(o, [], deterministic=True).actions
    b = policy.act({STATE: o[STATE][:, 0]}, [], deterministic=True).actions
    assert torch.equal(a, b)


def test_only_the_newest_observation_matters() -> None:
    policy = small_policy()
    o = obs(batch=4, n_obs=3)
    changed = o[STATE].clone()
    changed[:, :2] += 10.0
    a = policy.act(o, [], deterministic=True).actions
    b = policy.act({STATE: changed}, [], deterministic=True).actions
    assert torch.equal(a, b)


def test_recomputed_log_prob_matches_and_has_gradients() -> None:
    policy = small_policy()
    o = obs(batch=8, n_obs=2)
    out = policy.act(o, [], generator=torch.Generator().manual_seed(1))
    per_dim = policy.log_prob(o, [], out.policy_outputs)
    assert per_dim.shape == (8, 2)
    torch.testing.assert_close(per_dim.sum(-1), out.log_prob, atol=1e-5, rtol=0)
    # It is the exact Gaussian density of the recorded normalised sample.
    mean, log_std = policy.distribution(o)
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(
        out.policy_outputs["sample"]
    )
    torch.testing.assert_close(per_dim, expected, atol=1e-5, rtol=0)
    per_dim.sum().backward()
    assert policy.log_std.grad is not None and policy.log_std.grad.abs().sum() > 0
    for layer in (policy.mlp[0], policy.mlp[-1]):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_act_is_reproducible_with_a_generator() -> None:
    policy = small_policy()
    o = obs()
    a = policy.act(o, [], generator=torch.Generator().manual_seed(3)).actions
    b = policy.act(o, [], generator=torch.Generator().manual_seed(3)).actions
    c = policy.act(o, [], generator=torch.Generator().manual_seed(4)).actions
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_environment_state_is_used_when_configured() -> None:
    policy = small_policy(env_state_dim=4)
    o = obs(batch=3)
    with pytest.raises(ValueError, match="observation.environment_state"):
        policy.act(o, [])
    o[ENV_STATE] = torch.zeros(3, 1, 4)
    a = policy.act(o, [], deterministic=True).actions
    o[ENV_STATE] = torch.ones(3, 1, 4)
    assert not torch.equal(a, policy.act(o, [], deterministic=True).actions)
    with pytest.raises(ValueError, match="observation.environment_state"):
        policy.fit_normalizers({STATE: {"mean": [0] * 3, "std": [1] * 3}, "action": {}})


def bc_batch(n: int = 256, n_obs: int = 2, horizon: int = 4, seed: int = 0) -> dict:
    """Synthetic BCDataset-style windows: the action at the newest observation is ``W @ state``."""
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(n, n_obs, 3, generator=g) * torch.tensor([2.0, 0.5, 1.0]) + 1.0
    weights = torch.tensor([[0.3, -0.2], [0.4, 0.5], [-0.1, 0.2]])
    target = (state[:, -1] - 1.0) @ weights
    # Other horizon steps hold unrelated actions: a one-step policy must not fit them.
    action = torch.rand(n, horizon, 2, generator=g) * 2 - 1
    action[:, n_obs - 1] = target
    return {
        STATE: state,
        "action": action,
        "action_is_pad": torch.zeros(n, horizon, dtype=torch.bool),
        "instruction": ["push"] * n,
    }


def test_bc_loss_learns_a_linear_expert() -> None:
    torch.manual_seed(0)
    batch = bc_batch(n=128)
    target = batch["action"][:, 1]
    policy = make_policy("mlp", state_dim=3, action_dim=2, hidden=[32, 32])
    policy.fit_normalizers(
        {
            STATE: {"mean": batch[STATE].mean((0, 1)), "std": batch[STATE].std((0, 1))},
            "action": {"min": target.min(0).values, "max": target.max(0).values},
        }
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=5e-3)
    first = policy.bc_loss(batch).item()

    def act() -> torch.Tensor:
        return policy.act(batch, batch["instruction"], deterministic=True).actions[:, 0]

    first_error = (act() - target).abs().mean()
    for _ in range(200):
        loss = policy.bc_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first - 2.0
    error = (act() - target).abs().mean()
    assert error < 0.05 and error < first_error / 5


def test_bc_loss_masks_padded_targets() -> None:
    policy = small_policy()
    batch = bc_batch(n=8)
    batch["action_is_pad"][:4, 1] = True
    loss = policy.bc_loss(batch)
    batch["action"][:4, 1] += 100.0  # padded targets: no effect
    torch.testing.assert_close(policy.bc_loss(batch), loss)
    kept = {k: v[4:] for k, v in batch.items()}
    torch.testing.assert_close(policy.bc_loss(kept), loss)


ROUND_TRIP = """
import sys, numpy as np, torch
from embodied.policies import Policy
policy = Policy.from_pretrained(sys.argv[1])
obs = {"observation.state": torch.from_numpy(np.load(sys.argv[2]))}
out = policy.act(obs, [], generator=torch.Generator().manual_seed(7))
np.save(sys.argv[3], out.actions.numpy())
print(type(policy).__name__)
"""


def test_save_and_load_in_a_fresh_process(tmp_path: Path) -> None:
    policy = small_policy(env_state_dim=0)
    with torch.no_grad():
        policy.log_std.fill_(0.1)
        policy.mlp[-1].weight.normal_()
    policy.save_pretrained(tmp_path / "ckpt")
    o = obs(batch=6, n_obs=1)
    np.save(tmp_path / "obs.npy", o[STATE].numpy())
    result = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, str(tmp_path / "ckpt"), str(tmp_path / "obs.npy"),
         str(tmp_path / "actions.npy")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "MLPPolicy"
    expected = policy.act(o, [], generator=torch.Generator().manual_seed(7)).actions
    assert torch.equal(torch.from_numpy(np.load(tmp_path / "actions.npy")), expected)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["policy_type"] == "mlp" and config["hidden"] == [16, 16]


def edit_config(directory: Path, **changes: object) -> None:
    """Rewrite keys of a saved ``config.json``."""
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_from_pretrained_errors(tmp_path: Path) -> None:
    directory = small_policy().save_pretrained(tmp_path / "ckpt")
    (directory / "model.safetensors").rename(tmp_path / "weights")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        Policy.from_pretrained(directory)
    (tmp_path / "weights").rename(directory / "model.safetensors")

    edit_config(directory, policy_type="transformer9000")
    with pytest.raises(ValueError, match="transformer9000.*available: .*mlp"):
        Policy.from_pretrained(directory)

    edit_config(directory, policy_type="mlp", hiden=[16, 16])
    with pytest.raises(ValueError, match="hiden"):
        Policy.from_pretrained(directory)

    config = json.loads((directory / "config.json").read_text())
    del config["hiden"]
    config["hidden"] = [16, 32]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"weight 'mlp\.2\.bias' has shape \(16,\) .*\(32,\)"):
        Policy.from_pretrained(directory)

    with pytest.raises(FileNotFoundError, match="config.json"):
        MLPPolicy.from_pretrained(tmp_path / "nowhere")


def test_normalizer_round_trip_and_constant_dimensions() -> None:
    x = torch.tensor([[1.0, 5.0, -2.0], [3.0, 5.0, 4.0], [2.0, 5.0, 0.5]])
    mean_std = Normalizer(3).fit({"mean": x.mean(0), "std": x.std(0)})
    min_max = Normalizer(3, "min_max").fit({"min": x.min(0).values, "max": x.max(0).values})
    for normalizer in (mean_std, min_max):
        torch.testing.assert_close(normalizer.unnormalize(normalizer.normalize(x)), x)
        assert normalizer.scale[1] == 1.0  # constant dimension: shifted, not divided by ~0
        assert torch.equal(normalizer.normalize(x)[:, 1], torch.zeros(3))
    y = min_max.normalize(x)
    assert torch.equal(y[:, [0, 2]].min(0).values, torch.tensor([-1.0, -1.0]))
    assert torch.equal(y[:, [0, 2]].max(0).values, torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"shape \(2,\).*\(3,\)"):
        Normalizer(3).fit({"mean": [0.0, 0.0], "std": [1.0, 1.0]})


def test_make_policy_unknown_type_lists_available() -> None:
    assert POLICIES["mlp"] is MLPPolicy
    with pytest.raises(ValueError, match="'nope'.*available: .*mlp"):
        make_policy("nope", state_dim=3)
    policy = make_policy("mlp", MLPConfig(state_dim=2, action_dim=1))
    assert isinstance(policy, MLPPolicy) and policy.config.hidden == [256, 256]


def test_wrong_state_dim_names_both_shapes() -> None:
    policy = small_policy()
    with pytest.raises(ValueError, match=r"\(5, 1, 4\).*\[B, 3\]"):
        policy.act(obs(dim=4), [])
    with pytest.raises(ValueError, match=r"\(5, 1, 4\).*\[B, 3\]"):
        policy.bc_loss({**bc_batch(n=5), STATE: torch.zeros(5, 1, 4)})


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="action_dim"):
        MLPConfig(state_dim=3, action_dim=0)
    with pytest.raises(ValueError, match="init_log_std"):
        MLPConfig(state_dim=3, action_dim=1, init_log_std=3.0)


def test_config_from_dataset_features() -> None:
    features = {
        STATE: {"dtype": "float32", "shape": [4]},
        ENV_STATE: {"dtype": "float32", "shape": [9]},
        "action": {"dtype": "float32", "shape": [4]},
    }
    config = MLPPolicy.config_from_dataset(features, ["press"], horizon=16, n_obs_steps=2)
    assert (config.state_dim, config.env_state_dim, config.action_dim) == (4, 9, 4)
    assert config.n_obs_steps == 2
    assert MLPPolicy.config_from_dataset(features, env_state_dim=0).env_state_dim == 0
    with pytest.raises(ValueError, match="action"):
        MLPPolicy.config_from_dataset({STATE: features[STATE]})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["mlp", "test_diffusion", "test_flow", "test_vla"])
def test_cuda_policy_with_a_cpu_generator_samples_what_the_cpu_policy_samples(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rollouts seed CPU generators; a policy on the GPU must take them and draw the same noise
    (compared in full float32: cuDNN's default TF32 convolutions differ from the CPU's by ~1e-3)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    if kind == "mlp":
        policy, o, text = small_policy(), obs(batch=4), ["pick"] * 4
    else:  # the policy's own test module builds its tiny policy and observations
        helpers = importlib.import_module(kind)
        policy, o, text = helpers.tiny_policy(), helpers.observations(), helpers.INSTRUCTIONS
    cpu = policy.act(o, text, generator=torch.Generator().manual_seed(1))
    gpu = policy.to("cuda").act(o, text, generator=torch.Generator().manual_seed(1))
    assert gpu.actions.device.type == "cuda"
    torch.testing.assert_close(gpu.actions.cpu(), cpu.actions, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gpu.log_prob.cpu(), cpu.log_prob, atol=1e-3, rtol=1e-4)
