"""The camera planner: encoders by name, chunked encoding, random shift, instruction FiLM, its
log-prob, and the settings it refuses by name."""

from __future__ import annotations

import pytest
import torch
from tiny_pixel_planner import INSTRUCTIONS, NAMES, batch, inputs, pixel_config, pixel_policy

from embodied.core.policy import Policy
from embodied.core.vision import (
    SCORING_CHUNK_PIXELS,
    PretrainedImageEncoder,
    build_image_encoder,
    chunk_size,
    chunk_sizes,
    random_shift,
)
from embodied.policies.diffusion import DiffusionPolicy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


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


def test_pixel_planner_log_prob_recomputes():
    policy = pixel_policy()
    obs = inputs(batch(), policy)
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(0))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    log_probs.sum().backward()
    film = policy.model.image_encoders[0].film.weight.grad
    assert film is not None and film.abs().sum() > 0


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
