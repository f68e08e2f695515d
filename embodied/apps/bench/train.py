"""``embodied bench train``: training steps/s, glibc's default malloc against kept memory; and a
GRPO update of the diffusion planner with the toolkit's Mish against torch's ``nn.Mish``, and
recomputing one block of each denoising chain (``update_steps``) against all of it."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.apps.allocator import keep_freed_memory
from embodied.apps.bench.common import (
    Row,
    median_rate,
    paired_rates,
    random_observation,
    tabletop_features,
)
from embodied.apps.bench.policy import POLICY_VARIANTS
from embodied.core.nn import Mish
from embodied.policies import DiffusionPolicy
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.train.loop import resolve_device, to_device
from embodied.train.onpolicy import Decisions, element_log_probs


@dataclass
class TrainRow(Row):
    """Training steps/s (forward, backward, AdamW) of a model with one malloc setting (or one
    activation), against glibc's default setting (torch's ``nn.Mish``) in the same process."""

    model: str
    batch: int
    setting: str  # malloc's ("glibc default", "keep freed memory") or the Mish the model runs
    steps_per_s: float
    baseline: str
    speedup: float  # steps/s / baseline steps/s


def bench_train(
    image_size: int = 96,
    batch_size: int = 32,
    steps: int = 3,
    repeats: int = 3,
    device: str = "cpu",
    progress: Any = None,
) -> list[TrainRow]:
    """Training steps/s of the default progress reward model (clips of 8 frames) and the diffusion
    planner (BC) at ``image_size`` on ``device`` (``auto``: CUDA when available; batches already
    there), with glibc's default malloc and with ``keep_freed_memory``, the default first. Off
    glibc the one row per model is the system's malloc."""

    where = resolve_device(device)
    rng = np.random.default_rng(0)
    tasks = ["put the red block on the green plate", "push the blue block to the purple plate"]
    text = [tasks[i % len(tasks)] for i in range(batch_size)]
    reward = ProgressRewardModel(ProgressConfig(image_size=image_size)).to(where)
    reward_batch = {
        "frames": torch.from_numpy(
            rng.integers(0, 256, (batch_size, 8, image_size, image_size, 3), dtype=np.uint8)
        ),
        "progress": torch.rand(batch_size, 8),
        "success": torch.zeros(batch_size),
        "instruction": text,
    }
    config = DiffusionPolicy.config_from_dataset(tabletop_features(image_size), tasks)
    planner = DiffusionPolicy(config).to(where)
    planner_batch = {
        **random_observation(planner, batch_size, rng),
        "action": torch.zeros(batch_size, config.horizon, 4),
        "action_is_pad": torch.zeros(batch_size, config.horizon, dtype=torch.bool),
        "instruction": text,
    }
    reward_batch, planner_batch = to_device(reward_batch, where), to_device(planner_batch, where)
    jobs = [
        ("progress (default)", reward, lambda: reward.loss(reward_batch)),
        ("diffusion BC", planner, lambda: planner.bc_loss(planner_batch)),
    ]
    glibc = keep_freed_memory(False, respect_environment=False)
    settings = [("glibc default", False), ("keep freed memory", True)] if glibc else []
    rows = []
    try:
        for label, model, loss in jobs:
            run = training_steps(model, loss, lr=1e-4)
            if not glibc:  # one row: whatever malloc this system has
                rate = median_rate(run, steps, repeats, where)
                rows.append(TrainRow(label, batch_size, "system malloc", rate, "itself", 1.0))
            base = None
            for name, keep in settings:
                keep_freed_memory(keep, respect_environment=False)
                if progress is not None:
                    progress(f"train {label} at batch {batch_size}, {name}")
                rate = median_rate(run, steps, repeats, where)
                base = base or rate
                rows.append(TrainRow(label, batch_size, name, rate, settings[0][0], rate / base))
    finally:
        keep_freed_memory(True)  # as `embodied` runs (glibc defaults if the user set malloc's)
    return rows + grpo_update_rows(4 * batch_size, steps, repeats, where, progress)


def grpo_update_rows(
    decisions: int, steps: int, repeats: int, where: torch.device, progress: Any = None
) -> list[TrainRow]:
    """Steps/s of GRPO's update of ``configs/bc_diffusion.yaml``'s planner (log-probs of
    ``decisions`` recorded decisions over 10 stochastic denoising steps, backward, AdamW) with
    the toolkit's ``Mish`` and with torch's ``nn.Mish`` in a copy, timed in turn."""
    tasks = ["put the red block on the green plate"]
    state_planner = POLICY_VARIANTS[1][2]  # configs/bc_diffusion.yaml's: object tokens, no camera
    config = DiffusionPolicy.config_from_dataset(
        tabletop_features(64, env_state=True), tasks, **state_planner, finetune_steps=10,
        cond_mlp_dims=[256, 256],
    )  # fmt: skip
    ours = DiffusionPolicy(config).to(where).eval()
    theirs = with_torch_mish(copy.deepcopy(ours))
    obs = to_device(random_observation(ours, decisions, np.random.default_rng(0)), where)
    text = tasks * decisions
    with torch.no_grad():
        outputs = ours.act(obs, text, generator=torch.Generator(where).manual_seed(0))
    recorded = outputs.policy_outputs

    def update(policy: DiffusionPolicy) -> Any:
        return training_steps(policy, lambda: policy.log_prob(obs, text, recorded).mean(), lr=1e-5)

    def blocks(size: int) -> Any:  # GRPO's update_steps: one random block of each chain
        old = recorded["log_probs"]
        owner = torch.zeros(decisions, dtype=torch.long)
        data = Decisions(obs, text, recorded, old, torch.ones_like(old), old.sum(-1),
                         torch.zeros(decisions), owner)  # fmt: skip
        rng = np.random.default_rng(0)
        return training_steps(
            ours, lambda: element_log_probs(ours, data.step_blocks(size, rng), where).mean(), 1e-5
        )

    if progress is not None:
        progress(f"train GRPO update of {decisions} decisions, torch's Mish and the toolkit's")
    runs = {"torch": update(theirs), "ours": update(ours), 5: blocks(5), 2: blocks(2)}
    rates = paired_rates(runs, steps, repeats, where)
    label = f"diffusion GRPO update ({decisions} decisions x 10 steps)"
    baseline = "nn.Mish (torch)"
    blocks_label = f"diffusion GRPO update ({decisions} decisions, update_steps of 10)"
    return [
        TrainRow(label, decisions, baseline, rates["torch"], baseline, 1.0),
        TrainRow(label, decisions, "Mish (embodied.core.nn)", rates["ours"], baseline,
                 rates["ours"] / rates["torch"]),
    ] + [
        TrainRow(blocks_label, decisions, f"update_steps={size}", rates[size], "all 10 steps",
                 rates[size] / rates["ours"])
        for size in (5, 2)
    ]  # fmt: skip


def training_steps(model: nn.Module, loss: Any, lr: float) -> Any:
    """``run(n)``: ``n`` AdamW steps of ``model`` on ``loss()`` (zero the gradients, backward,
    step), the unit every row here times."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def run(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            loss().backward()
            optimizer.step()

    return run


def with_torch_mish(module: nn.Module) -> nn.Module:
    """``module`` with every toolkit ``Mish`` replaced by torch's ``nn.Mish`` (in place)."""
    for name, child in module.named_children():
        if isinstance(child, Mish):
            setattr(module, name, nn.Mish())
        else:
            with_torch_mish(child)
    return module
