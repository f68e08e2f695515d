"""``TrajectoryBuilder``: records one episode step by step inside a rollout loop and stacks it
into a validated ``Trajectory``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from embodied.core.arraytree import (
    copy_tree,
    key_names,
    leaf_name,
    numeric_array,
    stack_named,
    unflatten_tree,
)
from embodied.core.trajectory import Trajectory

__all__ = ["TrajectoryBuilder"]


class TrajectoryBuilder:
    """Collects one episode step by step inside a rollout loop, then stacks it into a Trajectory.

    Every observation, action and policy output is copied on entry, so environments and
    policies may reuse their buffers. ``info_step`` keeps only numeric or bool values (Python
    scalars, numpy scalars or arrays); strings, None, nested dicts and other non-numeric values
    are skipped. The kept keys must be the same at every step.
    """

    def __init__(
        self,
        first_obs: Mapping[str, Any],
        *,
        instruction: str = "",
        task: str = "",
        suite: str = "",
        seed: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Start an episode from the observation returned by ``env.reset``."""
        self.instruction = instruction
        self.task = task
        self.suite = suite
        self.seed = seed
        self.metadata = dict(metadata) if metadata is not None else {}
        self._observations = [copy_tree(first_obs)]
        self._actions: list[np.ndarray] = []
        self._rewards: list[float] = []
        self._terminated: list[bool] = []
        self._truncated: list[bool] = []
        self._info: dict[str, list[np.ndarray]] = {}
        self._decision_steps: list[int] = []
        self._decision_outputs: list[dict[tuple[str, ...], np.ndarray]] = []

    @property
    def num_steps(self) -> int:
        """Number of steps added so far."""
        return len(self._actions)

    def add_step(
        self,
        action: Any,
        obs: Mapping[str, Any],
        reward: float,
        terminated: bool,
        truncated: bool,
        info_step: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one env step: the executed action [A] and what ``env.step`` returned."""
        step = self.num_steps
        action = np.array(action, dtype=np.float32)
        if action.ndim != 1:
            raise ValueError(f"action at step {step} must be 1-D [A], got shape {action.shape}")
        if self._actions and action.shape != self._actions[0].shape:
            raise ValueError(
                f"action at step {step} has shape {action.shape} but the action at step 0 "
                f"has shape {self._actions[0].shape}"
            )
        observation = copy_tree(obs)
        if observation.keys() != self._observations[0].keys():
            raise ValueError(
                f"observation after step {step} has keys {key_names(observation)} but the "
                f"first observation has {key_names(self._observations[0])}"
            )

        kept = {}
        for key, value in (info_step or {}).items():
            array = numeric_array(value)
            if array is not None:
                kept[key] = array
        if step == 0:
            self._info = {key: [] for key in kept}
        elif kept.keys() != self._info.keys():
            raise ValueError(
                f"info at step {step} has numeric keys {sorted(kept)} but step 0 had "
                f"{sorted(self._info)}; info keys must be the same at every step"
            )

        self._actions.append(action)
        self._observations.append(observation)
        self._rewards.append(float(reward))
        self._terminated.append(bool(terminated))
        self._truncated.append(bool(truncated))
        for key, array in kept.items():
            self._info[key].append(array)

    def add_decision(self, step_index: int, outputs: Mapping[str, Any]) -> None:
        """Record what the policy emitted when it decided at env step ``step_index``."""
        step_index = int(step_index)
        if step_index < 0 or step_index > self.num_steps:
            raise ValueError(
                f"decision step {step_index} must be in [0, {self.num_steps}] "
                f"({self.num_steps} steps recorded so far)"
            )
        if self._decision_steps and step_index <= self._decision_steps[-1]:
            raise ValueError(
                f"decision steps must be strictly increasing: {step_index} follows "
                f"{self._decision_steps[-1]}"
            )
        copied = copy_tree(outputs)
        if self._decision_outputs and copied.keys() != self._decision_outputs[0].keys():
            raise ValueError(
                f"policy outputs at step {step_index} have keys {key_names(copied)} but the "
                f"first decision had {key_names(self._decision_outputs[0])}"
            )
        self._decision_steps.append(step_index)
        self._decision_outputs.append(copied)

    def build(self, success: bool | None = None) -> Trajectory:
        """Stack everything into a validated Trajectory.

        ``success`` defaults to ``bool(info["success"][-1])`` when that info key exists, else False.
        """
        observations = {
            path: stack_named(
                leaf_name("observations", path), [o[path] for o in self._observations]
            )
            for path in self._observations[0]
        }
        # With no steps the action dimension is unknown; (0, 0) keeps actions 2-D.
        actions = np.stack(self._actions) if self._actions else np.zeros((0, 0), np.float32)
        info = {key: stack_named(leaf_name("info", (key,)), v) for key, v in self._info.items()}
        policy_outputs = {}
        if self._decision_outputs:
            for path in self._decision_outputs[0]:
                arrays = [outputs[path] for outputs in self._decision_outputs]
                policy_outputs[path] = stack_named(leaf_name("policy_outputs", path), arrays)
        if success is None:
            success = bool(info["success"][-1]) if "success" in info else False
        return Trajectory(
            observations=unflatten_tree(observations),
            actions=actions,
            rewards=np.array(self._rewards, dtype=np.float32),
            terminated=np.array(self._terminated, dtype=bool),
            truncated=np.array(self._truncated, dtype=bool),
            success=bool(success),
            instruction=self.instruction,
            task=self.task,
            suite=self.suite,
            seed=self.seed,
            info=info,
            policy_outputs=unflatten_tree(policy_outputs),
            decision_steps=np.array(self._decision_steps, dtype=np.int64),
            metadata=dict(self.metadata),
        ).validate()
