"""The environment state as the camera planner's training-only auxiliary target: learned from the
images, saved and loaded, never read at inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_pixel_planner import INSTRUCTIONS, NAMES, STATS, batch, inputs, pixel_config, pixel_policy

from embodied.core.features import ENV_STATE_KEY
from embodied.core.policy import Policy
from embodied.policies.diffusion import DiffusionPolicy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_auxiliary_state_is_a_training_target_only(tmp_path):
    policy = pixel_policy()
    assert policy.config.env_state_dim == 0 and policy.env_state_normalizer is None
    assert ENV_STATE_KEY not in policy.observation_spec.read_keys()
    assert policy.training_keys() == [*policy.observation_spec.read_keys(), ENV_STATE_KEY]

    from embodied.rollout.matching import env_options

    assert env_options(policy.observation_spec)["obs_mode"] == "pixels"  # no state rendered

    data = batch()
    policy.eval()
    acted = policy.act(inputs(data, policy), data["instruction"], deterministic=True).actions
    # The inputs-read check: privileged state offered to the pixel policy is refused.
    poisoned = {**inputs(data, policy), ENV_STATE_KEY: data[ENV_STATE_KEY]}
    with pytest.raises(ValueError, match="does not read 'observation.environment_state'"):
        policy.act(poisoned, data["instruction"], deterministic=True)

    policy.train()  # ... while BC's loss does, as the head's target
    torch.manual_seed(1)
    loss = policy.bc_loss(data)
    assert set(policy.bc_terms) == {"aux_state", "denoise"}
    torch.testing.assert_close(loss, policy.bc_terms["aux_state"] + policy.bc_terms["denoise"])
    torch.manual_seed(1)
    moved = policy.bc_loss({**data, ENV_STATE_KEY: data[ENV_STATE_KEY] + 1.0})
    assert moved > loss
    own = inputs(data, policy) | {k: data[k] for k in ("action", "instruction")}
    with pytest.raises(ValueError, match="environment_state"):
        policy.bc_loss(own)
    torch.manual_seed(1)  # a rollout's windows (GRPO's self-imitation): the denoising term only
    denoise = policy.bc_loss(own, auxiliary=False)
    assert float(policy.bc_terms["aux_state"]) == 0.0
    torch.testing.assert_close(denoise, policy.bc_terms["denoise"])

    policy.save_pretrained(tmp_path / "policy")
    loaded = Policy.from_pretrained(tmp_path / "policy").eval()
    torch.testing.assert_close(
        loaded.act(inputs(data, loaded), data["instruction"], deterministic=True).actions, acted
    )


def test_a_near_constant_state_value_does_not_become_noise_in_the_target():
    """A resting block's height varies by ~1 mm, a fixed cabinet's by 0.1 mm: scaled by their own
    std those jitters were unit-variance noise that no camera resolves, and they made most of
    Push's auxiliary loss. With the std floored at 1 cm they stay near zero."""
    std = np.array([0.1, 0.1, 0.0009, 0.0001, 2.0])
    stats = {**STATS, ENV_STATE_KEY: {"mean": np.zeros(5), "std": std}}
    torch.manual_seed(0)
    policy = DiffusionPolicy(pixel_config()).fit_normalizers(stats).train()
    jitter = torch.zeros(5)
    jitter[2:4] = torch.as_tensor(3 * std[2:4], dtype=torch.float32)  # 3 std of each
    scaled = policy.aux_state_normalizer.normalize(jitter)
    assert scaled[2:4].abs().max() < 0.3 and scaled[[0, 1, 4]].abs().max() == 0
    data = batch()
    torch.manual_seed(1)
    policy.bc_loss(data)
    clean = float(policy.bc_terms["aux_state"])
    torch.manual_seed(1)
    policy.bc_loss({**data, ENV_STATE_KEY: data[ENV_STATE_KEY] + jitter})
    assert abs(float(policy.bc_terms["aux_state"]) - clean) < 0.05 * clean


def test_quantities_left_out_of_the_target_are_neither_learned_nor_read():
    """``aux_state_quantities=[x]``: the y values and the drawer's opening leave the loss, and
    the head predicts them as the dataset's mean, so the object tokens read a constant there
    (an image-ambiguous value such as a cube's yaw then adds no noise to the policy's input)."""
    policy = pixel_policy(aux_state_quantities=["x"]).train()
    kept, dropped = [0, 2], [1, 3, 4]
    data = batch()
    torch.manual_seed(1)
    cond, predicted = policy.conditioning(policy.model, data, data["instruction"])
    assert predicted[..., dropped].abs().max() == 0 and predicted[..., kept].abs().min() > 0
    torch.manual_seed(1)
    policy.bc_loss(data)
    target = policy.aux_state_normalizer.normalize(data[ENV_STATE_KEY])
    expected = ((predicted - target)[..., kept] ** 2).mean()
    torch.testing.assert_close(policy.bc_terms["aux_state"], expected.detach())
    moved = data[ENV_STATE_KEY].clone()
    moved[..., dropped] += 5.0
    torch.manual_seed(1)
    policy.bc_loss({**data, ENV_STATE_KEY: moved})
    torch.testing.assert_close(policy.bc_terms["aux_state"], expected.detach())


def test_the_camera_recipe_saves_and_loads_in_a_fresh_process(tmp_path):
    """The recipe configs/bc_pixels.yaml ships (FiLM'd ResNet, auxiliary state head): a new
    interpreter loading the saved policy samples the same actions for the same noise."""
    import subprocess
    import sys
    import textwrap

    policy = pixel_policy().eval()
    directory = policy.save_pretrained(tmp_path / "policy")
    obs = inputs(batch(), policy)
    np.savez(tmp_path / "obs.npz", **{k: v.numpy() for k, v in obs.items()})
    script = textwrap.dedent(
        f"""
        import numpy as np, torch
        torch.set_num_threads(1)
        import embodied.policies.diffusion  # registers "diffusion"
        from embodied.core.policy import Policy
        policy = Policy.from_pretrained({str(directory)!r}).eval()
        obs = {{k: torch.from_numpy(v) for k, v in np.load({str(tmp_path / "obs.npz")!r}).items()}}
        out = policy.act(obs, {INSTRUCTIONS!r}, generator=torch.Generator().manual_seed(7))
        np.save({str(tmp_path / "actions.npy")!r}, out.actions.numpy())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(7))
    np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), out.actions.numpy(), atol=1e-6)


def test_aux_head_learns_the_state_from_the_images():
    torch.manual_seed(0)
    policy = pixel_policy(aux_state_weight=10.0, aux_state_encoder="none", vision_film=False)
    data = batch(size=4)
    # A bright square whose position is the state the head must read off the image.
    images = torch.zeros(4, 2, 32, 32, 3, dtype=torch.uint8)
    where = torch.tensor([[4, 4], [4, 20], [20, 4], [20, 20]])
    for b, (y, x) in enumerate(where):
        images[b, :, y : y + 8, x : x + 8] = 255
    data["observation.images.front"] = images
    data[ENV_STATE_KEY] = (where.float() / 8 - 1.5).repeat(1, 3)[:, :5, None].transpose(1, 2)
    data[ENV_STATE_KEY] = data[ENV_STATE_KEY].expand(4, 2, 5).contiguous()
    optimizer = torch.optim.AdamW(policy.parameters(), 3e-3)
    first = None
    for _ in range(60):
        policy.bc_loss(data).backward()
        optimizer.step()
        optimizer.zero_grad()
        first = first if first is not None else float(policy.bc_terms["aux_state"])
    assert float(policy.bc_terms["aux_state"]) < 0.2 * first


def test_config_from_dataset_turns_the_environment_state_into_the_target():
    features = {
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.images.front": {"dtype": "video", "shape": [32, 32, 3]},
        ENV_STATE_KEY: {"dtype": "float32", "shape": [5], "names": NAMES},
        "action": {"dtype": "float32", "shape": [2]},
    }
    plain = DiffusionPolicy.config_from_dataset(features, INSTRUCTIONS, horizon=8, n_action_steps=4)
    assert plain.env_state_dim == 5 and plain.aux_state_dim == 0
    config = DiffusionPolicy.config_from_dataset(
        features,
        INSTRUCTIONS,
        horizon=8,
        n_action_steps=4,
        aux_state_weight=1.0,
        aux_state_encoder="objects",
    )
    assert config.env_state_dim == 0 and config.env_state_names == []
    assert config.aux_state_dim == 5 and config.aux_state_names == NAMES
    assert "drawer" in config.vocab  # object names embed with the instruction's words
