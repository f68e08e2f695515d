"""Behaviour cloning: ``embodied train bc CONFIG [key=value ...]``.

Reads top to bottom: load the LeRobot dataset -> build the policy from the dataset's features and
statistics -> AdamW + cosine schedule -> each step, one batch of Diffusion Policy windows (a pure
function of (seed, step), so ``resume`` continues exactly) -> periodic evaluation rollouts on
held-out seeds and checkpoints -> the final policy via ``save_pretrained``.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from embodied.core.run import RunDir, progress, seed_everything
from embodied.train.common import (
    OptimConfig,
    batch_indices,
    collate,
    latest_checkpoint,
    load_checkpoint,
    make_optimizer,
    resolve_device,
    save_checkpoint,
    to_device,
)


@dataclass
class BCConfig:
    """Behaviour-cloning run; every field can be overridden as ``key=value``."""

    dataset: str = "???"
    name: str = "bc"
    out: str = "runs"
    policy: str = "diffusion"
    policy_overrides: dict[str, Any] = field(default_factory=dict)
    n_obs_steps: int = 2
    horizon: int = 16
    steps: int = 3000
    batch_size: int = 64
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    device: str = "auto"
    eval_task: str = ""  # default: the task the dataset was recorded on
    eval_every: int = 1000
    eval_episodes: int = 10
    eval_seed: int = 100_000  # held-out: collection uses small seeds
    eval_workers: int = 1
    save_every: int = 1000
    log_every: int = 50
    resume: str = ""  # a run directory to continue from its latest checkpoint


def build_policy(cfg: BCConfig, dataset: Any) -> Any:
    """The policy named by ``cfg.policy``, shaped by the dataset, normalised by its statistics."""
    import embodied.policies  # noqa: F401  (registers the policy types)
    from embodied.core.policy import POLICIES
    from embodied.datasets.training import normalization_stats

    if cfg.policy not in POLICIES:
        raise ValueError(f"unknown policy {cfg.policy!r}; available: {', '.join(POLICIES)}")
    cls = POLICIES[cfg.policy]
    overrides = {"n_obs_steps": cfg.n_obs_steps, **cfg.policy_overrides}
    config = cls.config_from_dataset(
        dataset.features, dataset.tasks, horizon=cfg.horizon, **overrides
    )
    policy = cls(config)
    keys = [
        k
        for k in ("observation.state", "observation.environment_state", "action")
        if k in dataset.stats
    ]
    policy.fit_normalizers(normalization_stats(dataset, keys))
    return policy


def train_bc(cfg: BCConfig) -> RunDir:
    """Train, evaluate, checkpoint; return the run directory (final policy in ``policy/``)."""
    from embodied.datasets import LeRobotDataset
    from embodied.datasets.training import BCDataset
    from embodied.evaluation.suite import evaluate_policy
    from embodied.rollout.matching import env_options

    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    dataset = LeRobotDataset(cfg.dataset)
    task = cfg.eval_task or dataset.episodes_table()[0]["task_name"]

    policy = build_policy(cfg, dataset).to(device)
    windows = BCDataset(
        dataset, n_obs_steps=cfg.n_obs_steps, horizon=cfg.horizon, keys=policy.training_keys()
    )
    # Evaluation envs render only what the policy reads (no camera for a state-only policy).
    env_kwargs = env_options(policy.observation_spec)
    optimizer, scheduler = make_optimizer(policy.parameters(), cfg.optim, cfg.steps)
    run = RunDir(cfg.resume) if cfg.resume else RunDir.create(cfg.out, cfg.name, config=cfg)
    start = 0
    checkpoint = latest_checkpoint(run.checkpoints) if cfg.resume else None
    if checkpoint is not None:
        start, _ = load_checkpoint(checkpoint, policy, optimizer, scheduler)

    with run.metrics() as metrics:
        for step in progress(range(start, cfg.steps), total=cfg.steps - start, desc="bc"):
            idx = batch_indices(len(windows), cfg.batch_size, cfg.seed, step)
            batch = to_device(collate([windows[int(i)] for i in idx]), device)
            loss = policy.bc_loss(batch)
            if not torch.isfinite(loss):
                actions = batch["action"].float()
                raise FloatingPointError(
                    f"non-finite BC loss at step {step} (batch actions mean "
                    f"{actions.mean():.4g}, std {actions.std():.4g}); the last good checkpoint "
                    f"is {latest_checkpoint(run.checkpoints)}"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.optim.max_grad_norm)
            optimizer.step()
            scheduler.step()
            if hasattr(policy, "ema_update"):
                policy.ema_update()

            done = step + 1
            if done % cfg.log_every == 0 or done == cfg.steps:
                metrics.log({"bc/loss": loss.item(), "bc/lr": scheduler.get_last_lr()[0]}, done)
            if cfg.eval_episodes > 0 and (done % cfg.eval_every == 0 or done == cfg.steps):
                with policy.ema_weights() if hasattr(policy, "ema_weights") else nullcontext():
                    result = evaluate_policy(
                        policy,
                        task,
                        cfg.eval_episodes,
                        cfg.eval_seed,
                        env_kwargs,
                        workers=cfg.eval_workers,
                    )
                metrics.log(result.metrics(), done)
            if done % cfg.save_every == 0 or done == cfg.steps:
                save_checkpoint(run.checkpoints, done, policy, optimizer, scheduler)
    if hasattr(policy, "adopt_ema"):
        policy.adopt_ema()  # the averaged weights are the ones evaluated and handed on
    policy.save_pretrained(run.path / "policy")
    return run
