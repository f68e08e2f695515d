"""Diffusion Policy planner: shapes, DPPO log-probabilities, BC training, save/load, bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler
from tiny_pixel_planner import tiny_diffusion_config
from tiny_policies import unexecuted_rows_scored

from embodied.core.nn import InstructionEncoder, build_vocab
from embodied.core.policy import Policy
from embodied.policies.diffusion import DiffusionConfig, DiffusionPolicy

INSTRUCTIONS = ["Pick the red cube", "open the drawer", "pick the BLUE cube", ""]
STATS = {
    "observation.state": {"mean": np.array([0.5, -1.0, 2.0]), "std": np.array([2.0, 0.5, 1.0])},
    "action": {"min": np.array([-2.0, 0.0]), "max": np.array([3.0, 0.5])},
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_config(**overrides) -> DiffusionConfig:
    """The tests' tiny planner (tests/tiny_pixel_planner.py) with these instructions' words."""
    return tiny_diffusion_config(**{"vocab": build_vocab(INSTRUCTIONS[:2]), **overrides})


def tiny_policy(**overrides) -> DiffusionPolicy:
    torch.manual_seed(0)
    return DiffusionPolicy(tiny_config(**overrides)).fit_normalizers(STATS)


def observations(batch: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(batch, 2, 3, generator=g),
        "observation.image": torch.randint(0, 256, (batch, 2, 32, 32, 3), generator=g).to(
            torch.uint8
        ),
    }


def test_act_shapes_range_and_reproducibility():
    policy = tiny_policy()
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == (4, 4, 2)
    assert out.log_prob.shape == (4,) and torch.isfinite(out.log_prob).all()
    assert out.policy_outputs["chain"].shape == (4, 3 + 1, 8, 2)
    assert out.policy_outputs["timesteps"].tolist() == [[8, 4, 0]] * 4  # last 3 of 16,12,8,4,0
    torch.testing.assert_close(out.policy_outputs["log_probs"].sum(1), out.log_prob)
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([3.0, 0.5])
    assert ((out.actions >= low - 1e-6) & (out.actions <= high + 1e-6)).all()
    # The executed slice starts at the newest observation: horizon index n_obs_steps - 1.
    executed = policy.action_normalizer.unnormalize(out.policy_outputs["chain"][:, -1, 1:5])
    torch.testing.assert_close(out.actions, executed.clamp(min=low, max=high))

    same = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(1))
    other = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(same.actions, out.actions, rtol=0, atol=0)
    assert not torch.allclose(other.actions, out.actions)
    first = policy.act(obs, INSTRUCTIONS, deterministic=True)
    second = policy.act(obs, INSTRUCTIONS, deterministic=True)
    torch.testing.assert_close(first.actions, second.actions, rtol=0, atol=0)


def test_state_only_policy_acts():
    policy = tiny_policy(image_keys=[], finetune_steps=None)
    obs = {"observation.state": observations()["observation.state"]}
    out = policy.act(obs, INSTRUCTIONS)
    assert out.actions.shape == (4, 4, 2)
    assert out.policy_outputs["chain"].shape == (4, 5 + 1, 8, 2)  # finetune_steps = all 5


def test_environment_state_and_conditioning_mlp_are_used():
    stats = {**STATS, "observation.environment_state": {"mean": np.zeros(5), "std": np.ones(5)}}
    torch.manual_seed(0)
    config = tiny_config(env_state_dim=5, cond_mlp_dims=[24])
    policy = DiffusionPolicy(config).fit_normalizers(stats)
    assert policy.observation_spec.read_keys() == [
        "observation.image",
        "observation.state",
        "observation.environment_state",
    ]
    assert policy.model.global_cond_dim == 24
    obs = observations()
    env_state = torch.randn(4, 2, 5, generator=torch.Generator().manual_seed(3))
    cond = policy.global_cond(
        policy.model, {**obs, "observation.environment_state": env_state}, INSTRUCTIONS
    )
    moved = policy.global_cond(
        policy.model, {**obs, "observation.environment_state": env_state + 1.0}, INSTRUCTIONS
    )
    assert cond.shape == (4, 24) and not torch.allclose(cond, moved)
    with pytest.raises(ValueError, match="observation.environment_state"):
        policy.act(obs, INSTRUCTIONS)  # the privileged state is missing
    with pytest.raises(ValueError, match="observation.environment_state"):
        DiffusionPolicy(config).fit_normalizers(STATS)


ENV_NAMES = [f"block_{c}.{q}" for c in ("red", "blue") for q in "xy"] + ["drawer.opening"]


@pytest.mark.parametrize("relative", [False, True])
def test_object_state_encoder_from_dataset_names(tmp_path: Path, relative: bool):
    """With value names in the dataset, ``env_state_encoder="objects"`` attends over per-object
    tokens keyed by the instruction (with ``object_relative``, also their offsets from the
    hand); it survives save/load; without names it is refused."""
    features = {
        "observation.state": {"shape": [3]},
        "action": {"shape": [2]},
        "observation.environment_state": {"shape": [5], "names": ENV_NAMES},
    }
    sizes = {k: getattr(tiny_config(), k) for k in ("embed_dim", "down_dims", "horizon")}
    config = DiffusionPolicy.config_from_dataset(
        features,
        ["reach the red block"],
        env_state_encoder="objects",
        object_relative=relative,
        n_action_steps=4,
        num_inference_steps=5,
        **sizes,
    )
    assert config.env_state_names == ENV_NAMES
    assert {"red", "blue", "block", "drawer", "reach"} <= set(config.vocab)  # names' words too
    stats = {**STATS, "observation.environment_state": {"mean": np.zeros(5), "std": np.ones(5)}}
    torch.manual_seed(0)
    policy = DiffusionPolicy(config).fit_normalizers(stats)
    assert policy.model.object_encoder is not None
    assert policy.model.object_encoder.tokens.relative is relative
    assert policy.model.global_cond_dim == 2 * (3 + 4 * 16) + 16  # n_obs * (D + K * E) + E
    g = torch.Generator().manual_seed(3)
    obs = {
        "observation.state": torch.randn(2, 2, 3, generator=g),
        "observation.environment_state": torch.randn(2, 2, 5, generator=g),
    }
    instructions = ["reach the red block", "reach the blue block"]
    cond = policy.global_cond(policy.model, obs, instructions)
    swapped = policy.global_cond(policy.model, obs, instructions[::-1])
    assert not torch.allclose(cond, swapped)  # the instruction steers what is read

    loaded = Policy.from_pretrained(policy.save_pretrained(tmp_path / "policy"))
    torch.testing.assert_close(
        loaded.act(obs, instructions, deterministic=True).actions,
        policy.act(obs, instructions, deterministic=True).actions,
    )
    with pytest.raises(ValueError, match="env_state_names has 0"):
        tiny_config(env_state_dim=5, env_state_encoder="objects")
    with pytest.raises(ValueError, match="env_state_encoder must be 'flat' or 'objects'"):
        tiny_config(env_state_encoder="graph")


def test_state_noise_only_perturbs_the_bc_loss():
    policy = tiny_policy(state_noise=0.5)
    obs = observations()
    batch = {
        **obs,
        "action": torch.zeros(4, 8, 2),
        "action_is_pad": torch.zeros(4, 8, dtype=torch.bool),
        "instruction": INSTRUCTIONS,
    }
    # Sampling and log-prob recomputation never see the augmentation (RL ratios stay exact) ...
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
    recomputed = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    torch.testing.assert_close(recomputed, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    # ... while the BC loss does: same diffusion noise, different state noise, different loss.
    losses = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        losses.append(policy.bc_loss(batch).item())
    clean = tiny_policy(state_noise=0.0)
    torch.manual_seed(0)
    assert losses[0] == losses[1] and losses[0] != clean.bc_loss(batch).item()
    with pytest.raises(ValueError, match="state_noise"):
        tiny_config(state_noise=-1.0)


def test_denoising_step_matches_diffusers_ddim():
    policy = tiny_policy()
    obs = observations()
    cond = policy.global_cond(policy.model, obs, INSTRUCTIONS)
    scheduler = DDIMScheduler(
        num_train_timesteps=20, beta_schedule="squaredcos_cap_v2", clip_sample=True
    )
    scheduler.set_timesteps(5)
    x = 1.5 * torch.randn(4, 8, 2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for t in scheduler.timesteps:
            eps = policy.model.unet(x, t.expand(4), cond)
            for eta in (0.0, 1.0):
                ours, sigma = policy.denoise_step(policy.model, x, t.expand(4), cond, eta=eta)
                theirs = scheduler.step(
                    eps, t, x, eta=eta, use_clipped_model_output=True,
                    variance_noise=torch.zeros_like(x),
                ).prev_sample  # fmt: skip
                torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
                expected_sigma = eta * scheduler._get_variance(t, t - 4).sqrt()
                torch.testing.assert_close(sigma[0, 0, 0], expected_sigma.float())


def test_dppo_log_prob_recomputes_and_has_gradients():
    policy = tiny_policy()
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    assert log_probs.shape == (4, 3)
    torch.testing.assert_close(log_probs.sum(1), out.log_prob, atol=1e-4, rtol=0)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)

    # The last step has DDIM sigma 0, so its std is the floor: its log-density is at most
    # -H*A*(log(min_std) + log(2 pi)/2) (x_prev = mean) and it is exactly Gaussian around the mean.
    bound = -16 * (np.log(0.1) + 0.5 * np.log(2 * np.pi))
    assert (out.policy_outputs["log_probs"][:, -1] <= bound + 1e-4).all()

    log_probs.sum().backward()
    model = policy.model
    for name, params in {
        "unet": model.unet.parameters(),
        "image encoder": model.image_encoders.parameters(),
        "instruction embedding": model.instruction_encoder.parameters(),
    }.items():
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads), name
        assert sum(float(g.abs().sum()) for g in grads) > 0, name
    assert all(p.grad is None for p in policy.ema_model.parameters())


def test_init_noise_zero_samples_around_the_greedy_chain():
    """RL with init_noise = 0 explores around (and trains) the chain greedy evaluation runs: the
    sampled chain starts at the deterministic chain's zeros, its log-probs still recompute, and
    with the steps' noise shrunk it gives the greedy actions; DPPO's N(0, I) start does not."""
    obs = observations()
    greedy = tiny_policy(min_std=1e-4).act(obs, INSTRUCTIONS, deterministic=True)
    first_tuned = greedy.policy_outputs["chain"][:, 0]  # after the noiseless steps from zeros
    for init_noise, close in ((0.0, True), (1.0, False)):
        policy = tiny_policy(min_std=1e-4, ddim_eta=0.0, init_noise=init_noise)
        out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
        assert torch.equal(out.policy_outputs["chain"][:, 0], first_tuned) == close
        assert torch.allclose(out.actions, greedy.actions, atol=1e-3) == close
        recomputed = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
        expected = out.policy_outputs["log_probs"]
        torch.testing.assert_close(recomputed, expected, atol=1e-2, rtol=1e-5)
    with pytest.raises(ValueError, match=r"init_noise=-0.5"):
        tiny_config(init_noise=-0.5)
    # an override the loader's schema does not type (policy_overrides.init_noise=abc)
    with pytest.raises(ValueError, match=r"DiffusionConfig.init_noise must be a number, got 'abc'"):
        tiny_config(init_noise="abc")
    # a flag given a word the loader does not read as a bool would otherwise count as true
    with pytest.raises(ValueError, match=r"DiffusionConfig.explore_executed must be true or false"):
        tiny_config(explore_executed="abc")


def test_explore_executed_scores_only_the_executed_rows():
    """With explore_executed the chain's noise and log-prob cover only the rows the env executes
    (rows 1-4 of 8 here): the rest are the noiseless update, the log-prob still recomputes, and
    moving a row the env never executes leaves it unchanged (by default it changes it)."""
    obs = observations()
    for explore_executed in (True, False):
        policy = tiny_policy(explore_executed=explore_executed, ddim_eta=0.0, init_noise=0.0)
        assert unexecuted_rows_scored(policy, obs, INSTRUCTIONS) != explore_executed
    # each step's log-density is Gaussian over the 4 executed rows x 2 action dims only: at most
    # -8 * (log(min_std) + log(2 pi) / 2), a bound the 16 dims of the whole chunk would break
    noisy = tiny_policy(explore_executed=True, min_std=1.0, ddim_eta=0.0)
    greedy = noisy.act(obs, INSTRUCTIONS, deterministic=True)  # x = the mean at each step
    log_probs = greedy.policy_outputs["log_probs"]
    torch.testing.assert_close(
        log_probs, torch.full_like(log_probs, -8 * 0.5 * np.log(2 * np.pi)), atol=1e-4, rtol=0
    )


def test_log_prob_rejects_a_wrong_chain():
    policy = tiny_policy()
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS)
    bad = dict(out.policy_outputs, chain=out.policy_outputs["chain"][:, :, :4])
    with pytest.raises(ValueError, match=r"\(4, 4, 4, 2\).*\(4, 4, 8, 2\)"):
        policy.log_prob(obs, INSTRUCTIONS, bad)


@pytest.mark.parametrize(("prediction_type", "steps"), [("sample", 50), ("epsilon", 150)])
def test_bc_loss_decreases_and_actions_fit(prediction_type: str, steps: int):
    torch.manual_seed(0)
    config = tiny_config(image_keys=[], prediction_type=prediction_type, finetune_steps=None)
    policy = DiffusionPolicy(config)
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
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = policy.bc_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    target = actions[:, 1:5]
    predicted = policy.act(batch, batch["instruction"], deterministic=True).actions
    error = (predicted - target).abs().mean().item()
    spread = (target - target.mean(0)).abs().mean().item()  # error of the best constant
    assert error < (0.1 if prediction_type == "sample" else 0.5 * spread), (error, spread)


def test_bc_loss_is_the_masked_noise_mse():
    policy = tiny_policy()
    obs = observations()
    pad = torch.zeros(4, 8, dtype=torch.bool)
    pad[:, 6:] = True
    actions = torch.rand(4, 8, 2) * torch.tensor([5.0, 0.5]) + torch.tensor([-2.0, 0.0])
    batch = {**obs, "action": actions, "action_is_pad": pad, "instruction": INSTRUCTIONS}
    torch.manual_seed(5)
    loss = policy.bc_loss(batch)
    # By hand, drawing the same noise and timesteps: x_t = sqrt(abar) x_0 + sqrt(1 - abar) eps.
    torch.manual_seed(5)
    x0 = policy.action_normalizer.normalize(actions)
    noise = torch.randn_like(x0)
    t = torch.randint(0, 20, (4,))
    abar = policy.alphas_cumprod[t].view(-1, 1, 1)
    x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
    cond = policy.global_cond(policy.model, obs, INSTRUCTIONS)
    error = (policy.model.unet(x_t, t, cond) - noise) ** 2
    torch.testing.assert_close(loss, error[:, :6].mean())


def test_ema_update_formula_and_context():
    policy = tiny_policy()
    live, ema = policy.model.unet.final[1].bias, policy.ema_model.unet.final[1].bias
    before = ema.detach().clone()
    with torch.no_grad():
        live.add_(1.0)
    policy.ema_update()  # first update: decay = min(0.995, 1 / 10) = 0.1
    torch.testing.assert_close(ema, 0.1 * before + 0.9 * live.detach())
    assert int(policy.ema_steps) == 1
    obs = observations()
    with policy.ema_weights():
        assert policy.use_ema
        with_ema = policy.act(obs, INSTRUCTIONS, deterministic=True).actions
    assert not policy.use_ema
    assert not torch.allclose(with_ema, policy.act(obs, INSTRUCTIONS, deterministic=True).actions)


def test_save_and_load_in_a_fresh_process(tmp_path: Path):
    policy = tiny_policy()
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)  # EMA now differs from the live weights
    policy.ema_update()
    directory = policy.save_pretrained(tmp_path / "policy")
    obs = observations()
    np.savez(tmp_path / "obs.npz", **{k: v.numpy() for k, v in obs.items()})
    script = textwrap.dedent(
        f"""
        import numpy as np, torch
        torch.set_num_threads(1)
        import embodied.policies.diffusion  # registers "diffusion"
        from embodied.core.policy import Policy
        policy = Policy.from_pretrained({str(directory)!r})
        obs = {{k: torch.from_numpy(v) for k, v in np.load({str(tmp_path / "obs.npz")!r}).items()}}
        out = policy.act(obs, {INSTRUCTIONS!r}, generator=torch.Generator().manual_seed(7))
        np.save({str(tmp_path / "actions.npy")!r}, out.actions.numpy())
        with policy.ema_weights():
            ema = policy.act(obs, {INSTRUCTIONS!r}, deterministic=True).actions
        np.save({str(tmp_path / "ema.npy")!r}, ema.numpy())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(7))
    np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), out.actions.numpy(), atol=1e-6)
    with policy.ema_weights():
        ema = policy.act(obs, INSTRUCTIONS, deterministic=True).actions
    np.testing.assert_allclose(np.load(tmp_path / "ema.npy"), ema.numpy(), atol=1e-6)
    assert not np.allclose(ema.numpy(), policy.act(obs, INSTRUCTIONS, deterministic=True).actions)

    loaded = Policy.from_pretrained(directory)
    assert isinstance(loaded, DiffusionPolicy) and loaded.config == policy.config
    torch.testing.assert_close(loaded.action_normalizer.scale, policy.action_normalizer.scale)


def test_config_that_does_not_match_the_weights(tmp_path: Path):
    directory = tiny_policy().save_pretrained(tmp_path / "policy")
    config = json.loads((directory / "config.json").read_text())
    config["state_dim"] = 4
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="but the config builds") as error:
        Policy.from_pretrained(directory)
    match = re.search(r"has shape (\(.*?\)) but the config builds (\(.*?\))", str(error.value))
    assert match is not None and match.group(1) != match.group(2)  # both shapes, and they differ


def test_bad_observations_name_key_and_shapes():
    policy = tiny_policy()
    obs = observations()
    small = dict(obs, **{"observation.image": obs["observation.image"][:, :, :16, :16]})
    with pytest.raises(ValueError, match=r"'observation.image'.*\(4, 2, 16, 16, 3\).*32, 32, 3"):
        policy.act(small, INSTRUCTIONS)
    wrong_state = dict(obs, **{"observation.state": torch.zeros(4, 2, 5)})
    with pytest.raises(ValueError, match=r"'observation.state'.*\(4, 2, 5\).*\(B, 2, 3\)"):
        policy.act(wrong_state, INSTRUCTIONS)
    with pytest.raises(ValueError, match="observation.image"):
        policy.act({"observation.state": obs["observation.state"]}, INSTRUCTIONS)
    with pytest.raises(ValueError, match="instructions"):
        policy.act(obs, INSTRUCTIONS[:2])


def test_normalizer_round_trip():
    policy = tiny_policy()
    actions = torch.tensor([[-2.0, 0.0], [3.0, 0.5], [0.5, 0.25]])
    normalised = policy.action_normalizer.normalize(actions)
    torch.testing.assert_close(normalised[:2], torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    torch.testing.assert_close(policy.action_normalizer.unnormalize(normalised), actions)
    state = torch.tensor([[0.5, -1.0, 2.0], [2.5, -0.5, 3.0]])
    torch.testing.assert_close(
        policy.state_normalizer.normalize(state), torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    )
    with pytest.raises(ValueError, match="action"):
        policy.fit_normalizers({"observation.state": STATS["observation.state"]})


def test_instruction_encoder_vocabulary_and_padding():
    vocab = build_vocab(["Pick the red cube.", "open the drawer"])
    assert vocab == ["<unk>", "cube", "drawer", "open", "pick", "red", "the"]
    encoder = InstructionEncoder(vocab, 8)
    ids, mask = encoder.tokenize(["PICK the green cube", "open"])
    assert ids.tolist() == [[4, 6, 0, 1], [3, 0, 0, 0]]  # "green" is unknown -> 0
    assert mask.tolist() == [[True] * 4, [True, False, False, False]]
    embeddings = encoder(["pick the green cube", "open", ""])
    torch.testing.assert_close(embeddings[1], encoder.embedding.weight[3])  # padding ignored
    torch.testing.assert_close(embeddings[2], torch.zeros(8))
    torch.testing.assert_close(embeddings[0], encoder.embedding.weight[[4, 6, 0, 1]].mean(0))


def test_config_validation():
    with pytest.raises(ValueError, match="horizon"):
        tiny_config(horizon=6, down_dims=[16, 32, 64])
    with pytest.raises(ValueError, match="finetune_steps"):
        tiny_config(finetune_steps=6)
    with pytest.raises(ValueError, match="n_action_steps"):
        tiny_config(n_action_steps=8)
    assert json.loads(json.dumps(tiny_config().__dict__))["finetune_steps"] == 3


def test_mish_matches_torch_mish_and_its_gradient():
    """The U-Net's Mish (composed vectorised ops, backward from the forward's tanh(softplus))
    is torch's Mish: values and gradients within float32 rounding, overflow included."""
    from embodied.core.nn import Mish

    x = torch.cat(
        [torch.randn(4096) * 4, torch.tensor([-1e4, -100.0, -20.0, 0.0, 20.0, 89.0, 1e4])]
    )
    grad = torch.randn_like(x)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    Mish()(ours).backward(grad)
    torch.nn.functional.mish(theirs).backward(grad)
    torch.testing.assert_close(Mish()(x), torch.nn.functional.mish(x), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)
    x64 = (torch.randn(64, dtype=torch.float64) * 4).requires_grad_()
    assert torch.autograd.gradcheck(Mish(), (x64,))
    net = DiffusionPolicy(tiny_config()).model
    kinds = {type(m) for m in net.modules()}
    assert Mish in kinds and torch.nn.Mish not in kinds
