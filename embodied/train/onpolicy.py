"""What the on-policy trainers (GRPO, TPO) share: the starting policy with RL overrides, env
options, grouped rollouts that record every decision, the decisions flattened for minibatches,
their log-probs recomputed with gradients, and the drift check before the first update."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.core.features import ObservationSpec
from embodied.core.reward import RewardModel


def load_policy(path: str, overrides: dict[str, Any], device: torch.device) -> Any:
    """The starting policy with ``policy_overrides`` applied to its config (weights unchanged)."""
    from embodied.policies import Policy

    policy = Policy.from_pretrained(path)
    if overrides:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(policy.config)}
        if unknown:
            raise ValueError(
                f"policy_overrides names {sorted(unknown)}, which the {policy.policy_type} "
                "config does not have"
            )
        config = dataclasses.replace(policy.config, **overrides)
        rebuilt = type(policy)(config)
        rebuilt.load_state_dict(policy.state_dict())
        policy = rebuilt
    return policy.to(device)


def env_kwargs(policy: Any, reward_model: RewardModel) -> dict[str, Any]:
    """Env options giving the policy its inputs and a frame-reading reward model its camera (the
    first one: ``front`` on the tabletop) at its size."""
    from embodied.rollout.matching import env_options

    kwargs = env_options(policy.observation_spec)
    size = reward_model.image_size
    if size is not None:
        if kwargs["obs_mode"] == "state":
            kwargs.update(obs_mode="pixels_state", image_size=tuple(size))
        elif tuple(kwargs["image_size"]) != tuple(size):
            raise ValueError(
                f"the policy reads {kwargs.get('cameras', 'the default camera')} at "
                f"{kwargs['image_size']} but the reward model scores the first camera at "
                f"{tuple(size)}; train them on the same frames"
            )
    elif kwargs["obs_mode"] == "state" and reward_model.reward_type == "judge":
        kwargs.update(obs_mode="pixels_state")  # the judge resizes whatever camera it gets
    return kwargs


def rollout_groups(rollouts: Any, seeds: list[int], group_size: int, sample_seed: int) -> list:
    """``group_size`` stochastic rollouts from each seed, group by group, decisions recorded, on
    a ``embodied.rollout.backends`` backend (local or Ray: the same trajectories either way)."""
    from embodied.sims.vector import grouped_seeds

    return rollouts.run(grouped_seeds(seeds, group_size), sample_seed, deterministic=False)


@dataclass
class Decisions:
    """Every recorded decision of the kept trajectories, flattened for minibatches."""

    obs: dict[str, torch.Tensor]  # feature -> [N, n_obs_steps, ...]
    instructions: list[str]
    outputs: dict[str, torch.Tensor]  # policy_outputs -> [N, ...]
    old_log_prob: torch.Tensor  # [N, K] recorded at sampling time
    mask: torch.Tensor  # [N, K]
    sampled_log_prob: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    trajectory: torch.Tensor  # [N] index of the decision's trajectory

    def __len__(self) -> int:
        return len(self.instructions)

    def take(self, index: np.ndarray) -> Decisions:
        """The decisions at ``index``."""
        i = torch.as_tensor(index, dtype=torch.long)
        return Decisions(
            {k: v[i] for k, v in self.obs.items()},
            [self.instructions[j] for j in index],
            {k: v[i] for k, v in self.outputs.items()},
            self.old_log_prob[i],
            self.mask[i],
            self.sampled_log_prob[i],
            self.advantages[i],
            self.trajectory[i],
        )


def trajectory_totals(
    per_decision: torch.Tensor, trajectory: torch.Tensor, size: int
) -> torch.Tensor:
    """``[size]``: the sum of ``per_decision`` ``[N]`` over each trajectory's decisions
    (``trajectory [N]`` says whose); 0 for a trajectory with none."""
    zeros = torch.zeros(size, device=per_decision.device, dtype=per_decision.dtype)
    return zeros.index_add(0, trajectory.to(per_decision.device), per_decision)


def collect_decisions(trajs: list[Any], advantages: np.ndarray, spec: ObservationSpec) -> Decisions:
    """Flatten the trajectories' decisions, each with its trajectory's advantage."""
    from embodied.rollout.episodes import decision_windows

    obs: dict[str, list[np.ndarray]] = {}
    outputs: dict[str, list[np.ndarray]] = {}
    instructions: list[str] = []
    adv: list[float] = []
    owner: list[int] = []
    for index, (traj, a) in enumerate(zip(trajs, advantages, strict=True)):
        for key, value in decision_windows(traj, spec).items():
            obs.setdefault(key, []).append(value)
        for key, value in traj.policy_outputs.items():
            outputs.setdefault(key, []).append(np.asarray(value))
        instructions += [traj.instruction] * traj.num_decisions
        adv += [float(a)] * traj.num_decisions
        owner += [index] * traj.num_decisions
    flat = {k: torch.from_numpy(np.concatenate(v)) for k, v in outputs.items()}
    old = flat.pop("log_probs").float()
    sampled = flat.pop("sampled_log_prob").float()
    return Decisions(
        obs={k: torch.from_numpy(np.concatenate(v)) for k, v in obs.items()},
        instructions=instructions,
        outputs=flat,
        old_log_prob=old,
        mask=torch.ones_like(old, dtype=torch.bool),
        sampled_log_prob=sampled,
        advantages=torch.tensor(adv, dtype=torch.float32),
        trajectory=torch.tensor(owner, dtype=torch.long),
    )


def element_log_probs(policy: Any, batch: Decisions, device: torch.device) -> torch.Tensor:
    """``Policy.log_prob`` of a minibatch's recorded decisions ``[N, K]``, with gradients."""
    obs = {k: v.to(device) for k, v in batch.obs.items()}
    outputs = {k: v.to(device) for k, v in batch.outputs.items()}
    return policy.log_prob(obs, batch.instructions, outputs).reshape(len(batch), -1)


def check_ratio(log_prob: torch.Tensor, batch: Decisions, tolerance: float) -> float:
    """Max |ratio - 1| between the recomputed and the recorded log-probs before any update;
    stop with a clear message when it exceeds ``tolerance`` (the policy drifted)."""
    ratio = torch.exp(log_prob.detach().cpu() - batch.old_log_prob)
    worst = float((ratio - 1).abs().max())
    if not np.isfinite(worst) or worst > tolerance:
        raise RuntimeError(
            f"log-prob recomputation drifted from sampling: max |ratio - 1| = {worst:.3g} > "
            f"{tolerance} before any update (is the policy deterministic in eval mode, dropout "
            "off, the same weights used to act and to recompute?)"
        )
    return worst


def optimizer_step(loss: torch.Tensor, policy: Any, optimizer: Any, max_grad_norm: float,
                   where: str, checkpoints: Any) -> float:  # fmt: skip
    """One clipped gradient step on ``loss``; return the gradient norm before clipping. A
    non-finite loss stops the run, saying ``where`` (e.g. "GRPO loss at iteration 3") and which
    checkpoint in ``checkpoints`` is the last good one."""
    if not torch.isfinite(loss):
        from embodied.train.common import latest_checkpoint

        last = latest_checkpoint(checkpoints)
        raise FloatingPointError(f"non-finite {where}; the last good checkpoint is {last}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return float(norm)


def mean_stats(stats: list[dict[str, float]], prefix: str = "update/") -> dict[str, float]:
    """The mean of each statistic over an update's minibatches, keys prefixed."""
    return {f"{prefix}{key}": float(np.mean([s[key] for s in stats])) for key in stats[0]}


class Iterations:
    """What ends every on-policy iteration: evaluation on held-out seeds when due, the metrics
    line, and a checkpoint when due (``cfg`` has ``task``, ``eval_episodes``, ``eval_every``,
    ``eval_seed``, ``eval_envs``, ``save_every``; ``total`` iterations)."""

    def __init__(self, cfg: Any, total: int, policy: Any, env_kwargs: dict[str, Any],
                 run: Any, metrics: Any, optimizer: Any, scheduler: Any) -> None:  # fmt: skip
        self.cfg, self.total, self.policy, self.env_kwargs = cfg, total, policy, env_kwargs
        self.run, self.metrics = run, metrics
        self.optimizer, self.scheduler = optimizer, scheduler

    def evaluate(self) -> dict[str, float]:
        """Success on ``eval_episodes`` held-out seeds (one batched vector env): deterministic
        (``eval/``) and, with ``cfg.eval_sampled``, sampling as the rollouts do
        (``eval_sampled/``: what RL optimises)."""
        from embodied.evaluation.suite import evaluate_policy

        cfg = self.cfg
        out: dict[str, float] = {}
        modes = [True, False] if getattr(cfg, "eval_sampled", False) else [True]
        for deterministic in modes:
            result = evaluate_policy(
                self.policy, cfg.task, cfg.eval_episodes, cfg.eval_seed, self.env_kwargs,
                cfg.eval_envs, asynchronous=False, deterministic=deterministic,
            )  # fmt: skip
            out |= result.metrics("eval" if deterministic else "eval_sampled")
        return out

    def finish(self, done: int, log: dict[str, float]) -> None:
        """Evaluate and checkpoint when due; log iteration ``done``."""
        from embodied.train.common import save_checkpoint

        cfg, last = self.cfg, done == self.total
        if cfg.eval_episodes > 0 and (done % cfg.eval_every == 0 or last):
            log.update(self.evaluate())
        self.metrics.log(log, done)
        if done % cfg.save_every == 0 or last:
            save_checkpoint(self.run.checkpoints, done, self.policy, self.optimizer, self.scheduler)
