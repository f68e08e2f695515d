"""``embodied collect``: vectorized rollouts written to a LeRobot v3 dataset, failures included.

Besides clean expert demonstrations, reward models need failures on purpose: noisy experts
(``noise``), experts cut off early (``cutoff``: that fraction of episodes keeps only its first
30-70% of steps, marked truncated, so the cut falls before success however fast the expert is),
and ReWiND-style rewound copies of successful episodes
(``rewind``: played forward, then backward), all labelled as failures with their true stages.
With ``record="expert"`` the noisy expert's states are kept but each frame's action is the
clean expert action there (DART, Laskey et al. 2017): demonstrations that show how to recover.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import embodied.sims as sims
from embodied.core.config import SEED_MAX, seed_setting, setting, validate
from embodied.core.run import progress_bar
from embodied.datasets import LeRobotDatasetWriter
from embodied.rewards.rewind import rewind, rewind_split
from embodied.rollout.episodes import RECORDS, ExpertActor, RandomActor, rollout_vector
from embodied.sims.metaworld import preset_tasks

POLICIES = ("expert", "random")


@dataclass
class CollectConfig:
    """What ``embodied collect`` records; every field can be overridden as ``key=value``."""

    task: str = "PickPlace"  # tabletop task, metaworld/<name>, or MT10 (each of its tasks)
    policy: str = setting("expert", choices=POLICIES)
    episodes: int = setting(10, low=1)
    out: str = "data/collect"
    noise: float = setting(0.0, low=0.0)  # std of Gaussian action noise
    # "expert": execute the noisy action, record the clean one (DART)
    record: str = setting("executed", choices=RECORDS)
    seed: int = seed_setting()
    workers: int = setting(1, low=1)
    image_size: int = setting(96, low=8, high=4096)
    cameras: list[str] = field(default_factory=lambda: ["front"])
    obs_mode: str = "pixels_state"
    cutoff: float = setting(0.0, low=0.0, high=1.0)  # share of episodes cut before success
    rewind: float = setting(0.0, low=0.0, high=1.0)  # share of successes also stored rewound
    lossless: bool = False
    fps: int = setting(16, low=1)
    goal_cycle: bool = False  # tabletop: seed s = layout s // G with goal s % G (every goal)
    # End an episode at its first success (the tabletop default; Meta-World would run on to 500
    # steps and may undo the success, which then no longer counts for the episode).
    terminate_on_success: bool = True

    def check(self) -> None:
        """A known task, seeds that stay in range, DART labels only from the expert."""
        known = self.task.startswith("metaworld/") or preset_tasks(self.task) is not None
        if not known and self.task not in sims.list_tasks():
            raise ValueError(
                f"unknown task {self.task!r}; available: {', '.join(sims.list_tasks())}, "
                "metaworld/<name> or MT10"
            )
        if self.seed + self.episodes - 1 > SEED_MAX:
            raise ValueError(
                f"seed = {self.seed}: episodes use seeds up to seed + episodes - 1, which must be "
                f"<= {SEED_MAX}"
            )
        if self.record == "expert" and self.policy != "expert":
            raise ValueError(
                f"record='expert' labels frames with the expert; policy is {self.policy!r}"
            )


@dataclass
class CollectSummary:
    """What a collection run produced, for the summary line and the closing report."""

    episodes: int
    successes: int
    frames: int
    seconds: float
    rewound: int
    out: Path

    def line(self) -> str:
        """One line: success rate and throughput."""
        rate = self.successes / max(self.episodes, 1)
        return (
            f"collected {self.episodes} episodes ({self.successes} successful, {rate:.0%}), "
            f"{self.rewound} rewound copies, {self.frames} frames in {self.seconds:.1f} s: "
            f"{self.episodes / self.seconds * 60:.1f} episodes/min, "
            f"{self.frames / self.seconds:.0f} frames/s -> {self.out}"
        )


def run_collect(cfg: CollectConfig) -> CollectSummary:
    """Collect ``cfg.episodes`` episodes (seeds ``seed..seed+episodes-1``) into ``cfg.out``."""

    validate(cfg)
    if (preset := preset_tasks(cfg.task)) is not None:
        # A benchmark preset (MT10): every task in turn into one multi-task dataset, each on
        # the seeds seed..seed+episodes-1.
        parts = [run_collect(replace(cfg, task=f"metaworld/{task}")) for task in preset]
        totals = [sum(getattr(p, f) for p in parts) for f in ("episodes", "successes", "frames")]
        seconds, rewound = sum(p.seconds for p in parts), sum(p.rewound for p in parts)
        return CollectSummary(*totals, seconds, rewound, Path(cfg.out))
    rng = np.random.default_rng(cfg.seed)
    env_kwargs = {
        "obs_mode": cfg.obs_mode,
        "image_size": cfg.image_size,
        "cameras": cfg.cameras,
        "terminate_on_success": cfg.terminate_on_success,
    }
    if cfg.task.startswith("metaworld/"):
        env_kwargs.pop("cameras")  # Meta-World has its own camera names and default
        if cfg.goal_cycle:
            raise ValueError("goal_cycle is a tabletop option; Meta-World tasks have one goal")
    elif cfg.goal_cycle:
        env_kwargs["goal_cycle"] = True
    vec = sims.make_vec_env(
        cfg.task, cfg.workers, asynchronous=cfg.workers > 1, autoreset_mode="disabled", **env_kwargs
    )
    out = Path(cfg.out)
    writer = (
        LeRobotDatasetWriter.open(out)
        if (out / "meta" / "info.json").exists()
        else LeRobotDatasetWriter(
            out, fps=cfg.fps, lossless=cfg.lossless, names=_state_names(vec, cfg.obs_mode)
        )
    )
    seeds = [cfg.seed + e for e in range(cfg.episodes)]
    # seed -> fraction of the episode kept, for the episodes that are cut off
    cut_at = {s: rng.uniform(0.3, 0.7) for s in seeds if rng.random() < cfg.cutoff}
    act = _policy(cfg, vec, rng)
    successes = frames = rewound = 0
    start = time.perf_counter()
    bar = progress_bar(total=cfg.episodes, desc=f"collect {cfg.task}")
    try:
        with writer:
            for traj in rollout_vector(vec, act, seeds, sims.suite_of(cfg.task)):
                if traj.seed in cut_at:
                    traj = cut_off(traj, cut_at[traj.seed])
                writer.add_episode(traj)
                successes += traj.success
                frames += traj.length + 1
                if traj.success and traj.length > 3 and rng.random() < cfg.rewind:
                    copy = rewind(traj, rewind_split(traj.length, rng))
                    writer.add_episode(copy)
                    frames += copy.length + 1
                    rewound += 1
                bar.update(1)
    finally:
        bar.close()
        vec.close()
    return CollectSummary(
        cfg.episodes, successes, frames, time.perf_counter() - start, rewound, out
    )


def cut_off(traj: Any, fraction: float) -> Any:
    """The episode stopped ``fraction`` of the way to its first success (or its end): the
    prefix, not successful, truncated at the cut, as if the expert had been stopped there.
    Measured to the first success because Meta-World episodes run on after it. An episode
    that succeeds at its first step has no such prefix and is returned as it is."""
    success = np.asarray(traj.info.get("success", np.zeros(traj.length)), dtype=bool)
    reached = int(np.argmax(success)) + 1 if success.any() else traj.length
    if reached < 2:
        return traj
    part = traj.slice(0, min(max(int(fraction * reached), 1), reached - 1))
    part.terminated = np.zeros_like(part.terminated)
    part.truncated = np.zeros_like(part.truncated)
    part.truncated[-1] = True
    return part


def _state_names(vec: Any, obs_mode: str) -> dict[str, list[str]]:
    """The env's names for the state observations it returns in ``obs_mode``."""
    names = vec.get_attr("feature_names")[0]
    returned = {"agent_pos"} | ({"environment_state"} if obs_mode != "pixels" else set())
    return {key: value for key, value in names.items() if key in returned}


def _policy(cfg: CollectConfig, vec: Any, rng: np.random.Generator) -> Callable[[Any], np.ndarray]:
    """Batched actions for every sub-env: the (noisy) scripted experts or uniform random."""

    if cfg.policy == "random":
        return RandomActor(vec, rng)
    return ExpertActor(vec, cfg.noise, rng, record=cfg.record)
