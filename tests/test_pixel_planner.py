"""The camera planner: encoders by name, random shift, instruction FiLM, and the environment
state as a training-only auxiliary target (never an input at inference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.core.features import ENV_STATE_KEY
from embodied.core.nn import build_vocab
from embodied.core.policy import Policy
from embodied.core.vision import (
    SCORING_CHUNK_PIXELS,
    PretrainedImageEncoder,
    build_image_encoder,
    chunk_size,
    chunk_sizes,
    random_shift,
)
from embodied.policies.diffusion import DiffusionConfig, DiffusionPolicy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

INSTRUCTIONS = ["reach the red block", "reach the blue block", "go to the red block", ""]
NAMES = ["block_red.x", "block_red.y", "block_blue.x", "block_blue.y", "drawer.opening"]
STATS = {
    "observation.state": {"mean": np.zeros(3), "std": np.ones(3)},
    "observation.environment_state": {"mean": np.zeros(5), "std": 2 * np.ones(5)},
    "action": {"min": -np.ones(2), "max": np.ones(2)},
}


def pixel_config(**overrides) -> DiffusionConfig:
    """A tiny camera planner predicting a 5-value environment state from its keypoints."""
    values = dict(
        state_dim=3,
        action_dim=2,
        image_keys=["observation.images.front"],
        image_size=32,
        n_obs_steps=2,
        horizon=8,
        n_action_steps=4,
        vocab=build_vocab([*INSTRUCTIONS, "block_red", "block_blue", "drawer"]),
        embed_dim=16,
        down_dims=[16, 32],
        vision_channels=[8, 16],
        num_keypoints=8,
        num_train_timesteps=20,
        num_inference_steps=5,
        finetune_steps=3,
        vision_film=True,
        aux_state_dim=5,
        aux_state_names=NAMES,
        aux_state_weight=1.0,
        aux_state_encoder="objects",
    )
    values.update(overrides)
    return DiffusionConfig(**values)


def pixel_policy(**overrides) -> DiffusionPolicy:
    torch.manual_seed(0)
    return DiffusionPolicy(pixel_config(**overrides)).fit_normalizers(STATS)


def batch(size: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (size, 2, 32, 32, 3), generator=g).to(torch.uint8)
    return {
        "observation.images.front": images,
        "observation.state": torch.randn(size, 2, 3, generator=g),
        ENV_STATE_KEY: torch.randn(size, 2, 5, generator=g),
        "action": torch.rand(size, 8, 2, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(size, 8, dtype=torch.bool),
        "instruction": INSTRUCTIONS[:size],
    }


def inputs(data: dict, policy: Policy) -> dict:
    """Only what the policy reads at inference."""
    return {k: data[k] for k in policy.observation_spec.read_keys()}


def test_random_shift_keeps_shape_dtype_and_translates_whole_windows():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (6, 2, 16, 16, 3)).to(torch.uint8)
    assert random_shift(images, 0) is images
    shifted = random_shift(images, 3)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    for b in range(6):  # one offset per window: the interior is a translated copy, both frames
        found = [
            (dy, dx)
            for dy in range(-3, 4)
            for dx in range(-3, 4)
            if torch.equal(
                shifted[b, :, 3:13, 3:13], images[b, :, 3 + dy : 13 + dy, 3 + dx : 13 + dx]
            )
        ]
        assert found, b
    assert not torch.equal(shifted, images)


@pytest.mark.parametrize("film", [0, 16])
def test_resnet_encoder_returns_features_and_keypoints(film: int):
    encoder = build_image_encoder("resnet", [8, 16], 8, 16, film_dim=film)
    images = torch.randint(0, 256, (5, 32, 32, 3)).to(torch.uint8)
    condition = torch.randn(5, 16) if film else None
    features, keypoints = encoder.encode(images, condition)
    assert features.shape == (5, 16) and keypoints.shape == (5, 16)
    assert keypoints.abs().max() <= 1.0
    if film:  # zero-initialised FiLM starts as the identity, and trains
        torch.testing.assert_close(encoder.encode(images, torch.randn(5, 16))[0], features)
        features.sum().backward()
        assert encoder.film.weight.grad is not None
        with pytest.raises(ValueError, match="FiLM"):
            encoder.encode(images)


def test_many_images_encode_in_chunks_as_each_image_alone():
    encoder = build_image_encoder("resnet", [8, 16], 8, 16, film_dim=16).eval()
    torch.nn.init.normal_(encoder.film.weight)  # the condition must follow its own image
    n = 2 * chunk_size(96, 96) + 3
    images = torch.randint(0, 256, (n, 96, 96, 3)).to(torch.uint8)
    condition = torch.randn(n, 16)
    features, keypoints = encoder.encode(images, condition)
    alone = [encoder.encode(images[i : i + 1], condition[i : i + 1]) for i in range(n)]
    torch.testing.assert_close(features, torch.cat([f for f, _ in alone]))
    torch.testing.assert_close(keypoints, torch.cat([k for _, k in alone]))


@pytest.mark.parametrize("total", [1, 13, 14, 15, 28, 129])
def test_chunk_sizes_cover_every_image_within_the_limit(total):
    for even in (False, True):
        sizes = chunk_sizes(total, 14, even)
        assert sum(sizes) == total and max(sizes) <= 14 and len(sizes) == -(-total // 14)
        if even:
            assert max(sizes) - min(sizes) <= 1


def test_scoring_without_gradients_encodes_in_larger_chunks(monkeypatch):
    """A reward model's scoring (channels-last, no gradients) batches 8x more frames per call
    than training, where each chunk's activations wait for the backward pass."""
    encoder = build_image_encoder("resnet", [8, 16], 8, 16).eval()
    encoder.channels_last_inference = True
    calls = []
    feature_map = encoder.feature_map
    monkeypatch.setattr(encoder, "feature_map", lambda x: calls.append(len(x)) or feature_map(x))
    n = chunk_size(96, 96, SCORING_CHUNK_PIXELS) + 3
    images = torch.randint(0, 256, (n, 96, 96, 3)).to(torch.uint8)
    with torch.no_grad():
        scored = encoder(images)
    assert calls == [(n + 1) // 2, n // 2]  # even chunks: no small last one
    calls.clear()
    trained = encoder(images)
    assert calls == [chunk_size(96, 96)] * (n // chunk_size(96, 96)) + [n % chunk_size(96, 96)]
    torch.testing.assert_close(scored, trained.detach())


def test_a_policy_encoder_gives_the_same_bits_with_and_without_gradients():
    """A policy's rollout log-probs (no gradients) are recomputed in the update (gradients), so
    its camera encoder must run the same kernels both ways: NCHW, not the faster channels-last
    layout the reward model scores in (whose last bits differ)."""
    encoder = build_image_encoder("resnet", [8, 16], 8, 16).eval()
    assert not encoder.channels_last_inference
    images = torch.randint(0, 256, (6, 32, 32, 3), generator=torch.Generator().manual_seed(0))
    images = images.to(torch.uint8)
    with torch.no_grad():
        rollout = encoder(images)
    assert torch.equal(rollout, encoder(images).detach())


def tiny_hf_models(tmp_path) -> list[str]:
    """A tiny random CNN (ResNet) and ViT saved as local ``transformers`` directories."""
    from transformers import ResNetConfig, ResNetModel, ViTConfig, ViTModel

    torch.manual_seed(0)
    cnn = ResNetModel(
        ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    )
    vit = ViTModel(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        ),
        add_pooling_layer=False,
    )
    directories = []
    for name, model in (("cnn", cnn), ("vit", vit)):
        model.save_pretrained(tmp_path / name)
        directories.append(f"hf:{tmp_path / name}")
    return directories


def train_step(policy: DiffusionPolicy) -> dict:
    """One BC step on ``batch()``; returns the model's weights before it."""
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], 1e-3)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    optimizer.zero_grad()
    policy.bc_loss(batch()).backward()
    optimizer.step()
    return before


def test_every_encoder_builds_offline_and_trains_a_step(tmp_path):
    for name in ["resnet", "efficientnet_lite0", *tiny_hf_models(tmp_path)]:
        policy = pixel_policy(vision_encoder=name, pretrained_blocks=2)
        encoder = policy.model.image_encoders[0]
        before = train_step(policy)
        after = policy.model.state_dict()
        assert not torch.equal(before["unet.final.1.weight"], after["unet.final.1.weight"]), name
        assert not torch.equal(
            before["image_encoders.0.out.weight"], after["image_encoders.0.out.weight"]
        ), name
        if isinstance(encoder, PretrainedImageEncoder):  # frozen trunk, eval mode, cached
            trunk = {k: v for k, v in after.items() if ".trunk." in k}
            assert trunk and all(torch.equal(before[k], v) for k, v in trunk.items()), name
            assert not encoder.trunk.training and encoder.training
            assert len(encoder._cache) == 8  # 4 windows x 2 steps
            policy.bc_loss(batch())
            assert len(encoder._cache) == 8, "the same frames are served from the cache"
        out = policy.act(inputs(batch(), policy), INSTRUCTIONS, deterministic=True)
        assert out.actions.shape == (4, 4, 2) and torch.isfinite(out.actions).all()


def test_a_pretrained_trunk_trains_on_shifted_frames_without_its_cache():
    """image_shift with a pretrained trunk: no shifted frame repeats, so nothing is cached; the
    trunk sees the shifted frames and the rest of the encoder trains on them."""
    policy = pixel_policy(vision_encoder="efficientnet_lite0", pretrained_blocks=2, image_shift=2)
    encoder = policy.model.image_encoders[0]
    seen: list[torch.Tensor] = []
    encoder.trunk.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    torch.manual_seed(1)
    before = train_step(policy)
    after = policy.model.state_dict()
    assert not encoder.cache_trunk and len(encoder._cache) == 0
    key = "image_encoders.0.adapter.0.weight"
    assert not torch.equal(before[key], after[key])
    frames = batch()["observation.images.front"].reshape(-1, 32, 32, 3)
    unshifted = frames.permute(0, 3, 1, 2).float() / 255.0
    assert seen[0].shape == unshifted.shape and not torch.equal(seen[0], unshifted)


def test_efficientnet_top_layers_fine_tune_on_the_cached_output_of_the_frozen_ones(tmp_path):
    """pretrained_trainable=1: the last kept block trains, the stem and first block stay
    ImageNet's (BatchNorm statistics included) and their output is what the cache keeps; the
    fine-tuned weights survive save/load."""
    policy = pixel_policy(
        vision_encoder="efficientnet_lite0", pretrained_blocks=2, pretrained_trainable=1
    )
    encoder = policy.model.image_encoders[0]
    before = train_step(policy)
    after = policy.model.state_dict()
    trunk = {k: v for k, v in after.items() if ".trunk." in k}
    changed = {k for k, v in trunk.items() if not torch.equal(before[k], v)}
    assert changed and all(".trunk.blocks.1." in k for k in changed)
    assert all(torch.equal(before[k], v) for k, v in trunk.items() if "running_" in k)
    assert len(encoder._cache) == 8
    cached = next(iter(encoder._cache.values()))
    assert cached.shape[0] == encoder.trunk.blocks[0]._block_args.output_filters
    assert encoder.trunk(torch.rand(1, 3, 32, 32)).shape[1] == encoder.trunk.out_channels
    encoder.cache_trunk = False  # the same features with and without the cache
    images = batch()["observation.images.front"][:, 0]
    condition = None if encoder.film is None else torch.randn(len(images), encoder.film.in_features)
    uncached = encoder.encode(images, condition)[0]
    encoder.cache_trunk = True
    torch.testing.assert_close(encoder.encode(images, condition)[0], uncached)
    policy.save_pretrained(tmp_path / "policy")
    loaded = Policy.from_pretrained(tmp_path / "policy")
    for key, value in loaded.model.state_dict().items():
        if ".trunk.blocks.1." in key:
            assert torch.equal(value, after[key]), key


def test_a_fully_fine_tuned_efficientnet_trains_its_stem_without_a_cache():
    policy = pixel_policy(
        vision_encoder="efficientnet_lite0", pretrained_blocks=2, pretrained_trainable=3
    )
    before = train_step(policy)
    after = policy.model.state_dict()
    assert not torch.equal(
        before["image_encoders.0.trunk.stem.0.weight"],
        after["image_encoders.0.trunk.stem.0.weight"],
    )
    assert len(policy.model.image_encoders[0]._cache) == 0


def test_an_image_text_pair_model_encodes_with_its_image_tower(tmp_path):
    """A SigLIP directory (image and text towers, as such checkpoints are published): the
    encoder runs its image tower and gives a spatial map of its patches."""
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(0)
    tower = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 32}  # fmt: skip
    vision = {**tower, "image_size": 32, "patch_size": 8}
    pair = SiglipModel(SiglipConfig(text_config=tower, vision_config=vision))
    pair.save_pretrained(tmp_path / "siglip")
    policy = pixel_policy(vision_encoder=f"hf:{tmp_path / 'siglip'}")
    trunk = policy.model.image_encoders[0].trunk
    assert trunk.out_channels == 16
    assert trunk(torch.zeros(2, 3, 32, 32)).shape == (2, 16, 4, 4)  # 4x4 patches of 8 px
    out = policy.act(inputs(batch(), policy), INSTRUCTIONS, deterministic=True)
    assert torch.isfinite(out.actions).all()


def test_a_local_directory_that_is_no_vision_model_is_refused_by_name(tmp_path):
    from transformers import LlamaConfig, LlamaModel

    LlamaModel(
        LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2)
    ).save_pretrained(tmp_path / "text")  # fmt: skip
    (tmp_path / "empty").mkdir()
    cases = {
        "text": r"LlamaModel reads no images \(no pixel_values\)",
        "empty": "not a transformers model directory",
        "missing": "no such local model directory",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError, match=rf"vision_encoder 'hf:{tmp_path / name}': {message}"):
            pixel_policy(vision_encoder=f"hf:{tmp_path / name}")


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


def test_pixel_planner_log_prob_recomputes():
    policy = pixel_policy()
    obs = inputs(batch(), policy)
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    log_probs.sum().backward()
    film = policy.model.image_encoders[0].film.weight.grad
    assert film is not None and film.abs().sum() > 0


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


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"vision_encoder": "vgg"}, "vision_encoder"),
        ({"image_shift": 16}, "image_shift"),
        ({"aux_state_encoder": "tokens"}, "aux_state_encoder"),
        ({"aux_state_weight": -1.0}, "aux_state_weight"),
        ({"image_keys": []}, "aux_state_weight"),
        ({"aux_state_names": NAMES[:2]}, "aux_state_names"),
        ({"aux_state_names": [], "aux_state_encoder": "objects"}, "aux_state_names"),
        ({"env_state_dim": 5, "env_state_names": NAMES}, "aux_state_encoder"),
        ({"aux_state_quantities": ["qz"]}, r"aux_state_quantities names \['qz'\]"),
        ({"pretrained_trainable": 1}, "pretrained_trainable=1 fine-tunes efficientnet_lite0"),
        (
            {"vision_encoder": "efficientnet_lite0", "pretrained_trainable": 6},
            r"pretrained_trainable must be in \[0, 5\]",
        ),
    ],
)
def test_bad_vision_settings_name_the_field(overrides: dict, field: str):
    with pytest.raises(ValueError, match=field):
        pixel_config(**overrides)
