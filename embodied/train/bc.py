"""Behaviour cloning: ``embodied train bc CONFIG [key=value ...]``.

Reads top to bottom: load the LeRobot dataset -> build the policy from the dataset's features and
statistics -> AdamW + cosine schedule -> each step, one batch of Diffusion Policy windows (a pure
function of (seed, step), so ``resume`` continues exactly) -> periodic evaluation rollouts on
held-out seeds and checkpoints -> the final policy via ``save_pretrained``.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import embodied.policies  # noqa: F401  (registers the built-in policy types)
from embodied.core.config import seed_setting, setting
from embodied.core.policy import POLICIES, Policy
from embodied.core.run import RunDir
from embodied.datasets import LeRobotDataset
from embodied.datasets.training import BCDataset, normalization_stats
from embodied.evaluation.suite import evaluate_policy
from embodied.rollout.matching import env_options
from embodied.train.loop import Trainer, batch_indices, begin, load_batch, load_policy
from embodied.train.optim import OptimConfig

MEMORY_SHARE = 0.5  # a batch may take at most this share of the machine's memory


@dataclass
class BCConfig:
    """Behaviour-cloning run; every field can be overridden as ``key=value``."""

    dataset: str = "???"
    name: str = "bc"
    out: str = "runs"
    policy: str = "diffusion"
    policy_overrides: dict[str, Any] = field(default_factory=dict)
    n_obs_steps: int | None = setting(None, low=1)  # None: the policy's own default
    horizon: int | None = setting(None, low=1)  # actions per window; None: the policy's default
    # > 0: train on the first this many episodes of each task only (a few-demonstration run)
    episodes_per_task: int = setting(0, low=0)
    steps: int = setting(3000, low=1)
    # > 0: stop after the last step that fits in this many minutes (the schedule still spans steps)
    max_minutes: float = setting(0.0, low=0.0)
    batch_size: int = setting(64, low=1)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = seed_setting()
    device: str = "auto"
    eval_task: str = ""  # default: the task the dataset was recorded on
    eval_every: int = setting(1000, low=1)
    eval_episodes: int = setting(10, low=0)
    eval_seed: int = seed_setting(100_000)  # held-out: collection uses small seeds
    eval_workers: int = setting(1, low=1)
    save_every: int = setting(1000, low=0)  # 0: only at the end
    log_every: int = setting(50, low=1)
    resume: str = ""  # a run directory to continue from its latest checkpoint
    # A saved policy to start from instead of a new one: its config, weights and normalisation
    # are kept (a DAgger round on more data, or fine-tuning); policy must name its type.
    init_policy: str = ""


def build_policy(
    cfg: BCConfig, dataset: LeRobotDataset, episodes: list[int] | None = None
) -> Policy:
    """The policy named by ``cfg.policy``, shaped by the dataset, normalised by the statistics
    of the episodes it trains on (``episodes``, else all)."""
    if cfg.policy not in POLICIES:
        raise ValueError(f"unknown policy {cfg.policy!r}; available: {', '.join(POLICIES)}")
    cls = POLICIES[cfg.policy]
    overrides = dict(cfg.policy_overrides)
    if cfg.n_obs_steps is not None:
        overrides.setdefault("n_obs_steps", cfg.n_obs_steps)
    config = cls.config_from_dataset(
        dataset.features, dataset.tasks, horizon=cfg.horizon, **overrides
    )
    policy = cls(config)
    # Cameras too: a policy may normalise images by their statistics (LeRobot's do).
    wanted = ("observation.state", "observation.environment_state", "action",
              *policy.observation_spec.cameras)  # fmt: skip
    keys = [k for k in wanted if k in dataset.stats]
    policy.fit_normalizers(normalization_stats(dataset, keys, episodes))
    return policy


def start_policy(
    cfg: BCConfig, dataset: LeRobotDataset, device: torch.device, episodes: list[int] | None = None
) -> Policy:
    """The policy to train: a new one (``build_policy``), or the saved ``init_policy`` with
    ``policy_overrides`` applied; a type, ``n_obs_steps`` or ``horizon`` that differs from the
    saved one is an error naming both."""
    if not cfg.init_policy:
        return build_policy(cfg, dataset, episodes).to(device)
    policy = load_policy(cfg.init_policy, cfg.policy_overrides, device)
    if policy.policy_type != cfg.policy:
        raise ValueError(
            f"init_policy={cfg.init_policy!r} is a {policy.policy_type!r} policy, but "
            f"policy = {cfg.policy!r}"
        )
    built = {"n_obs_steps": policy.observation_spec.n_obs_steps, "horizon": policy.bc_horizon}
    for key, saved in built.items():
        asked = getattr(cfg, key)
        if asked is not None and asked != saved:
            raise ValueError(
                f"{key} = {asked}, but init_policy={cfg.init_policy!r} was built with {saved}"
            )
    return policy


def first_episodes_per_task(
    dataset: LeRobotDataset, per_task: int, setting: str = "episodes_per_task"
) -> list[int] | None:
    """The indices of the first ``per_task`` episodes of each task (its ``task_name``, or its
    instructions in a dataset LeRobot wrote), or None (every episode) at 0; a task with fewer
    episodes is an error naming it and the ``setting`` that asked."""
    if per_task == 0:
        return None
    by_task: dict[str, list[int]] = {}
    for row in dataset.episodes_table():
        task = row.get("task_name") or " / ".join(row["tasks"])
        by_task.setdefault(task, []).append(int(row["episode_index"]))
    short = {task: len(eps) for task, eps in by_task.items() if len(eps) < per_task}
    if short:
        task, count = next(iter(short.items()))
        raise ValueError(
            f"{setting} = {per_task}, but {dataset.root} has only {count} episodes of task {task!r}"
        )
    return sorted(e for eps in by_task.values() for e in eps[:per_task])


def check_batch_memory(cfg: BCConfig, windows: BCDataset) -> None:
    """Refuse a batch size whose batches cannot fit in this machine's memory, naming both."""
    item = windows[0]
    per_window = sum(v.numel() * v.element_size() for v in item.values() if hasattr(v, "numel"))
    need = cfg.batch_size * per_window
    total = (
        os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    )
    if total and need > MEMORY_SHARE * total:
        raise ValueError(
            f"batch_size = {cfg.batch_size} needs {need / 2**30:.1f} GiB per batch "
            f"({per_window / 2**20:.2f} MiB a window); this machine has {total / 2**30:.0f} GiB: "
            f"use at most {int(MEMORY_SHARE * total // per_window)}"
        )


def train_bc(cfg: BCConfig) -> RunDir:
    """Train, evaluate, checkpoint; return the run directory (final policy in ``policy/``)."""
    device = begin(cfg)
    dataset = LeRobotDataset(cfg.dataset)
    task = cfg.eval_task or dataset.episodes_table()[0].get("task_name")
    if not task and cfg.eval_episodes > 0:
        raise ValueError(
            f"{cfg.dataset}: its episodes do not name the task they were recorded on (no "
            "'task_name' column: a dataset LeRobot wrote); set eval_task=TASK or eval_episodes=0"
        )
    episodes = first_episodes_per_task(dataset, cfg.episodes_per_task)
    policy = start_policy(cfg, dataset, device, episodes)
    spec = policy.observation_spec
    windows = BCDataset(dataset, spec.n_obs_steps, policy.bc_horizon,
                        keys=policy.training_keys(), episodes=episodes)  # fmt: skip
    check_batch_memory(cfg, windows)
    # Evaluation envs render only what the policy reads (no camera for a state-only policy).
    env_kwargs = env_options(spec)

    with Trainer(cfg, policy, "steps") as trainer:
        for step in trainer.steps("bc"):
            idx = batch_indices(len(windows), cfg.batch_size, cfg.seed, step)
            batch = load_batch(windows, idx, device)
            loss = policy.bc_loss(batch)
            trainer.update(loss, f"BC loss at step {step} (batch actions mean "
                           f"{np.mean(batch['action'].float().cpu().numpy()):.4g})")  # fmt: skip
            if hasattr(policy, "ema_update"):
                policy.ema_update()
            done = step + 1
            if trainer.due(done, cfg.log_every):
                terms = {f"bc/{k}": float(v) for k, v in policy.bc_terms.items()}
                lr = trainer.scheduler.get_last_lr()[0]
                trainer.metrics.log({"bc/loss": loss.item(), "bc/lr": lr, **terms}, done)
            if cfg.eval_episodes > 0 and trainer.due(done, cfg.eval_every):
                with policy.ema_weights() if hasattr(policy, "ema_weights") else nullcontext():
                    result = evaluate_policy(policy, task, cfg.eval_episodes, cfg.eval_seed,
                                             env_kwargs, workers=cfg.eval_workers)  # fmt: skip
                trainer.metrics.log(result.metrics(), done)
            if trainer.due(done, cfg.save_every):
                trainer.save(done)
    if hasattr(policy, "adopt_ema"):
        policy.adopt_ema()  # the averaged weights are the ones evaluated and handed on
    policy.save_pretrained(trainer.run.path / "policy")
    return trainer.run
