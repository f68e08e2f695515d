"""``embodied collect``: scripted rollouts written to a LeRobot v3 dataset, failures included.

Besides clean expert demonstrations, reward models need failures on purpose: noisy experts
(``noise``), experts cut off early (``cutoff``: that fraction of episodes keeps only its first
30-70% of steps, marked truncated, so the cut falls before success however fast the expert is),
and ReWiND-style rewound copies of successful episodes
(``rewind``: played forward, then backward), all labelled as failures with their true stages.
With ``record="expert"`` the noisy expert's states are kept but each frame's action is the
clean expert action there (DART, Laskey et al. 2017): demonstrations that show how to recover.

Episodes are committed to the dataset as they finish (within a few seconds, see
``LeRobotDatasetWriter``), so a killed run keeps what it finished before; Ctrl-C commits every
finished episode and raises ``CollectInterrupted`` (a KeyboardInterrupt) saying how many were
kept. Appending checks the run's settings against the dataset before any rollout: frame rate,
lossless video and the observations (image size, cameras, state) must match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import embodied.sims as sims
from embodied.apps.collect_workers import EpisodeRecipe, EpisodeRunner
from embodied.core.config import SEED_MAX, seed_setting, setting, validate
from embodied.core.run import progress_bar
from embodied.datasets import PreparedEpisode
from embodied.datasets.lerobot.lock import defer_interrupts
from embodied.rollout.episodes import RECORDS
from embodied.rollout.recording import open_episode_writer
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
    workers: int = setting(1, low=1)  # processes running (and encoding) whole episodes
    image_size: int = setting(96, low=8, high=4096)
    cameras: list[str] | None = None  # None: the task's default camera (front, Meta-World corner2)
    obs_mode: str = "pixels_state"
    cutoff: float = setting(0.0, low=0.0, high=1.0)  # share of episodes cut before success
    rewind: float = setting(0.0, low=0.0, high=1.0)  # share of successes also stored rewound
    lossless: bool = False
    fps: int = setting(16, low=1)
    goal_cycle: bool = False  # tabletop: seed s = layout s // G with goal s % G (every goal)
    goal_state: bool = False  # tabletop: the named object and goal point in environment_state
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


class CollectInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``run_collect``; the episodes finished before it are in the dataset."""

    def __init__(self, kept: int, total: int | None, out: Path) -> None:
        """``kept`` episodes of this run were committed; the dataset at ``out`` has ``total``
        (None: the run stopped before opening it)."""
        super().__init__(kept, total, out)
        self.kept, self.total, self.out = kept, total, out

    def line(self) -> str:
        """One line for the terminal."""
        if self.total is None:
            return f"interrupted before the first episode: nothing written to {self.out}"
        return (
            f"interrupted: kept the {self.kept} episodes finished before the interrupt "
            f"({self.total} in {self.out})"
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


@dataclass
class _Run:
    """How far a collection got: what an interrupt has to close and report."""

    out: Path
    writer: Any = None
    first: int = 0  # episodes in the dataset before this run


def run_collect(cfg: CollectConfig) -> CollectSummary:
    """Collect ``cfg.episodes`` episodes (seeds ``seed..seed+episodes-1``) into ``cfg.out``.

    Raises ``CollectInterrupted`` on Ctrl-C, after committing the finished episodes.
    """
    run = _Run(out=Path(cfg.out))
    try:
        return _collect(cfg, run)
    except KeyboardInterrupt:  # also one that comes while closing the envs
        if run.writer is None:
            raise CollectInterrupted(0, None, run.out) from None
        run.writer.close()  # commits the finished episodes (the with block did already)
        total = run.writer.num_committed
        raise CollectInterrupted(total - run.first, total, run.out) from None


def _collect(cfg: CollectConfig, run: _Run) -> CollectSummary:
    """``run_collect``, keeping in ``run`` what an interrupt needs."""
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
        "terminate_on_success": cfg.terminate_on_success,
    }
    if cfg.cameras is not None:
        env_kwargs["cameras"] = cfg.cameras
    goals = {k: True for k in ("goal_cycle", "goal_state") if getattr(cfg, k)}
    if cfg.task.startswith("metaworld/") and goals:
        names = ", ".join(goals)
        raise ValueError(f"{names}: tabletop options; Meta-World tasks have one goal")
    env_kwargs |= goals
    runner: EpisodeRunner | None = None
    finished = False
    bar = progress_bar(total=cfg.episodes, desc=f"collect {cfg.task}")
    try:
        # Ctrl-C waits until the env is built: MuJoCo's extension module, interrupted while
        # the first env imports it, fails with an ImportError instead of a KeyboardInterrupt.
        with defer_interrupts():
            probe = sims.make(cfg.task, **env_kwargs)  # its spaces and names; never stepped
        try:
            run.writer = writer = open_episode_writer(
                run.out, probe, cfg.obs_mode, fps=cfg.fps, lossless=cfg.lossless
            )
        finally:
            probe.close()
        run.first = writer.num_episodes
        seeds = [cfg.seed + e for e in range(cfg.episodes)]
        # seed -> fraction of the episode kept, for the episodes that are cut off
        cut_at = {s: rng.uniform(0.3, 0.7) for s in seeds if rng.random() < cfg.cutoff}
        recipe = EpisodeRecipe(cfg.task, env_kwargs, cfg.policy, cfg.noise, cfg.record,
                               cfg.rewind, writer.settings, sims.task_module(cfg.task))  # fmt: skip
        jobs = [(index, seed, cut_at.get(seed)) for index, seed in enumerate(seeds)]
        with defer_interrupts():
            runner = EpisodeRunner(recipe, jobs, cfg.workers)
        successes = frames = rewound = added = 0  # added: jobs whose episodes are written
        start = time.perf_counter()

        def add(episodes: list[PreparedEpisode]) -> None:
            nonlocal successes, frames, rewound, added
            with defer_interrupts():  # a job is written and counted, or neither
                for episode in episodes:  # the episode, then its rewound copy when there is one
                    writer.add_episode(episode)
                    frames += episode.traj.length + 1
                successes += episodes[0].traj.success
                rewound += len(episodes) - 1
                added += 1
            bar.update(1)

        with writer:
            try:
                for episodes in runner:
                    add(episodes)
            except KeyboardInterrupt:  # the finished jobs not written yet, the one in hand too
                for episodes in runner.finished(added):
                    add(episodes)
                raise
        finished = True
    finally:
        bar.close()
        if runner is not None:
            runner.close(terminate=not finished)  # interrupted: the episodes not begun are dropped
    return CollectSummary(
        cfg.episodes, successes, frames, time.perf_counter() - start, rewound, run.out
    )
