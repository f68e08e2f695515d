"""The VLA whose image tokens come from a keypoint camera encoder (``vision_encoder``): every
encoder builds offline and trains, log-probs recompute, it reads no privileged state, it learns
an image-dependent expert, and bad settings name the field (save/load: test_vla_construction)."""

from __future__ import annotations

import pytest
import torch
from test_pixel_planner import tiny_hf_models
from test_vla import INSTRUCTIONS, STATS, observations, synthetic_batch, tiny_config

from embodied.core.vision import PretrainedImageEncoder
from embodied.policies.vla import VLAPolicy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# A pixel VLA (no environment state) on 32 px images with 4 keypoints per camera.
KEYPOINTS = dict(
    env_state_dim=0,
    image_size=32,
    vision_encoder="resnet",
    vision_channels=[8, 16],
    num_keypoints=4,
    pretrained_blocks=2,
)


def keypoint_policy(seed: int = 0, **overrides) -> VLAPolicy:
    torch.manual_seed(seed)
    return VLAPolicy(tiny_config(**{**KEYPOINTS, **overrides})).fit_normalizers(STATS)


def pixel_batch() -> dict:
    """``synthetic_batch``'s expert on 32 px images without the environment state, where the
    image's cue is where a bright square is: right half for ``+0.3`` on dimension 1, left for
    ``-0.3`` (keypoints carry positions, not brightness)."""
    batch = synthetic_batch(None)
    del batch["observation.environment_state"]
    right = batch["action"][:, 0, 1] > 0
    images = torch.full((len(right), 1, 32, 32, 3), 30, dtype=torch.uint8)
    for b, is_right in enumerate(right.tolist()):
        column = 20 if is_right else 4
        images[b, 0, 12:20, column : column + 8] = 220
    batch["observation.image"] = images
    return batch


def test_every_encoder_builds_offline_and_trains_a_step(tmp_path):
    for name in ["resnet", "efficientnet_lite0", *tiny_hf_models(tmp_path)]:
        policy = keypoint_policy(vision_encoder=name)
        assert not hasattr(policy.backbone, "vision_tower")  # the keypoints are the image tokens
        tokens = policy.keypoint_tokens
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], 1e-3)
        before = {k: v.clone() for k, v in policy.state_dict().items()}
        loss = policy.bc_loss(pixel_batch())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        after = policy.state_dict()
        changed = [k for k in after if k.startswith("keypoint_tokens.") and ".trunk." not in k]
        assert changed and all(not torch.equal(before[k], after[k]) for k in changed), name
        if isinstance(tokens.encoders[0], PretrainedImageEncoder):  # the trunk stays frozen
            trunk = [k for k in after if ".trunk." in k]
            assert trunk and all(torch.equal(before[k], after[k]) for k in trunk), name
        obs = {k: v for k, v in pixel_batch().items() if k.startswith("observation.")}
        out = policy.act(obs, ["reach the red block"] * 16, deterministic=True)
        assert out.actions.shape == (16, 3, 2) and torch.isfinite(out.actions).all(), name


def test_log_probs_recompute_and_privileged_state_is_refused():
    policy = keypoint_policy(temperature=0.8)
    spec = policy.observation_spec
    assert not spec.privileged
    assert spec.read_keys() == ["observation.image", "observation.state"]
    obs = observations(seed=3, size=32)
    privileged = obs.pop("observation.environment_state")
    out = policy.act(obs, INSTRUCTIONS, False, generator=torch.Generator().manual_seed(1))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    log_probs.sum().backward()
    conv = policy.keypoint_tokens.encoders[0].stem[0].weight
    assert conv.grad is not None and conv.grad.abs().sum() > 0  # gradients reach the camera
    with pytest.raises(ValueError, match="does not read 'observation.environment_state'"):
        policy.act({**obs, "observation.environment_state": privileged}, INSTRUCTIONS, True)


def test_learns_an_image_dependent_expert_with_shifted_images():
    """Dimension 1 of the expert's action follows the side of the image's bright square: only
    the camera tells, through a DrQ shift in training."""
    policy = keypoint_policy(image_shift=2)
    batch = pixel_batch()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = policy.bc_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses
    obs = {k: v for k, v in batch.items() if k.startswith("observation.")}
    actions = policy.act(obs, batch["instruction"], deterministic=True).actions
    right = batch["action"][:, 0, 1] > 0
    assert (actions[right, :, 1] > 0).all() and (actions[~right, :, 1] < 0).all()


def test_a_pretrained_trunk_with_shifted_images_trains_uncached():
    """image_shift with efficientnet_lite0: the shifted frames never repeat, so the trunk's
    cache stays empty, and the keypoint encoder's adapter trains on them."""
    policy = keypoint_policy(vision_encoder="efficientnet_lite0", image_shift=2)
    encoder = policy.keypoint_tokens.encoders[0]
    before = encoder.adapter[0].weight.clone()
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    policy.bc_loss(pixel_batch()).backward()
    optimizer.step()
    assert not encoder.cache_trunk and len(encoder._cache) == 0
    assert not torch.equal(before, encoder.adapter[0].weight)


def test_film_makes_the_image_tokens_depend_on_the_instruction():
    """``vision_film``: the keypoints follow the instruction (FiLM starts as the identity, so
    only after a step do two instructions give different tokens of the same image)."""
    policy = keypoint_policy(vision_film=True)
    batch = pixel_batch()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def image_tokens(text: str) -> torch.Tensor:
        prefix = policy.prefix_embeddings(batch, [text] * 16)
        return prefix[:, 1 : 1 + policy.config.num_keypoints]

    torch.testing.assert_close(image_tokens("reach the red block"), image_tokens("go to the blue"))
    loss = policy.bc_loss(batch)
    optimizer.zero_grad()
    loss.backward()
    film = policy.keypoint_tokens.encoders[0].film
    assert film.weight.grad.abs().sum() > 0
    optimizer.step()
    assert not torch.allclose(image_tokens("reach the red block"), image_tokens("go to the blue"))


def test_the_recipe_builds_a_pixel_vla_from_a_camera_dataset():
    """configs/bc_vla_pixels.yaml on a dataset with cameras and the objects' state: the policy
    reads the front camera, agent_pos and the instruction, 16 keypoint tokens, nothing else."""
    from pathlib import Path

    from embodied.core.config import load_config
    from embodied.train.bc import BCConfig

    recipe = Path(__file__).parents[1] / "configs" / "bc_vla_pixels.yaml"
    cfg = load_config(BCConfig, recipe, ["dataset=unused"])
    names = ["block_red.x", "block_red.y", "block_red.z"]
    features = {
        "observation.images.front": {"dtype": "video", "shape": [64, 64, 3]},
        "observation.images.wrist": {"dtype": "video", "shape": [64, 64, 3]},
        "observation.state": {"dtype": "float32", "shape": [4]},
        "observation.environment_state": {"dtype": "float32", "shape": [3], "names": names},
        "action": {"dtype": "float32", "shape": [4]},
    }
    config = VLAPolicy.config_from_dataset(
        features, ["reach the red block"], horizon=cfg.horizon, **cfg.policy_overrides
    )
    policy = VLAPolicy(config)
    assert policy.observation_spec.read_keys() == ["observation.images.front", "observation.state"]
    assert policy.training_keys() == policy.observation_spec.read_keys()
    assert config.image_tokens == 16 and config.vision_film


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vision_encoder": "vgg"}, r"VLAConfig.vision_encoder must be 'siglip' or one of"),
        ({"vision_encoder": 5}, r"VLAConfig.vision_encoder must be 'siglip' or one of.*got 5"),
        ({"vision_channels": [8, 0]}, r"VLAConfig.vision_channels must be positive ints"),
        ({"num_keypoints": 0}, "VLAConfig.num_keypoints"),
        ({"image_shift": 16}, r"VLAConfig.image_shift=16 must be < image_size / 2"),
        ({"vision_film": True, "vision_encoder": "siglip"}, "VLAConfig.vision_film=True"),
        (
            {"pretrained_trainable": 1, "vision_encoder": "resnet"},
            "VLAConfig.pretrained_trainable=1",
        ),
    ],
)
def test_bad_keypoint_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{**KEYPOINTS, **overrides})


# The environment state as a training-only target whose prediction makes the object tokens.
NAMES = ["block_red.x", "block_red.y", "block_blue.x", "block_blue.y", "drawer.opening"]
PREDICTED_OBJECTS = dict(
    aux_state_dim=5,
    aux_state_names=NAMES,
    aux_state_weight=1.0,
    aux_state_encoder="objects",
    object_relative=True,
)


def test_predicted_object_tokens_train_on_a_state_the_policy_never_reads(tmp_path):
    from embodied.core.policy import Policy

    policy = keypoint_policy(**PREDICTED_OBJECTS)
    spec = policy.observation_spec
    assert spec.read_keys() == ["observation.image", "observation.state"] and not spec.privileged
    assert policy.training_keys() == [*spec.read_keys(), "observation.environment_state"]
    assert policy.config.num_object_tokens == 3  # block_red, block_blue, drawer
    data = pixel_batch()
    data["observation.environment_state"] = torch.randn(16, 1, 5)
    obs = {k: data[k] for k in spec.read_keys()}
    with pytest.raises(ValueError, match="does not read 'observation.environment_state'"):
        policy.act({**obs, "observation.environment_state": data["observation.environment_state"]},
                   data["instruction"], True)  # fmt: skip

    loss = policy.bc_loss(data)  # the target enters BC's loss ...
    assert set(policy.bc_terms) == {"action_nll", "aux_state"}
    torch.testing.assert_close(loss, policy.bc_terms["action_nll"] + policy.bc_terms["aux_state"])
    moved = {**data, "observation.environment_state": data["observation.environment_state"] + 1}
    assert policy.bc_loss(moved) > loss
    own = {k: v for k, v in data.items() if k != "observation.environment_state"}
    with pytest.raises(ValueError, match="observation.environment_state"):
        policy.bc_loss(own)
    nll = policy.bc_loss(own, auxiliary=False)  # a rollout's windows (GRPO's self-imitation)
    assert set(policy.bc_terms) == {"action_nll"}  # no term left from the call before
    torch.testing.assert_close(nll, policy.bc_terms["action_nll"])

    # ... and acting reads only the prediction: exact log-probs, gradients through the head.
    out = policy.act(obs, data["instruction"], False, generator=torch.Generator().manual_seed(2))
    log_probs = policy.log_prob(obs, data["instruction"], out.policy_outputs)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    log_probs.sum().backward()
    head = policy.state_head[0].weight.grad
    assert head is not None and head.abs().sum() > 0

    greedy = policy.act(obs, data["instruction"], True).actions
    loaded = Policy.from_pretrained(policy.save_pretrained(tmp_path / "policy"))
    torch.testing.assert_close(loaded.act(obs, data["instruction"], True).actions, greedy)


def test_a_camera_dataset_state_becomes_the_vla_target_only_when_asked():
    features = {
        "observation.images.front": {"dtype": "video", "shape": [32, 32, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.environment_state": {"dtype": "float32", "shape": [5], "names": NAMES},
        "action": {"dtype": "float32", "shape": [2]},
    }
    pixel = {**KEYPOINTS, "n_action_steps": 1}
    plain = VLAPolicy.config_from_dataset(features, ["reach the red block"], 2, **pixel)
    assert plain.env_state_dim == 0 and plain.aux_state_dim == 0 and not plain.env_state_names
    asked = {**pixel, "aux_state_weight": 1.0, "aux_state_encoder": "objects"}
    config = VLAPolicy.config_from_dataset(features, ["reach the red block"], 2, **asked)
    assert (config.env_state_dim, config.aux_state_dim, config.aux_state_names) == (0, 5, NAMES)
    assert {"block", "red", "blue", "drawer"} <= set(config.vocab)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vision_encoder": "siglip"}, r"from a keypoint vision_encoder's keypoints"),
        ({"aux_state_encoder": "flat", "use_proprio": False}, r"it needs use_proprio=True"),
        ({"aux_state_encoder": "none"}, r"VLAConfig.object_relative needs object tokens"),
        ({"aux_state_names": NAMES[:4]}, r"aux_state_names has 4 names for aux_state_dim=5"),
        ({"aux_state_weight": -1.0}, r"VLAConfig.aux_state_weight must be >= 0"),
    ],
)
def test_bad_auxiliary_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{**KEYPOINTS, **PREDICTED_OBJECTS, **overrides})
