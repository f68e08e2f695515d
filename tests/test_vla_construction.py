"""Building the VLA policy: its config from a dataset's features, the policy registry, save/load
in a fresh process, and a local backbone directory loaded offline."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from test_vla import INSTRUCTIONS, STATS, observations, tiny_config, tiny_policy
from test_vla_keypoints import KEYPOINTS

from embodied.core.policy import Policy
from embodied.policies import POLICIES, make_policy
from embodied.policies.vla import VLAConfig, VLAPolicy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --- construction, save / load ------------------------------------------------------------------
def test_config_from_dataset_and_registry():
    features = {
        "observation.image": {"dtype": "video", "shape": [16, 16, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.environment_state": {"dtype": "float32", "shape": [5]},
        "action": {"dtype": "float32", "shape": [2]},
    }
    tasks = ["Reach the red block", "go to the blue block now"]
    config = VLAPolicy.config_from_dataset(
        features,
        tasks,
        horizon=4,
        n_obs_steps=1,
        patch_size=8,
        n_bins=16,
        hidden_size=32,
        text_heads=2,
        text_layers=1,
        vision_layers=1,
        vision_hidden_size=32,
    )
    assert config.image_keys == ["observation.image"] and config.image_size == 16
    assert (config.state_dim, config.env_state_dim, config.action_dim) == (3, 5, 2)
    assert config.n_action_steps == 4 and config.max_instruction_tokens == 6
    assert config.vocab == ["block", "blue", "go", "now", "reach", "red", "the", "to"]
    policy = VLAPolicy(config).fit_normalizers(STATS)
    assert policy.observation_spec.read_keys() == [
        "observation.image",
        "observation.state",
        "observation.environment_state",
    ]
    assert POLICIES["vla"] is VLAPolicy
    assert isinstance(make_policy("vla", tiny_config()), VLAPolicy)


def test_a_pixel_vla_from_a_dataset_with_environment_state_reads_none_of_it():
    """``env_state_dim=0`` on a dataset that records the objects' state: the saved config keeps
    neither its size nor its names, and the policy reads the camera and proprio only."""
    names = ["block_red.x", "block_red.y", "block_red.z", "drawer.opening"]
    features = {
        "observation.image": {"dtype": "video", "shape": [16, 16, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.environment_state": {"dtype": "float32", "shape": [4], "names": names},
        "action": {"dtype": "float32", "shape": [2]},
    }
    pixel = VLAPolicy.config_from_dataset(features, ["reach the red block"], env_state_dim=0)
    assert (pixel.env_state_dim, pixel.env_state_names) == (0, [])
    assert VLAPolicy.config_from_dataset(features, ["reach"]).env_state_names == names
    no_proprio = VLAPolicy(tiny_config(use_proprio=False))
    assert (
        no_proprio.observation_spec.read_keys() == ["observation.image"]
        and no_proprio.proprio is None
    )
    no_proprio.fit_normalizers({"action": STATS["action"]})  # no state statistics needed
    images_only = {"observation.image": observations()["observation.image"]}
    assert no_proprio.act(images_only, INSTRUCTIONS).actions.shape == (4, 3, 2)
    with pytest.raises(ValueError, match="does not read 'observation.environment_state'"):
        no_proprio.act(observations(), INSTRUCTIONS)  # privileged state it was not trained on
    n_params = sum(p.numel() for p in VLAPolicy(VLAConfig(action_dim=4, state_dim=4)).parameters())
    assert n_params < 3_000_000  # the default tiny backbone stays CPU sized


@pytest.mark.parametrize("overrides", [{}, KEYPOINTS], ids=["siglip", "keypoints"])
def test_save_and_load_in_a_fresh_process(tmp_path: Path, overrides: dict):
    policy = tiny_policy(**overrides)
    directory = policy.save_pretrained(tmp_path / "policy")
    config = json.loads((directory / "config.json").read_text())
    assert config["policy_type"] == "vla" and config["vocab"] == policy.config.vocab
    obs = observations(size=policy.config.image_size)
    if not policy.config.env_state_dim:
        del obs["observation.environment_state"]
    np.savez(tmp_path / "obs.npz", **{k: v.numpy() for k, v in obs.items()})
    script = textwrap.dedent(
        f"""
        import numpy as np, torch
        torch.set_num_threads(1)
        from embodied.core.policy import Policy
        import embodied.policies  # registers "vla"
        policy = Policy.from_pretrained({str(directory)!r})
        obs = {{k: torch.from_numpy(v) for k, v in np.load({str(tmp_path / "obs.npz")!r}).items()}}
        out = policy.act(obs, {INSTRUCTIONS!r}, generator=torch.Generator().manual_seed(7))
        np.save({str(tmp_path / "actions.npy")!r}, out.actions.numpy())
        np.save({str(tmp_path / "tokens.npy")!r}, out.policy_outputs["action_tokens"].numpy())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(7))
    np.testing.assert_array_equal(
        np.load(tmp_path / "tokens.npy"), out.policy_outputs["action_tokens"]
    )
    np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), out.actions.numpy(), atol=1e-6)
    loaded = Policy.from_pretrained(directory)
    assert isinstance(loaded, VLAPolicy) and loaded.config == policy.config
    torch.testing.assert_close(loaded.action_high, policy.action_high)


def test_local_backbone_directory(tmp_path: Path):
    """``backbone_path``: a saved image-text-to-text model + tokenizer, loaded offline."""
    source = tiny_policy()
    source.backbone.save_pretrained(tmp_path / "backbone")
    source.tokenizer.save_pretrained(tmp_path / "backbone")
    torch.manual_seed(0)
    policy = VLAPolicy(tiny_config(backbone_path=str(tmp_path / "backbone"))).fit_normalizers(STATS)
    assert policy.action_token_start == source.action_token_start
    for name, tensor in source.backbone.state_dict().items():
        torch.testing.assert_close(policy.backbone.state_dict()[name], tensor)
    obs = observations()
    policy.load_state_dict(source.state_dict())
    out = policy.act(obs, INSTRUCTIONS, deterministic=True)
    assert torch.equal(
        out.policy_outputs["action_tokens"],
        source.act(obs, INSTRUCTIONS, deterministic=True).policy_outputs["action_tokens"],
    )
    saved = policy.save_pretrained(tmp_path / "policy")
    assert Policy.from_pretrained(saved).config.backbone_path == str(tmp_path / "backbone")
