"""Flow-matching planner: shapes, Euler sampling, ReinFlow log-probabilities, BC, EMA, save/load."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from tiny_policies import unexecuted_rows_scored

from embodied.core.nn import build_vocab
from embodied.core.policy import Policy
from embodied.policies import FlowConfig, FlowPolicy, make_policy
from embodied.policies.diffusion import DiffusionPolicy
from embodied.policies.sampler import euler_step, gaussian_log_prob

INSTRUCTIONS = ["Pick the red cube", "open the drawer", "pick the BLUE cube", ""]
STATS = {
    "observation.state": {"mean": np.array([0.5, -1.0, 2.0]), "std": np.array([2.0, 0.5, 1.0])},
    "action": {"min": np.array([-2.0, 0.0]), "max": np.array([3.0, 0.5])},
}
LOW, HIGH = torch.tensor([-2.0, 0.0]), torch.tensor([3.0, 0.5])


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_config(**overrides) -> FlowConfig:
    """A policy small enough for CPU tests: one 32 px camera, horizon 8, 4 Euler steps."""
    values = dict(
        state_dim=3,
        action_dim=2,
        image_keys=["observation.image"],
        image_size=32,
        n_obs_steps=2,
        horizon=8,
        n_action_steps=4,
        vocab=build_vocab(INSTRUCTIONS[:2]),
        embed_dim=16,
        down_dims=[16, 32],
        vision_channels=[8, 16],
        num_keypoints=8,
        noise_hidden_dims=[32],
        num_inference_steps=4,
    )
    values.update(overrides)
    return FlowConfig(**values)


def tiny_policy(**overrides) -> FlowPolicy:
    torch.manual_seed(0)
    return FlowPolicy(tiny_config(**overrides)).fit_normalizers(STATS)


def observations(batch: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(batch, 2, 3, generator=g),
        "observation.image": torch.randint(0, 256, (batch, 2, 32, 32, 3), generator=g).to(
            torch.uint8
        ),
    }


def test_registered_and_built_by_name():
    policy = make_policy("flow", tiny_config())
    assert isinstance(policy, FlowPolicy) and isinstance(policy, DiffusionPolicy)
    assert policy.policy_type == "flow" and DiffusionPolicy.policy_type == "diffusion"
    assert not hasattr(policy, "alphas_cumprod")  # no DDPM machinery left to misuse
    assert policy.observation_spec.read_keys() == ["observation.image", "observation.state"]


def test_act_shapes_range_and_reproducibility():
    policy = tiny_policy()
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == (4, 4, 2)
    assert out.log_prob.shape == (4,) and torch.isfinite(out.log_prob).all()
    assert out.policy_outputs["chain"].shape == (4, 4 + 1, 8, 2)
    assert out.policy_outputs["taus"].tolist() == [[0.0, 0.25, 0.5, 0.75]] * 4
    torch.testing.assert_close(out.policy_outputs["log_probs"].sum(1), out.log_prob)
    assert ((out.actions >= LOW - 1e-6) & (out.actions <= HIGH + 1e-6)).all()
    # The executed slice starts at the newest observation: horizon index n_obs_steps - 1.
    executed = policy.action_normalizer.unnormalize(out.policy_outputs["chain"][:, -1, 1:5])
    torch.testing.assert_close(out.actions, executed.clamp(min=LOW, max=HIGH))

    same = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(1))
    other = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(same.actions, out.actions, rtol=0, atol=0)
    torch.testing.assert_close(same.policy_outputs, out.policy_outputs, rtol=0, atol=0)
    assert not torch.allclose(other.actions, out.actions)

    first = policy.act(obs, INSTRUCTIONS, deterministic=True)
    second = policy.act(
        obs, INSTRUCTIONS, deterministic=True, generator=torch.Generator().manual_seed(3)
    )
    torch.testing.assert_close(first.actions, second.actions, rtol=0, atol=0)
    assert (first.policy_outputs["chain"][:, 0] == 0).all()  # x_0 = 0


def test_state_only_policy_and_partial_finetuning():
    policy = tiny_policy(image_keys=[], finetune_steps=2)
    obs = {"observation.state": observations()["observation.state"]}
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
    assert out.actions.shape == (4, 4, 2)
    assert out.policy_outputs["chain"].shape == (4, 2 + 1, 8, 2)  # the last 2 of 4 steps
    assert out.policy_outputs["taus"].tolist() == [[0.5, 0.75]] * 4
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)


def test_euler_step_and_gaussian_log_density_by_hand():
    x = torch.tensor([[[0.5, -1.0], [2.0, 0.0]]])
    v = torch.tensor([[[1.0, 2.0], [-4.0, 0.5]]])
    torch.testing.assert_close(euler_step(x, v, 0.25), torch.tensor([[[0.75, -0.5], [1.0, 0.125]]]))
    sample = torch.tensor([[[0.7, -0.5], [1.2, 0.0]]])
    mean = torch.tensor([[[0.75, -0.5], [1.0, 0.125]]])
    std = torch.tensor([[[0.1, 0.2], [0.1, 0.25]]])
    entries = zip(*(t.flatten().tolist() for t in (sample, mean, std)), strict=True)
    by_hand = sum(
        -0.5 * ((s - m) / d) ** 2 - math.log(d) - 0.5 * math.log(2 * math.pi) for s, m, d in entries
    )
    ours = gaussian_log_prob(sample, mean, std)
    torch.testing.assert_close(ours, torch.tensor([by_hand]), rtol=1e-6, atol=1e-5)


def test_stochastic_chain_is_the_reinflow_markov_chain():
    """act's chain and log-probs, redone by hand from the generator's draws."""
    policy = tiny_policy(num_inference_steps=2)
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        cond = policy.global_cond(policy.model, obs, INSTRUCTIONS)
        x = torch.randn(4, 8, 2, generator=g)
        chain, log_probs = [x], []
        for tau in (0.0, 0.5):
            tau_b = torch.full((4,), tau)
            mean = x + 0.5 * policy.model.unet(x, tau_b * 1000.0, cond)
            std = policy.noise_std(x, tau_b, cond)
            assert ((std > 0.05) & (std < 0.25)).all()
            x = mean + std * torch.randn(4, 8, 2, generator=g)
            chain.append(x)
            log_probs.append(torch.distributions.Normal(mean, std).log_prob(x).sum((1, 2)))
    torch.testing.assert_close(out.policy_outputs["chain"], torch.stack(chain, 1))
    torch.testing.assert_close(out.policy_outputs["log_probs"], torch.stack(log_probs, 1))


def test_deterministic_sampler_matches_diffusers_flow_match_euler():
    """Our tau = 1 - sigma; diffusers' model output is d x / d sigma = -v."""
    policy = tiny_policy()
    obs = observations()
    cond = policy.global_cond(policy.model, obs, INSTRUCTIONS)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    scheduler.set_timesteps(sigmas=[1.0, 0.75, 0.5, 0.25])
    x = torch.zeros(4, 8, 2)
    with torch.no_grad():
        for t in scheduler.timesteps:
            v = policy.model.unet(x, (1000.0 - t).expand(4), cond)
            x = scheduler.step(-v, t, x).prev_sample
    out = policy.act(obs, INSTRUCTIONS, deterministic=True)
    torch.testing.assert_close(out.policy_outputs["chain"][:, -1], x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [1, 4])
def test_reinflow_log_prob_recomputes_and_has_gradients(steps: int):
    policy = tiny_policy(num_inference_steps=steps)
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    assert log_probs.shape == (4, steps)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    torch.testing.assert_close(log_probs.sum(1), out.log_prob, atol=1e-4, rtol=0)

    log_probs.sum().backward()
    model = policy.model
    for name, params in {
        "velocity unet": model.unet.parameters(),
        "image encoder": model.image_encoders.parameters(),
        "instruction embedding": model.instruction_encoder.parameters(),
        "noise net": policy.noise_net.parameters(),
    }.items():
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads), name
        assert sum(float(g.abs().sum()) for g in grads) > 0, name
    assert all(p.grad is None for p in policy.ema_model.parameters())


def test_log_prob_rejects_a_wrong_chain():
    policy = tiny_policy()
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS)
    bad = dict(out.policy_outputs, chain=out.policy_outputs["chain"][:, :, :4])
    with pytest.raises(ValueError, match=r"\(4, 5, 4, 2\).*\(4, 5, 8, 2\)"):
        policy.log_prob(obs, INSTRUCTIONS, bad)
    with pytest.raises(ValueError, match="taus"):
        policy.log_prob(obs, INSTRUCTIONS, {"chain": out.policy_outputs["chain"]})


def test_bc_loss_is_the_masked_velocity_mse():
    policy = tiny_policy()
    obs = observations()
    pad = torch.zeros(4, 8, dtype=torch.bool)
    pad[:, 6:] = True
    actions = torch.rand(4, 8, 2) * torch.tensor([5.0, 0.5]) + torch.tensor([-2.0, 0.0])
    batch = {**obs, "action": actions, "action_is_pad": pad, "instruction": INSTRUCTIONS}
    torch.manual_seed(5)
    loss = policy.bc_loss(batch)
    # By hand, drawing the same x_0 and tau: x_tau = (1 - tau) x_0 + tau x_1, v = x_1 - x_0.
    torch.manual_seed(5)
    x1 = policy.action_normalizer.normalize(actions)
    x0 = torch.randn_like(x1)
    tau = torch.rand(4)
    x_tau = (1 - tau.view(-1, 1, 1)) * x0 + tau.view(-1, 1, 1) * x1
    cond = policy.global_cond(policy.model, obs, INSTRUCTIONS)
    error = (policy.model.unet(x_tau, 1000.0 * tau, cond) - (x1 - x0)) ** 2
    torch.testing.assert_close(loss, error[:, :6].mean())
    loss.backward()
    assert all(p.grad is None for p in policy.noise_net.parameters())  # BC: velocity only


@pytest.mark.parametrize("kind", ["uniform", "beta", "logit_normal"])
def test_tau_sampling(kind: str):
    policy = tiny_policy(tau_sampling=kind)
    torch.manual_seed(0)
    tau = policy.sample_tau(20000)
    assert tau.shape == (20000,) and (tau >= 0).all() and (tau <= 1).all()
    # Means: U(0, 1) -> 1/2; pi0's 0.999 (1 - Beta(1.5, 1)) -> 0.999 * 0.4; sigmoid(N(0, 1)) -> 1/2.
    expected = {"uniform": 0.5, "beta": 0.999 * 0.4, "logit_normal": 0.5}[kind]
    assert abs(tau.mean().item() - expected) < 0.01


def test_bc_loss_decreases_and_actions_fit():
    torch.manual_seed(0)
    policy = FlowPolicy(tiny_config(image_keys=[]))
    g = torch.Generator().manual_seed(1)
    state = torch.rand(16, 2, 3, generator=g) * 2 - 1
    ramp = (torch.arange(8.0) / 8)[None, :, None]  # actions: a deterministic function of state
    actions = torch.tanh(1.5 * state[:, -1:, :2]) * (1 - ramp) + 0.5 * ramp * state[:, -1:, 2:]
    batch = {
        "observation.state": state,
        "action": actions,
        "action_is_pad": torch.zeros(16, 8, dtype=torch.bool),
        "instruction": ["push the block"] * 16,
    }
    flat_state, flat_action = state.reshape(-1, 3), actions.reshape(-1, 2)
    policy.fit_normalizers(
        {
            "observation.state": {"mean": flat_state.mean(0), "std": flat_state.std(0)},
            "action": {"min": flat_action.min(0).values, "max": flat_action.max(0).values},
        }
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss = policy.bc_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        policy.ema_update()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    target = actions[:, 1:5]
    spread = (target - target.mean(0)).abs().mean().item()  # error of the best constant
    predicted = policy.act(batch, batch["instruction"], deterministic=True).actions
    error = (predicted - target).abs().mean().item()
    assert error < 0.35 * spread, (error, spread)  # ~0.24 here
    policy.adopt_ema()  # what BC hands on: the averaged weights still fit
    predicted = policy.act(batch, batch["instruction"], deterministic=True).actions
    assert (predicted - target).abs().mean().item() < 0.35 * spread


def test_ema_update_weights_and_adopt():
    policy = tiny_policy()
    noise_before = {k: v.clone() for k, v in policy.noise_net.state_dict().items()}
    live, ema = policy.model.unet.final[1].bias, policy.ema_model.unet.final[1].bias
    before = ema.detach().clone()
    with torch.no_grad():
        live.add_(1.0)
    policy.ema_update()  # first update: decay = min(0.995, 1 / 10) = 0.1
    torch.testing.assert_close(ema, 0.1 * before + 0.9 * live.detach())
    obs = observations()
    with policy.ema_weights():
        with_ema = policy.act(obs, INSTRUCTIONS, deterministic=True).actions
    assert not policy.use_ema
    assert not torch.allclose(with_ema, policy.act(obs, INSTRUCTIONS, deterministic=True).actions)
    policy.adopt_ema()
    torch.testing.assert_close(live, ema, rtol=0, atol=0)
    torch.testing.assert_close(
        policy.act(obs, INSTRUCTIONS, deterministic=True).actions, with_ema, rtol=0, atol=0
    )
    torch.testing.assert_close(policy.noise_net.state_dict(), noise_before, rtol=0, atol=0)


def test_save_and_load_in_a_fresh_process(tmp_path: Path):
    policy = tiny_policy()
    with torch.no_grad():
        for p in [*policy.model.parameters(), *policy.noise_net.parameters()]:
            p.add_(0.01)  # EMA now differs from the live weights; noise net off its init
    policy.ema_update()
    directory = policy.save_pretrained(tmp_path / "policy")
    assert json.loads((directory / "config.json").read_text())["policy_type"] == "flow"
    obs = observations()
    np.savez(tmp_path / "obs.npz", **{k: v.numpy() for k, v in obs.items()})
    script = textwrap.dedent(
        f"""
        import numpy as np, torch
        torch.set_num_threads(1)
        import embodied.policies  # registers "flow"
        from embodied.core.policy import Policy
        policy = Policy.from_pretrained({str(directory)!r})
        obs = {{k: torch.from_numpy(v) for k, v in np.load({str(tmp_path / "obs.npz")!r}).items()}}
        out = policy.act(obs, {INSTRUCTIONS!r}, generator=torch.Generator().manual_seed(7))
        np.save({str(tmp_path / "actions.npy")!r}, out.actions.numpy())
        np.save({str(tmp_path / "log_prob.npy")!r}, out.log_prob.numpy())
        with policy.ema_weights():
            ema = policy.act(obs, {INSTRUCTIONS!r}, deterministic=True).actions
        np.save({str(tmp_path / "ema.npy")!r}, ema.numpy())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(7))
    np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), out.actions.numpy(), atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "log_prob.npy"), out.log_prob.numpy(), atol=1e-4)
    with policy.ema_weights():
        ema = policy.act(obs, INSTRUCTIONS, deterministic=True).actions
    np.testing.assert_allclose(np.load(tmp_path / "ema.npy"), ema.numpy(), atol=1e-6)

    loaded = Policy.from_pretrained(directory)
    assert isinstance(loaded, FlowPolicy) and loaded.config == policy.config


def test_config_from_dataset_gives_a_flow_config():
    features = {
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.image": {"dtype": "video", "shape": [32, 32, 3]},
        "action": {"dtype": "float32", "shape": [2]},
    }
    config = FlowPolicy.config_from_dataset(
        features, ["pick the cube"], horizon=8, n_action_steps=4, tau_sampling="beta"
    )
    assert isinstance(config, FlowConfig)
    assert (config.state_dim, config.action_dim, config.image_size) == (3, 2, 32)
    assert config.image_keys == ["observation.image"] and "cube" in config.vocab
    assert (config.horizon, config.n_action_steps, config.tau_sampling) == (8, 4, "beta")
    assert config.num_inference_steps == 4 and config.finetune_steps == 4


def test_config_validation():
    for field, overrides in {
        "max_std": dict(min_std=0.2, max_std=0.1, init_std=0.15),
        "init_std": dict(init_std=0.3),
        "tau_sampling": dict(tau_sampling="cosine"),
        "noise_hidden_dims": dict(noise_hidden_dims=[0]),
        "timestep_scale": dict(timestep_scale=0.0),
        "finetune_steps": dict(finetune_steps=5),
        "num_inference_steps": dict(num_inference_steps=0),
    }.items():
        with pytest.raises(ValueError, match=field):
            tiny_config(**overrides)
    assert json.loads(json.dumps(tiny_config().__dict__))["finetune_steps"] == 4


def test_explore_executed_noises_and_scores_only_the_executed_rows():
    """With explore_executed ReinFlow's noise and the log-prob cover only the rows the env
    executes (rows 1-4 of 8): the other rows are the Euler mean, the log-prob recomputes, and
    moving a row the env never executes leaves it unchanged (by default it changes it)."""
    obs = observations()
    for explore_executed in (True, False):
        torch.manual_seed(0)
        policy = tiny_policy(explore_executed=explore_executed, init_noise=0.0)
        assert unexecuted_rows_scored(policy, obs, INSTRUCTIONS) != explore_executed
    # each Gaussian step draws noise on the executed rows alone: std 0 elsewhere
    policy = tiny_policy(explore_executed=True)
    x, cond = torch.randn(4, 8, 2), torch.randn(4, policy.model.global_cond_dim)
    std = policy.gaussian_step(policy.model, x, torch.full((4,), 0.5), cond).std
    assert (std[:, 1:5] > 0).all() and (std[:, [0, 5, 6, 7]] == 0).all()
