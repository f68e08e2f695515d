"""Helpers of the LeRobot interop tests: the kinds of toolkit datasets, rollouts to fill them, and
LeRobot's own dataset class over a directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# name -> (env options, writer options, episodes written first, episodes appended by the toolkit)
KINDS = {
    "video": ({"obs_mode": "pixels_state"}, {}, 2, 0),
    "state-only": ({"obs_mode": "state"}, {}, 2, 0),
    "two-cameras": ({"obs_mode": "pixels", "cameras": ["front", "wrist"]}, {}, 2, 0),
    "lossless": ({"obs_mode": "pixels_state"}, {"lossless": True}, 2, 0),
    "appended": ({"obs_mode": "pixels_state"}, {}, 1, 1),
    "odd-size": ({"obs_mode": "pixels_state", "image_size": 65}, {}, 2, 0),
}
STEPS = 24  # env steps per episode (short: the expert does not finish, which does not matter)


def torchcodec_works() -> bool:
    """Whether LeRobot's torchcodec backend can decode here (it needs system FFmpeg libraries)."""
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        return False
    return True


BACKENDS = ["pyav", "torchcodec"] if torchcodec_works() else ["pyav"]


def lerobot_dataset(root: Path, backend: str = "pyav", **options):
    """LeRobot's own ``LeRobotDataset`` over a local directory (uint8 frames)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(
        repo_id=f"local/{root.name}", root=root, video_backend=backend, return_uint8=True, **options
    )


def rollouts(env_options: dict, seeds: list[int]) -> list:
    """Expert PickPlace episodes of ``STEPS`` steps with the given env options."""
    import embodied.sims as sims
    from embodied.rollout.episodes import rollout_episode

    options = {"image_size": 48, **env_options}
    env = sims.make("PickPlace", **options)
    expert = sims.make_expert(env, noise=0.05, seed=0)
    trajectories = [
        rollout_episode(env, expert, seed=seed, suite="tabletop", max_steps=STEPS) for seed in seeds
    ]
    env.close()
    return trajectories


def write_kind(root: Path, kind: str) -> Path:
    """A toolkit dataset of ``kind`` at ``root`` (see ``KINDS``)."""
    from embodied.datasets import LeRobotDatasetWriter

    env_options, writer_options, first, appended = KINDS[kind]
    trajectories = rollouts(env_options, list(range(first + appended)))
    with LeRobotDatasetWriter(root, **writer_options) as writer:
        for traj in trajectories[:first]:
            writer.add_episode(traj)
    if appended:
        with LeRobotDatasetWriter.open(root) as writer:
            for traj in trajectories[first:]:
                writer.add_episode(traj)
    return root


def frames_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Arrays equal in value and shape (scalars and [1]-shaped values alike)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.reshape(-1).shape == b.reshape(-1).shape and np.array_equal(
        a.reshape(-1), b.reshape(-1)
    )


def tiny_smolvlm(directory: Path, words: list[str]) -> Path:
    """A randomly initialised SmolVLM that SmolVLA can build on offline: a config of a few small
    layers (64 px images of 16 px patches, 4 image tokens) and its processor, whose tokenizer is a
    word-level one over ``words`` with SmolVLM's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    special = ["<unk>", "<pad>", "<|im_start|>", "<end_of_utterance>",
               "<fake_token_around_image>", "<global-img>", "<image>"]  # fmt: skip
    vocab = {word: i for i, word in enumerate(dict.fromkeys(special + words))}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="<unk>", pad_token="<pad>",
        bos_token="<|im_start|>", eos_token="<end_of_utterance>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
            "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
        },
    )  # fmt: skip
    size = {"longest_edge": 64}
    SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size=size, max_image_size=size),
        video_processor=SmolVLMVideoProcessor(),
        tokenizer=tokenizer,
        image_seq_len=4,
    ).save_pretrained(directory)
    SmolVLMConfig(
        text_config={"model_type": "llama", "vocab_size": len(vocab), "hidden_size": 32,
                     "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 16},
        scale_factor=2, image_token_id=vocab["<image>"],
    ).save_pretrained(directory)  # fmt: skip
    return directory


def lerobot_actions(directory: Path, obs: dict, noise, tasks: list[str] | None = None):
    """What LeRobot itself does: load the directory (any policy type), preprocess the toolkit's
    observation windows (uint8 images to float [0, 1] channels first, ``task`` strings) and
    ``predict_action_chunk`` from ``noise``, postprocessed."""
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    config = PreTrainedConfig.from_pretrained(directory)
    policy = get_policy_class(config.type).from_pretrained(directory).eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(directory))
    batch = {
        k: v.permute(0, 1, 4, 2, 3).float() / 255 if v.dtype == torch.uint8 else v
        for k, v in obs.items()
    }
    if tasks is not None:
        batch["task"] = list(tasks)
    with torch.no_grad():
        return post(policy.predict_action_chunk(pre(batch), noise=noise))


def observations(policy, batch: int, seed: int = 0) -> dict:
    """Random observation windows of a policy's inputs: uint8 camera images, normal states."""
    import torch

    spec, rng = policy.observation_spec, np.random.default_rng(seed)
    obs = {
        key: torch.from_numpy(rng.integers(0, 256, (batch, spec.n_obs_steps, h, w, 3), np.uint8))
        for key, (h, w) in spec.cameras.items()
    }
    for key, dim in (
        ("observation.state", spec.state_dim),
        ("observation.environment_state", spec.env_state_dim),
    ):
        if dim:
            obs[key] = torch.from_numpy(rng.normal(size=(batch, spec.n_obs_steps, dim))).float()
    return obs


def tiny_progress_model(directory: Path, image_size: int) -> Path:
    """An untrained, tiny progress model: its scores differ between rollouts, so a GRPO group of
    an untrained policy still has a signal (their privileged progress is 0 alike)."""
    import torch

    from embodied.rewards.progress import ProgressConfig, ProgressRewardModel

    torch.manual_seed(0)
    config = ProgressConfig(image_size=image_size, vision_channels=[4, 8], num_keypoints=4,
                            d_model=16, n_heads=2, n_layers=1, ff_dim=32, num_bins=8)  # fmt: skip
    return ProgressRewardModel(config).save_pretrained(directory)


def assert_lerobot_loads(directory: Path, policy) -> None:
    """LeRobot's own class for the saved type loads ``directory`` with ``policy``'s weights."""
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class

    kind = PreTrainedConfig.from_pretrained(directory).type
    theirs = get_policy_class(kind).from_pretrained(directory).state_dict()
    for key, value in policy.model.state_dict().items():
        assert torch.equal(theirs[key], value), key


def fine_tune(runs: dict[str, list[str]], out: Path, start) -> dict[str, Path]:
    """Run each ``embodied train`` command (``out=out/<name>``) from the policy ``start``; each
    must change the weights and save a policy LeRobot loads. The saved directories."""
    import torch

    from embodied.apps.cli import main
    from embodied.policies import Policy

    saved = {}
    for name, argv in runs.items():
        assert main([*argv, f"out={out / name}"]) == 0, name
        saved[name] = next((out / name).glob("*/policy"))
        tuned = Policy.from_pretrained(saved[name])
        changed = [
            not torch.equal(a, b)
            for a, b in zip(tuned.state_dict().values(), start.state_dict().values(), strict=True)
        ]
        assert any(changed), f"{name} did not change the weights"
        assert_lerobot_loads(saved[name], tuned)
    return saved


def save_lerobot_policy(
    dataset_root: Path, keys: tuple[str, ...], kind: str, root: Path, **settings
) -> Path:
    """A policy of LeRobot type ``kind`` built and saved (with its processors, normalised by the
    dataset's statistics) by LeRobot's own classes, reading the toolkit dataset's features
    ``keys`` (inputs, then ``action``); ``settings`` go to its config. Its directory."""
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    from lerobot.utils.feature_utils import dataset_to_policy_features

    from embodied.datasets import LeRobotDataset

    dataset = LeRobotDataset(dataset_root)
    features = dataset_to_policy_features({k: dataset.features[k] for k in keys})
    config = PreTrainedConfig.get_choice_class(kind)(
        input_features={k: f for k, f in features.items() if k != "action"},
        output_features={"action": features["action"]},
        device="cpu",
        **settings,
    )
    torch.manual_seed(0)
    policy = get_policy_class(kind)(config)
    stats = {k: {s: np.asarray(v) for s, v in dataset.stats[k].items()} for k in keys}
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    for part in (policy, pre, post):
        part.save_pretrained(root)
    return root
