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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.run import progress

POLICIES = ("expert", "random")


@dataclass
class CollectConfig:
    """What ``embodied collect`` records; every field can be overridden as ``key=value``."""

    task: str = "PickPlace"
    policy: str = "expert"
    episodes: int = 10
    out: str = "data/collect"
    noise: float = 0.0
    record: str = "executed"  # "expert": execute the noisy action, record the clean one (DART)
    seed: int = 0
    workers: int = 1
    image_size: int = 96
    cameras: list[str] = field(default_factory=lambda: ["front"])
    obs_mode: str = "pixels_state"
    cutoff: float = 0.0
    rewind: float = 0.0
    lossless: bool = False
    fps: int = 16
    goal_cycle: bool = False  # tabletop: seed s = layout s // G with goal s % G (every goal)
    # End an episode at its first success (the tabletop default; Meta-World would run on to 500
    # steps and may undo the success, which then no longer counts for the episode).
    terminate_on_success: bool = True


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


def check_config(cfg: CollectConfig) -> None:
    """Reject bad settings before any env is built, naming the setting."""
    import embodied.sims as sims
    from embodied.rollout.episodes import RECORDS

    if cfg.policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {cfg.policy!r}")
    if not cfg.task.startswith("metaworld/") and cfg.task not in sims.list_tasks():
        raise ValueError(f"unknown task {cfg.task!r}; available: {', '.join(sims.list_tasks())}")
    for name in ("episodes", "workers", "image_size", "fps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name in ("cutoff", "rewind"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1], got {getattr(cfg, name)}")
    if cfg.noise < 0:
        raise ValueError(f"noise must be >= 0, got {cfg.noise}")
    if cfg.record not in RECORDS:
        raise ValueError(f"record must be one of {RECORDS}, got {cfg.record!r}")
    if cfg.record == "expert" and cfg.policy != "expert":
        raise ValueError(f"record='expert' labels frames with the expert; policy is {cfg.policy!r}")


def run_collect(cfg: CollectConfig) -> CollectSummary:
    """Collect ``cfg.episodes`` episodes (seeds ``seed..seed+episodes-1``) into ``cfg.out``."""
    import embodied.sims as sims
    from embodied.datasets import LeRobotDatasetWriter
    from embodied.rewards.labels import rewind, rewind_split
    from embodied.rollout.episodes import rollout_vector

    check_config(cfg)
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
    bar = progress(total=cfg.episodes, desc=f"collect {cfg.task}")
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
    from embodied.rollout.episodes import ExpertActor, RandomActor

    if cfg.policy == "random":
        return RandomActor(vec, rng)
    return ExpertActor(vec, cfg.noise, rng, record=cfg.record)
