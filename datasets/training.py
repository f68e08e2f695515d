"""PyTorch datasets over a LeRobot v3 dataset: behaviour cloning and progress reward models.

Each wraps a ``LeRobotDataset`` and decodes an episode once (then caches it), so an epoch over
windows of the same episode does not decode its video again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from embodied.datasets.lerobot import LeRobotDataset


def _is_observation(key: str) -> bool:
    return key.startswith("observation.")


class _EpisodeCache:
    """Per-frame columns of episodes, decoded on first use and kept: all of them when
    ``cache_size`` is None (a tabletop dataset fits in memory; random batches then never decode a
    video twice), else the ``cache_size`` most recent. ``keys`` limits the features decoded."""

    def __init__(
        self, dataset: LeRobotDataset, cache_size: int | None, keys: Sequence[str] | None = None
    ) -> None:
        self.dataset = dataset
        if keys is not None:
            keys = list(dict.fromkeys([*keys, "action", "task_index"]))
            unknown = [k for k in keys if k not in dataset.features]
            if unknown:
                raise ValueError(
                    f"dataset has no features {unknown}; it has {list(dataset.features)}"
                )
        load = functools.partial(dataset.episode_frames, keys=keys)
        self.frames = functools.lru_cache(maxsize=cache_size)(load)

    def instruction(self, frames: dict[str, np.ndarray]) -> str:
        return self.dataset.tasks[int(frames["task_index"][0])]


class BCDataset(Dataset):
    """Diffusion Policy's training windows: ``n_obs_steps`` observations, ``horizon`` actions.

    The window for step ``t`` holds observations ``t-n_obs_steps+1 .. t`` and actions
    ``t-n_obs_steps+1 .. t-n_obs_steps+horizon``; indices before the episode start repeat the
    first frame, indices past the last real action repeat it, and ``action_is_pad`` marks both
    (as LeRobot does), so a loss can mask them. Items are dicts of tensors plus the instruction.
    ``keys`` names the observation features to load (default all; a policy's ``input_keys``).
    """

    def __init__(
        self,
        dataset: LeRobotDataset,
        n_obs_steps: int,
        horizon: int,
        episodes: Sequence[int] | None = None,
        cache_size: int | None = None,
        keys: Sequence[str] | None = None,
    ) -> None:
        if n_obs_steps < 1 or horizon < n_obs_steps:
            raise ValueError(
                f"need 1 <= n_obs_steps <= horizon, got n_obs_steps={n_obs_steps}, "
                f"horizon={horizon}"
            )
        self.n_obs_steps, self.horizon = n_obs_steps, horizon
        self.cache = _EpisodeCache(dataset, cache_size, keys)
        self.episodes = list(range(dataset.num_episodes)) if episodes is None else list(episodes)
        # One sample per executed action t: frames 0..T-1 of a Trajectory the toolkit wrote
        # (frame T holds the final observation), every frame of an episode LeRobot recorded.
        self.actions = dataset.episode_lengths()
        self.index = [(e, t) for e in self.episodes for t in range(self.actions[e])]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        episode, t = self.index[i]
        frames = self.cache.frames(episode)
        steps = int(self.actions[episode])  # executed actions: frames 0..steps-1
        start = t - self.n_obs_steps + 1
        obs_idx = np.clip(np.arange(start, t + 1), 0, len(frames["action"]) - 1)
        act_idx = np.arange(start, start + self.horizon)
        is_pad = (act_idx < 0) | (act_idx >= steps)
        act_idx = np.clip(act_idx, 0, steps - 1)
        item: dict[str, Any] = {
            key: torch.from_numpy(np.ascontiguousarray(value[obs_idx]))
            for key, value in frames.items()
            if _is_observation(key)
        }
        item["action"] = torch.from_numpy(np.ascontiguousarray(frames["action"][act_idx]))
        item["action_is_pad"] = torch.from_numpy(is_pad)
        item["instruction"] = self.cache.instruction(frames)
        item["episode_index"], item["frame_index"] = episode, t
        return item


class RewardDataset(Dataset):
    """Clips for progress reward models: frames up to a point, their progress labels, success.

    Each episode gives ``clips_per_episode`` prefix clips ending at evenly spaced frames (the last
    one at the final frame); each clip holds ``clip_len`` frames evenly spaced from the start to
    its end, so a model sees the history up to "now" and learns the progress of every frame.
    """

    def __init__(
        self,
        dataset: LeRobotDataset,
        clip_len: int = 8,
        clips_per_episode: int = 4,
        label_key: str = "progress.label",
        image_key: str | None = None,
        episodes: Sequence[int] | None = None,
        cache_size: int | None = None,
    ) -> None:
        if label_key not in dataset.features:
            raise ValueError(
                f"dataset has no {label_key!r} feature; run `embodied label` first "
                f"(features: {', '.join(dataset.features)})"
            )
        images = [k for k, f in dataset.features.items() if f.get("dtype") in ("video", "image")]
        if image_key is None and images:
            image_key = images[0]
        if image_key not in images:
            raise ValueError(f"image_key must be one of {images}, got {image_key!r}")
        self.clip_len, self.label_key, self.image_key = clip_len, label_key, image_key
        self.cache = _EpisodeCache(dataset, cache_size)
        self.episodes = list(range(dataset.num_episodes)) if episodes is None else list(episodes)
        last_frames = [row["length"] - 1 for row in dataset.episodes_table()]
        self.index = []
        for e in self.episodes:
            last = last_frames[e]  # frames 0..last
            ends = np.linspace(0, last, clips_per_episode + 1)[1:].round().astype(int)
            self.index += [(e, int(end)) for end in ends]
        self.success = dataset.episode_success()

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        episode, end = self.index[i]
        frames = self.cache.frames(episode)
        idx = np.linspace(0, end, self.clip_len).round().astype(int)
        return {
            "frames": torch.from_numpy(np.ascontiguousarray(frames[self.image_key][idx])),
            "progress": torch.from_numpy(frames[self.label_key][idx].astype(np.float32)),
            "frame_index": torch.from_numpy(idx),
            "success": bool(self.success[episode]),
            "instruction": self.cache.instruction(frames),
            "episode_index": episode,
        }


def normalization_stats(
    dataset: LeRobotDataset,
    keys: Sequence[str] = ("observation.state", "action"),
    episodes: Sequence[int] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Per-feature statistics (mean, std, min, max, quantiles) that policies use to normalise
    inputs and actions: ``meta/stats.json``, or those of ``episodes`` only."""
    stats = dataset.stats if episodes is None else dataset.stats_of(episodes)
    missing = [k for k in keys if k not in stats]
    if missing:
        raise ValueError(f"no statistics for {missing}; available: {', '.join(stats)}")
    return {k: {s: np.asarray(v) for s, v in stats[k].items()} for k in keys}
