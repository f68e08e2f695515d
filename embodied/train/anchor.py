"""A behaviour-cloning anchor for on-policy fine-tuning: every update adds the policy's own BC
loss on a batch of expert windows (DAPG's augmented policy gradient, Rajeswaran et al. 2018)::

    L = L_RL + anchor_coef * L_BC(expert windows of every task in the dataset)

A multi-task policy fine-tuned on some of its tasks moves weights that all of them share; the KL
term only covers the decisions it sampled, so the tasks left out of training can collapse. The
anchor's batches come from all the dataset's tasks and pull the policy back wherever it leaves
the demonstrations. Its batches are a pure function of (seed, iteration), so a resumed run sees
the ones the uninterrupted run would have seen.
"""

from __future__ import annotations

import numpy as np
import torch

from embodied.core.policy import Policy
from embodied.datasets import LeRobotDataset
from embodied.datasets.training import BCDataset
from embodied.train.loop import load_batch


class DemoAnchor:
    """Expert windows of a LeRobot dataset shaped for ``policy``'s BC loss, drawn at random."""

    def __init__(self, dataset: str, policy: Policy, batch_size: int) -> None:
        """Open ``dataset`` and compute one loss on it, so data the policy cannot read (other
        features, action sizes or instructions) is an error naming the dataset before training."""
        self.batch_size = batch_size
        try:
            spec = policy.observation_spec
            self.windows = BCDataset(LeRobotDataset(dataset), spec.n_obs_steps,
                                     policy.bc_horizon, keys=policy.training_keys())  # fmt: skip
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
