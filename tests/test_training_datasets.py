"""PyTorch views of a LeRobot dataset: BC windows, reward clips, preference pairs, stats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.apps.collect import CollectConfig, run_collect
from embodied.apps.label import run_label
from embodied.datasets import LeRobotDataset
from embodied.datasets.training import (
    BCDataset,
    RewardDataset,
    normalization_stats,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> LeRobotDataset:
    root = tmp_path_factory.mktemp("training") / "data"
    cfg = CollectConfig(task="ButtonPress", episodes=3, out=str(root), image_size=32, rewind=1.0)
    run_collect(cfg)
    run_label(root)
    return LeRobotDataset(root)


def test_bc_windows_pad_at_episode_edges(dataset: LeRobotDataset) -> None:
    bc = BCDataset(dataset, n_obs_steps=2, horizon=8)
    lengths = dataset.episode_lengths()
    assert len(bc) == sum(lengths)
    frames = dataset.episode_frames(0)
    steps = lengths[0]

    first = bc[0]  # t = 0: the observation before the start repeats frame 0
    assert first["observation.state"].shape == (2, 4)
    assert torch.equal(first["observation.state"][0], first["observation.state"][1])
    assert first["observation.image"].shape == (2, 32, 32, 3)
    assert first["action_is_pad"].tolist() == [True] + [False] * 7
    np.testing.assert_array_equal(first["action"][1:].numpy(), frames["action"][:7])

    last = bc[steps - 1]  # t = T-1: actions past the episode repeat the last real one
    assert last["frame_index"] == steps - 1 and last["episode_index"] == 0
    np.testing.assert_array_equal(
        last["observation.state"].numpy(), frames["observation.state"][steps - 2 : steps]
    )
    assert last["action_is_pad"].tolist() == [False, False] + [True] * 6
    assert torch.equal(last["action"][-1], torch.from_numpy(frames["action"][steps - 1]))
    assert last["instruction"] == dataset.tasks[int(frames["task_index"][0])]
    loader = torch.utils.data.DataLoader(bc, batch_size=4)
    batch = next(iter(loader))
    assert batch["action"].shape == (4, 8, 4) and len(batch["instruction"]) == 4


def test_bc_windows_decode_only_the_requested_features(dataset: LeRobotDataset) -> None:
    full = BCDataset(dataset, n_obs_steps=2, horizon=8)
    state_only = BCDataset(dataset, n_obs_steps=2, horizon=8, keys=["observation.state"])
    item, full_item = state_only[5], full[5]
    assert "observation.image" not in item and "observation.image" in full_item
    for key in ("observation.state", "action", "action_is_pad"):
        assert torch.equal(item[key], full_item[key])
    assert item["instruction"] == full_item["instruction"]
    with pytest.raises(ValueError, match="observation.depth"):
        BCDataset(dataset, 2, 8, keys=["observation.depth"])


def test_bc_rejects_a_horizon_shorter_than_the_history(dataset: LeRobotDataset) -> None:
    with pytest.raises(ValueError, match="n_obs_steps=4, horizon=2"):
        BCDataset(dataset, n_obs_steps=4, horizon=2)


def test_reward_clips_carry_labels_and_success(dataset: LeRobotDataset) -> None:
    reward = RewardDataset(dataset, clip_len=6, clips_per_episode=3)
    assert len(reward) == 3 * dataset.num_episodes
    for i in range(len(reward)):
        item = reward[i]
        assert item["frames"].shape == (6, 32, 32, 3) and item["frames"].dtype == torch.uint8
        assert item["progress"].shape == (6,)
    final = reward[2]  # the last clip of episode 0 ends at its final frame
    assert final["success"] and final["progress"][-1] == 1.0
    assert final["frame_index"][-1] == dataset.episode_lengths()[0]
    with pytest.raises(ValueError, match="no 'progress.nothing' feature"):
        RewardDataset(dataset, label_key="progress.nothing")


def test_normalization_stats_come_from_the_dataset(dataset: LeRobotDataset) -> None:
    stats = normalization_stats(dataset)
    # Statistics cover every frame, as LeRobot's do: the final observation's action repeats the
    # last executed one (no zero padding to skew them).
    episodes = range(dataset.num_episodes)
    frames = [dataset.episode_frames(e, keys=["action"])["action"] for e in episodes]
    np.testing.assert_array_equal(frames[0][-1], frames[0][-2])
    actions = np.concatenate(frames)
    np.testing.assert_allclose(stats["action"]["max"], actions.max(0))
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="no statistics for \\['observation.depth'\\]"):
        normalization_stats(dataset, keys=["observation.depth"])
    # Training on some episodes normalises by theirs alone: nothing of the others reaches it.
    some = normalization_stats(dataset, episodes=[1, 2])
    held = np.concatenate(frames[1:3])
    np.testing.assert_allclose(some["action"]["max"], held.max(0))
    np.testing.assert_allclose(some["action"]["mean"], held.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(some["action"]["std"], held.std(0), rtol=1e-4, atol=1e-6)
    whole = normalization_stats(dataset, episodes=list(episodes))
    np.testing.assert_allclose(whole["action"]["std"], stats["action"]["std"], rtol=1e-6)
    n = dataset.num_episodes
    with pytest.raises(IndexError, match=f"episode {n} is out of range for {n} episodes"):
        normalization_stats(dataset, episodes=[0, n])
