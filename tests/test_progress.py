"""Progress reward model: shapes, causality, learning, save/load, bad input, augmentation, the image
encoder's two-thread backward and channels-last scoring, ``embodied bench reward``. Training it
and ``embodied eval reward`` are in test_progress_training.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.nn import build_vocab
from embodied.rewards.metrics import value_order_correlation
from embodied.rewards.progress import ProgressConfig, ProgressRewardModel, augment_frames

SIZE = 16
INSTRUCTIONS = ["push the red square right", "push the blue square right"]


def tiny_config(**overrides) -> ProgressConfig:
    values = dict(
        image_size=SIZE,
        vocab=build_vocab(INSTRUCTIONS),
        vision_channels=[8, 16],
        num_keypoints=8,
        d_model=32,
        n_heads=4,
        n_layers=2,
        ff_dim=64,
        num_bins=11,
    )
    return ProgressConfig(**{**values, **overrides})


def random_frames(b: int, t: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, t, SIZE, SIZE, 3), dtype=torch.uint8, generator=gen)


def synthetic_episode(rng: np.random.Generator, success: bool) -> tuple[np.ndarray, np.ndarray]:
    """A bright square sliding right: its position is the progress; failures turn back halfway."""
    length = int(rng.integers(10, 20))
    t = np.arange(length)
    if success:
        labels = t / (length - 1)
    else:
        peak = rng.uniform(0.4, 0.7)
        turn = length // 2
        labels = np.where(t <= turn, peak * t / turn, peak * (1 - 0.6 * (t - turn) / turn))
    frames = rng.integers(0, 40, size=(length, SIZE, SIZE, 3)).astype(np.uint8)
    row = int(rng.integers(2, SIZE - 6))
    for i, p in enumerate(labels):
        x = int(round(p * (SIZE - 4)))
        frames[i, row : row + 4, x : x + 4] = 230
    return frames, labels.astype(np.float32)


def synthetic_batch(rng: np.random.Generator, episodes: list, batch: int, clip: int) -> dict:
    frames, labels, success, texts = [], [], [], []
    for _ in range(batch):
        e = int(rng.integers(len(episodes)))
        ep_frames, ep_labels, ok = episodes[e]
        end = int(rng.integers(1, len(ep_labels)))
        idx = np.linspace(0, end, clip).round().astype(int)
        frames.append(torch.from_numpy(ep_frames[idx]))
        labels.append(torch.from_numpy(ep_labels[idx]))
        success.append(float(ok and end == len(ep_labels) - 1))
        texts.append(INSTRUCTIONS[e % 2])
    return {
        "frames": torch.stack(frames),
        "progress": torch.stack(labels),
        "success": torch.tensor(success),
        "instruction": texts,
    }


# --- the model ---------------------------------------------------------------------------------
def test_progress_has_the_right_shape_and_range() -> None:
    torch.manual_seed(0)
    model = ProgressRewardModel(tiny_config())
    frames = random_frames(3, 5)
    out = model(frames, [INSTRUCTIONS[0]] * 3)
    assert out["progress_logits"].shape == (3, 5, 11)
    assert out["success_logits"].shape == (3, 5)
    progress = model.progress(frames, [INSTRUCTIONS[0]] * 3)
    assert progress.shape == (3, 5) and progress.dtype == torch.float32
    assert torch.all((progress >= 0) & (progress <= 1))
    assert not progress.requires_grad
    prob = model.success_probability(frames.numpy(), ["anything"] * 3)  # numpy works too
    assert prob.shape == (3, 5) and torch.all((prob > 0) & (prob < 1))
    # Two-hot targets reproduce the label as the expected bin centre.
    labels = torch.tensor([0.0, 0.05, 0.37, 0.999, 1.0])
    target = model.progress_target(labels)
    assert torch.allclose(target.sum(-1), torch.ones(5))
    assert torch.allclose(target @ model.bin_centres, labels, atol=1e-6)


def test_outputs_are_causal_in_time() -> None:
    torch.manual_seed(0)
    model = ProgressRewardModel(tiny_config()).eval()
    frames = random_frames(2, 7)
    changed = frames.clone()
    changed[:, 4:] = random_frames(2, 3, seed=1)
    a = model(frames, INSTRUCTIONS)
    b = model(changed, INSTRUCTIONS)
    for key in ("progress", "success_logits"):
        assert torch.allclose(a[key][:, :4], b[key][:, :4], atol=1e-6)
        assert not torch.allclose(a[key][:, 4:], b[key][:, 4:])  # the later outputs do change
    # Scoring a rollout online, frame by frame, gives the same numbers as the whole clip.
    online = torch.stack(
        [model.progress(frames[:, : t + 1], INSTRUCTIONS)[:, -1] for t in range(7)]
    )
    assert torch.allclose(online.T, a["progress"], atol=1e-5)


def test_the_instruction_changes_the_estimate() -> None:
    torch.manual_seed(0)
    model = ProgressRewardModel(tiny_config())
    frames = random_frames(1, 3).expand(2, -1, -1, -1, -1)
    out = model.progress(frames, INSTRUCTIONS)
    assert not torch.allclose(out[0], out[1])


def test_loss_falls_and_the_model_ranks_frames_in_order() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    episodes = [(*synthetic_episode(rng, ok), ok) for ok in [True, False] * 6]
    model = ProgressRewardModel(tiny_config())

    def train_vocs() -> list[float]:
        model.eval()
        with torch.no_grad():
            vocs = [
                value_order_correlation(
                    model.progress(torch.from_numpy(f)[None], [INSTRUCTIONS[i % 2]])[0].numpy()
                )
                for i, (f, _, ok) in enumerate(episodes)
                if ok
            ]
        model.train()
        return vocs

    before = float(np.mean(train_vocs()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss = model.loss(synthetic_batch(rng, episodes, 16, 6))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-15:]) < 0.7 * np.mean(losses[:15])
    after = train_vocs()
    assert np.mean(after) > 0.8 and min(after) > 0.5, (before, after)
    # Failures that turn back are scored lower at the end than at their peak.
    model.eval()
    with torch.no_grad():
        for i, (frames, _, ok) in enumerate(episodes):
            if not ok:
                pred = model.progress(torch.from_numpy(frames)[None], [INSTRUCTIONS[i % 2]])[0]
                assert pred[-1] < pred.max() - 0.1


def one_training_step(model: ProgressRewardModel) -> dict[str, torch.Tensor]:
    """One AdamW step on a synthetic batch; returns the weights before it."""
    rng = np.random.default_rng(0)
    episodes = [(*synthetic_episode(rng, ok), ok) for ok in [True, False]]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.loss(synthetic_batch(rng, episodes, 4, 5)).backward()
    optimizer.step()
    return before


def test_the_reward_models_efficientnet_fine_tunes_only_its_top_block() -> None:
    torch.manual_seed(0)
    config = tiny_config(vision_encoder="efficientnet_lite0", pretrained_blocks=2,
                         pretrained_trainable=1)  # fmt: skip
    model = ProgressRewardModel(config)
    before = one_training_step(model)
    changed = {
        k for k, v in model.state_dict().items() if ".trunk." in k and not torch.equal(before[k], v)
    }
    assert changed and all(".trunk.blocks.1." in k for k in changed)


@pytest.mark.parametrize("encoder", ["efficientnet_lite0", "hf"])
def test_the_planners_camera_encoders_serve_the_reward_model(encoder: str, tmp_path: Path) -> None:
    """``vision_encoder`` as in the planners: a frozen pretrained trunk (offline ImageNet
    EfficientNet-Lite0, or a local ``transformers`` ViT) under a trained head; a step trains the
    head and leaves the trunk, and the saved model scores the same."""
    if encoder == "hf":
        from transformers import ViTConfig, ViTModel

        torch.manual_seed(0)
        vit = ViTConfig(image_size=SIZE, patch_size=4, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32)  # fmt: skip
        ViTModel(vit, add_pooling_layer=False).save_pretrained(tmp_path / "vit")
        encoder = f"hf:{tmp_path / 'vit'}"
    torch.manual_seed(0)
    model = ProgressRewardModel(tiny_config(vision_encoder=encoder, pretrained_blocks=2))
    before = one_training_step(model)
    after = model.state_dict()
    trunk = [k for k in after if ".trunk." in k]
    assert trunk and all(torch.equal(before[k], after[k]) for k in trunk)
    assert not torch.equal(before["progress_head.weight"], after["progress_head.weight"])
    assert not all(torch.equal(before[k], after[k]) for k in after if ".adapter." in k)
    model.eval().save_pretrained(tmp_path / "model")
    loaded = ProgressRewardModel.from_pretrained(tmp_path / "model").eval()
    frames = random_frames(2, 4)
    assert torch.equal(loaded.progress(frames, INSTRUCTIONS), model.progress(frames, INSTRUCTIONS))
    with pytest.raises(ValueError, match="vision_encoder must be one of"):
        tiny_config(vision_encoder="vgg")


# --- save / load -------------------------------------------------------------------------------
def test_save_load_round_trip_is_exact_in_a_fresh_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ProgressRewardModel(tiny_config()).eval()
    model.save_pretrained(tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == "progress" and config["image_size"] == SIZE
    frames = random_frames(2, 4)
    np.save(tmp_path / "frames.npy", frames.numpy())
    expected = model.progress(frames, INSTRUCTIONS).numpy()
    loaded = ProgressRewardModel.from_pretrained(tmp_path / "model").eval()
    assert np.array_equal(loaded.progress(frames, INSTRUCTIONS).numpy(), expected)
    script = (
        "import sys, numpy as np, torch\n"
        "torch.set_num_threads(1)\n"
        "from embodied.rewards import ProgressRewardModel\n"
        "m = ProgressRewardModel.from_pretrained(sys.argv[1]).eval()\n"
        "f = torch.from_numpy(np.load(sys.argv[2]))\n"
        f"np.save(sys.argv[3], m.progress(f, {INSTRUCTIONS!r}).numpy())\n"
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(tmp_path / "model"),
            str(tmp_path / "frames.npy"),
            str(tmp_path / "out.npy"),
        ],
        check=True,
    )
    # Another process may use another thread count: equal up to float summation order.
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=0, atol=1e-6)


def test_weights_that_do_not_match_the_config_name_the_tensor(tmp_path: Path) -> None:
    ProgressRewardModel(tiny_config(num_bins=11)).save_pretrained(tmp_path / "model")
    config_path = tmp_path / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "num_bins": 12}))
    wrong = r"'progress_head\.\w+' has shape \(11.*config builds \(12"
    with pytest.raises(ValueError, match=wrong):
        ProgressRewardModel.from_pretrained(tmp_path / "model")
    config_path.write_text(json.dumps({**config, "colour": 1}))
    with pytest.raises(ValueError, match=r"unknown keys \['colour'\]"):
        ProgressRewardModel.from_pretrained(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        ProgressRewardModel.from_pretrained(tmp_path / "model")


def test_the_stem_brings_any_camera_size_to_about_32_px_and_a_saved_model_keeps_its_stride(
    tmp_path: Path,
) -> None:
    def blocks_input(model: ProgressRewardModel, size: int) -> tuple[int, int]:
        x = torch.zeros(1, 3, size, size)
        return tuple(model.image_encoder.stem(x).shape[2:])

    for size, stride in [(16, 2), (64, 2), (96, 3), (128, 4)]:
        model = ProgressRewardModel(tiny_config(image_size=size))
        assert model.config.vision_stem_stride == stride  # recorded as built
        assert blocks_input(model, size) == (size // stride,) * 2
    explicit = ProgressRewardModel(tiny_config(image_size=96, vision_stem_stride=2))
    assert blocks_input(explicit, 96) == (48, 48)
    saved = tmp_path / "model"
    explicit.eval().save_pretrained(saved)
    assert json.loads((saved / "config.json").read_text())["vision_stem_stride"] == 2
    # A model saved before the field existed has a stride-2 stem, whatever the default is now.
    config = json.loads((saved / "config.json").read_text())
    del config["vision_stem_stride"]
    (saved / "config.json").write_text(json.dumps(config))
    loaded = ProgressRewardModel.from_pretrained(saved).eval()
    frames = torch.from_numpy(
        np.random.default_rng(0).integers(0, 256, (1, 2, 96, 96, 3), np.uint8)
    )
    assert torch.equal(
        loaded.progress(frames, INSTRUCTIONS[:1]), explicit.progress(frames, INSTRUCTIONS[:1])
    )


# --- bad input ---------------------------------------------------------------------------------
def test_bad_inputs_are_errors_that_say_what_is_wrong() -> None:
    model = ProgressRewardModel(tiny_config())
    frames = random_frames(2, 3)
    with pytest.raises(ValueError, match=r"5 dims.*\[B, T, 16, 16, 3\].*4 dims"):
        model.progress(frames[0], INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"shape uint8 \[B, T, 16, 16, 3\], got \(2, 3, 8, 8, 3\)"):
        model.progress(frames[:, :, :8, :8], INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"got \(2, 3, 3, 16, 16\)"):
        model.progress(frames.permute(0, 1, 4, 2, 3).contiguous()[:, :, :, :16, :16], INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"dtype uint8.*torch.float32"):
        model.progress(frames.float(), INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"got 1 instructions for 2 clips.*\(2, 3, 16, 16, 3\)"):
        model.progress(frames, INSTRUCTIONS[:1])
    with pytest.raises(ValueError, match="instructions must be a list of 2 strings"):
        model.progress(frames, "push the red square right")
    with pytest.raises(ValueError, match="needs 'progress'"):
        model.loss({"frames": frames, "instruction": INSTRUCTIONS, "success": [0, 1]})


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="ProgressConfig.num_bins"):
        tiny_config(num_bins=1)
    with pytest.raises(ValueError, match=r"ProgressConfig.d_model \(30\).*n_heads \(4\)"):
        tiny_config(d_model=30)
    with pytest.raises(ValueError, match="ProgressConfig.vocab"):
        tiny_config(vocab=["push"])
    with pytest.raises(ValueError, match="ProgressConfig.image_size"):
        tiny_config(image_size=0)
    with pytest.raises(ValueError, match="ProgressConfig.vision_stem_stride"):
        tiny_config(vision_stem_stride=-1)
    with pytest.raises(ValueError, match=r"vision_stem_stride=3 sets the resnet.*efficientnet"):
        tiny_config(vision_stem_stride=3, vision_encoder="efficientnet_lite0")


def test_augmentation_is_deterministic_per_clip_and_keeps_uint8() -> None:
    frames = random_frames(3, 4)
    a = augment_frames(frames, torch.Generator().manual_seed(5))
    b = augment_frames(frames, torch.Generator().manual_seed(5))
    assert a.dtype == torch.uint8 and a.shape == frames.shape and torch.equal(a, b)
    assert not torch.equal(a, frames)
    flat = torch.zeros(1, 2, SIZE, SIZE, 3, dtype=torch.uint8) + 100
    out = augment_frames(flat, torch.Generator().manual_seed(0), shift=2)
    assert torch.equal(out[:, 0], out[:, 1])  # the same transform for every frame of a clip
    same = augment_frames(frames, torch.Generator(), shift=0, brightness=0.0, color=0.0)
    assert torch.equal(same, frames)


def test_image_encoder_backward_is_safe_with_two_threads() -> None:
    """Regression: channels-last input made torch's 2-thread CPU backward corrupt the heap
    (the process aborted with "double free or corruption")."""
    from embodied.core.vision import ImageEncoder

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        encoder = ImageEncoder([8, 16], 8, 32)
        for n in (30, 48):
            frames = torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8)
            encoder(frames).sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in encoder.parameters())
    finally:
        torch.set_num_threads(threads)


def test_scoring_runs_channels_last_and_agrees_with_the_training_layout() -> None:
    """Scoring (no gradients) keeps the frames channels-last, where the CPU convolutions are
    faster; training runs contiguous NCHW (see the regression above). Both give the same
    progress up to float rounding."""
    torch.manual_seed(0)
    model = ProgressRewardModel(tiny_config()).eval()
    layouts = []
    model.image_encoder.stem[0].register_forward_pre_hook(
        lambda _, args: layouts.append(args[0].is_contiguous())
    )
    frames = random_frames(3, 5)
    scored = model.progress(frames, INSTRUCTIONS + INSTRUCTIONS[:1])
    trained = model(frames, INSTRUCTIONS + INSTRUCTIONS[:1])["progress"]
    assert layouts == [False, True]  # channels-last when scoring, NCHW with gradients
    torch.testing.assert_close(scored, trained.detach(), atol=1e-5, rtol=0)


def test_bench_reward_reports_batched_scoring_against_one_clip(capsys) -> None:
    from embodied.apps.cli import main

    assert main(["bench", "reward", "--json", "--image-size", "16", "--frames", "4", "6",
                 "--batches", "1", "3", "--repeats", "1"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    assert [(r["batch"], r["frames"]) for r in rows] == [(1, 4), (3, 4), (1, 6), (3, 6)]
    assert rows[0]["speedup"] == 1.0 and all(r["frames_per_s"] > 0 for r in rows)
    assert rows[1]["baseline"] == "progress (default) (batch 1, 4 frames)"
    assert rows[3]["baseline"] == "progress (default) (batch 1, 6 frames)"


def test_paired_rates_time_a_figure_and_its_baseline_in_turn() -> None:
    """Each repeat times every run once, starting one further along, after one warm-up call
    each: a noisy moment of the machine falls on both sides of a ratio."""
    from embodied.apps.bench.common import paired_rates

    calls: list[tuple[str, int]] = []
    runs = {key: (lambda n, key=key: calls.append((key, n))) for key in ("base", "fast", "x")}
    rates = paired_rates(runs, 5, 4)
    assert calls[:3] == [("base", 5), ("fast", 5), ("x", 5)]  # warm-ups
    timed = [key for key, _ in calls[3:]]
    assert timed == ["base", "fast", "x", "fast", "x", "base", "x", "base", "fast",
                     "base", "fast", "x"]  # fmt: skip
    assert set(rates) == set(runs) and all(rate > 0 for rate in rates.values())
