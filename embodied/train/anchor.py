"""Behaviour-cloning terms for on-policy fine-tuning: every update may add the policy's own BC
loss on a batch of windows, from expert demonstrations (an anchor) or from the policy's own
rollouts that beat their group (self-imitation)::

    L = L_RL + anchor_coef * L_BC(expert windows) + imitate_coef * L_BC(own windows, A > 0)

``DemoAnchor`` is DAPG's augmented policy gradient (Rajeswaran et al. 2018): a multi-task policy
fine-tuned on some of its tasks moves weights that all of them share, the KL term only covers the
decisions it sampled, so the tasks left out of training can collapse; the anchor's batches come
from all the dataset's tasks and pull the policy back wherever it leaves the demonstrations.

``SelfImitation`` is Self-Imitation Learning (Oh et al. 2018) with the group mean as the
baseline: the windows of the iteration's trajectories whose advantage is positive. The clipped
ratio moves the probability of the sampled denoising chain, a few percent an iteration; the BC
loss moves what the policy predicts from the observation, so the greedy action the evaluation
runs goes where the sampled successes went. A rollout holds what the policy read and nothing of
the simulator's state, so training-only targets (``bc_loss(auxiliary=False)``) are left out.

Both draw their batches with the update's generator, so a resumed run sees the ones the
uninterrupted run would have seen.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from embodied.core.policy import Policy
from embodied.datasets import LeRobotDataset
from embodied.datasets.training import BCDataset
from embodied.rollout.episodes import decision_bc_windows
from embodied.train.bc import first_episodes_per_task
from embodied.train.loop import load_batch, to_device

if TYPE_CHECKING:
    from embodied.train.onpolicy import OnPolicyConfig


class BCTerm(ABC):
    """A BC loss added to an on-policy update with weight ``coef``, logged as ``stat``."""

    coef: float = 1.0
    stat: str = "bc_loss"

    @abstractmethod
    def loss(self, policy: Policy, rng: np.random.Generator) -> torch.Tensor:
        """``policy.bc_loss`` on a batch of the term's windows drawn with ``rng``."""

    def added_to(
        self, loss: torch.Tensor, policy: Policy, rng: np.random.Generator, stats: dict[str, float]
    ) -> torch.Tensor:
        """``loss + coef * L_BC``; the BC term's value goes in ``stats[stat]``."""
        bc = self.loss(policy, rng)
        stats[self.stat] = float(bc.detach())
        return loss + self.coef * bc


class DemoAnchor(BCTerm):
    """Expert windows of a LeRobot dataset shaped for ``policy``'s BC loss, drawn at random."""

    stat = "anchor_loss"

    def __init__(
        self,
        dataset: str,
        policy: Policy,
        batch_size: int,
        episodes_per_task: int = 0,
        coef: float = 1.0,
    ) -> None:
        """Open ``dataset`` and compute one loss on it, so data the policy cannot read (other
        features, action sizes or instructions) is an error naming the dataset before training.
        ``episodes_per_task``: the first k episodes of each task (BC's option of that name, so a
        policy trained on a subset is anchored to the demonstrations it learned); 0: all.
        ``coef``: the term's weight in ``added_to``."""
        self.batch_size = batch_size
        self.coef = coef
        try:
            spec = policy.observation_spec
            data = LeRobotDataset(dataset)
            self.windows = BCDataset(data, spec.n_obs_steps, policy.bc_horizon,
                                     episodes=first_episodes_per_task(
                                         data, episodes_per_task, "anchor_episodes_per_task"),
                                     keys=policy.training_keys())  # fmt: skip
            if len(self.windows) == 0:
                raise ValueError("it holds no frames")
            with torch.no_grad():
                self.loss(policy, np.random.default_rng(0))
        except (FileNotFoundError, KeyError, ValueError) as err:
            raise ValueError(f"anchor_dataset={dataset!r}: {err}") from None

    def loss(self, policy: Policy, rng: np.random.Generator) -> torch.Tensor:
        """``policy.bc_loss`` on ``batch_size`` windows drawn with ``rng``, on its device."""
        idx = rng.integers(0, len(self.windows), size=self.batch_size)
        return policy.bc_loss(load_batch(self.windows, idx, policy.device))


def demo_anchor(cfg: OnPolicyConfig, policy: Policy) -> DemoAnchor | None:
    """The BC anchor an on-policy run's ``anchor_*`` settings ask for (``OnPolicyConfig``), or
    None where ``anchor_coef`` is 0."""
    if cfg.anchor_coef <= 0:
        return None
    return DemoAnchor(cfg.anchor_dataset, policy, cfg.anchor_batch_size,
                      cfg.anchor_episodes_per_task, cfg.anchor_coef)  # fmt: skip


class SelfImitation(BCTerm):
    """The BC windows of every decision of the trajectories with a positive advantage."""

    stat = "imitate_loss"

    def __init__(
        self,
        trajs: Sequence[Any],
        advantages: np.ndarray,
        policy: Policy,
        batch_size: int,
        coef: float = 1.0,
    ) -> None:
        self.batch_size = batch_size
        self.coef = coef
        spec, horizon = policy.observation_spec, policy.bc_horizon
        chosen = [t for t, a in zip(trajs, advantages, strict=True) if a > 0]
        parts = [decision_bc_windows(t, spec, horizon) for t in chosen]
        self.windows = (
            {key: np.concatenate([p[key] for p in parts]) for key in parts[0]} if parts else {}
        )
        self.instructions = [t.instruction for t in chosen for _ in range(t.num_decisions)]

    def __len__(self) -> int:
        return len(self.instructions)

    def loss(self, policy: Policy, rng: np.random.Generator) -> torch.Tensor:
        """``policy.bc_loss`` on ``batch_size`` windows drawn with ``rng``, on its device."""
        idx = rng.integers(0, len(self), size=self.batch_size)
        batch = {key: torch.from_numpy(value[idx]) for key, value in self.windows.items()}
        batch["instruction"] = [self.instructions[i] for i in idx]
        # a rollout has no training-only target
        return policy.bc_loss(to_device(batch, policy.device), auxiliary=False)
