"""The core data type: one episode as numpy arrays (``Trajectory``); ``TrajectoryBuilder``
(``embodied.core.trajectory_builder``) records one step by step.

Layout of one ``Trajectory`` with T environment steps and K policy decisions:

- ``observations``: ``{key: [T+1, ...]}``; a value may also be a dict of arrays, one level deep
  (``observations["pixels"] = {"front": uint8[T+1,H,W,3], "wrist": ...}``).
- ``actions [T, A]``, ``rewards [T]``, ``terminated [T]``, ``truncated [T]``,
  ``info {key: [T, ...]}``.
- ``policy_outputs {key: [K, ...]}`` and ``decision_steps int64 [K]``: decision k was taken at
  env step ``decision_steps[k]``.

Conventions:

- Construction is cheap and does not check anything; call ``validate()`` (the builder and
  ``from_dict`` do) to get a ``ValueError`` naming the offending field.
- ``slice`` returns numpy views of the observation/action/info arrays; copy before mutating.
- Numpy only: algorithms batch the decisions they need themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embodied.core.arraytree import (
    arrays_equal,
    first_non_finite,
    flatten_tree,
    leaf_name,
    trees_equal,
    unflatten_tree,
)

__all__ = [
    "ArrayTree",
    "Trajectory",
    "follow_observations",
    "trajectories_equal",
]

# A dict of arrays whose values may themselves be dicts of arrays (one level of nesting).
ArrayTree = dict[str, np.ndarray | dict[str, np.ndarray]]

# Keys of the dict-of-arrays fields, as used in ``to_dict`` ("observations/pixels/front").
_TREE_FIELDS = ("observations", "info", "policy_outputs")
_ARRAY_FIELDS = ("actions", "rewards", "terminated", "truncated", "decision_steps")
_REQUIRED_SCALARS = ("success", "instruction", "task", "suite")


# ---------------------------------------------------------------------------------------------
# Trajectory
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class Trajectory:
    """One episode as numpy arrays; what every algorithm consumes and every dataset stores."""

    observations: ArrayTree
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: bool = False
    instruction: str = ""
    task: str = ""
    suite: str = ""
    seed: int | None = None
    info: ArrayTree = field(default_factory=dict)
    policy_outputs: ArrayTree = field(default_factory=dict)
    decision_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    metadata: dict[str, Any] = field(default_factory=dict)
    # Rendered RGB frames uint8 [T+1, H, W, 3] when the rollout captured video (for MP4s and
    # reports); not part of to_dict or datasets, which store the observations.
    frames: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        """Number of environment steps T (there are T+1 observations)."""
        return int(self.actions.shape[0])

    @property
    def ever_succeeded(self) -> bool:
        """Whether the success flag was raised at any step: what a benchmark counts (Meta-World's
        convention) and what evaluation and the RL returns read. ``success`` is the last step's
        flag, what a success detector sees in the final frames; the two agree wherever an
        episode ends at its first success."""
        flags = self.info.get("success") if isinstance(self.info, dict) else None
        if flags is not None and len(flags):
            return bool(np.any(flags))
        return bool(self.success)

    @property
    def action_dim(self) -> int:
        """Size A of one action vector."""
        return int(self.actions.shape[1])

    @property
    def num_decisions(self) -> int:
        """Number K of policy decisions recorded in ``policy_outputs``."""
        return int(len(self.decision_steps))

    def __repr__(self) -> str:
        """Short summary instead of dumping every array."""
        keys = ["/".join(path) for path in flatten_tree(self.observations)]
        return (
            f"Trajectory(task={self.task!r}, T={self.length}, A={self.action_dim}, "
            f"K={self.num_decisions}, success={self.success}, observations={keys})"
        )

    def validate(self) -> Trajectory:
        """Check shapes, dtypes and finiteness of every field; raise ValueError naming the field."""
        _validate_array("actions", self.actions)
        if self.actions.ndim != 2 or self.actions.dtype.kind != "f":
            raise ValueError(
                "Trajectory.actions must be a 2-D float array [T, A], got dtype "
                f"{self.actions.dtype} with shape {self.actions.shape}"
            )
        steps = self.actions.shape[0]

        if not isinstance(self.observations, Mapping) or not self.observations:
            raise ValueError("Trajectory.observations must be a non-empty dict of arrays")
        for path, value in _validate_tree("observations", self.observations).items():
            if value.shape[0] != steps + 1:
                raise ValueError(
                    f"Trajectory.actions has {steps} steps but "
                    f"{leaf_name('observations', path)} has {value.shape[0]} entries "
                    f"(expected T+1 = {steps + 1})"
                )

        for name, kind in (("rewards", "f"), ("terminated", "b"), ("truncated", "b")):
            value = getattr(self, name)
            _validate_array(name, value)
            if value.shape != (steps,):
                raise ValueError(
                    f"Trajectory.{name} has shape {value.shape} but actions has {steps} steps "
                    f"(expected shape ({steps},))"
                )
            if value.dtype.kind != kind:
                expected = "float" if kind == "f" else "bool"
                raise ValueError(f"Trajectory.{name} must be {expected}, got dtype {value.dtype}")

        _validate_entries("info", self.info, f"actions has {steps} steps", "T", steps)

        self._validate_decisions(steps)

        for name in ("actions", "rewards"):
            bad = first_non_finite(getattr(self, name))
            if bad is not None:
                raise ValueError(f"Trajectory.{name} has a non-finite value: {bad}")

        self._validate_scalars()
        return self

    def _validate_decisions(self, steps: int) -> None:
        """Check decision_steps and policy_outputs (part of ``validate``)."""
        decision_steps = self.decision_steps
        _validate_array("decision_steps", decision_steps)
        if decision_steps.ndim != 1 or decision_steps.dtype.kind not in "iu":
            raise ValueError(
                "Trajectory.decision_steps must be a 1-D integer array [K], got dtype "
                f"{decision_steps.dtype} with shape {decision_steps.shape}"
            )
        num = len(decision_steps)
        _validate_entries(
            "policy_outputs", self.policy_outputs, f"decision_steps has {num} decisions", "K", num
        )
        for k in range(num):
            step = int(decision_steps[k])
            if not 0 <= step < steps:
                raise ValueError(
                    f"Trajectory.decision_steps[{k}] = {step} is outside [0, T) = [0, {steps})"
                )
            if k > 0 and step <= decision_steps[k - 1]:
                raise ValueError(
                    f"Trajectory.decision_steps must be strictly increasing, but "
                    f"decision_steps[{k}] = {step} follows decision_steps[{k - 1}] = "
                    f"{int(decision_steps[k - 1])}"
                )

    def _validate_scalars(self) -> None:
        """Check the per-episode scalar fields (part of ``validate``)."""
        if not isinstance(self.success, bool | np.bool_):
            raise ValueError(f"Trajectory.success must be a bool, got {type(self.success)}")
        for name in ("instruction", "task", "suite"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(
                    f"Trajectory.{name} must be a str, got {type(getattr(self, name))}"
                )
        seed_ok = self.seed is None or (
            isinstance(self.seed, int | np.integer) and not isinstance(self.seed, bool)
        )
        if not seed_ok:
            raise ValueError(f"Trajectory.seed must be an int or None, got {type(self.seed)}")
        if not isinstance(self.metadata, dict):
            raise ValueError(f"Trajectory.metadata must be a dict, got {type(self.metadata)}")

    def slice(self, start: int, stop: int) -> Trajectory:
        """Steps [start, stop) (observations [start, stop+1)) as a Trajectory; arrays are views.

        Decisions taken in that range are kept with ``decision_steps`` shifted by ``-start``;
        ``frames`` and ``metadata["unrendered"]`` follow the observations (``follow_observations``).
        ``success`` is kept only if the slice reaches the end of the episode (``stop == T``),
        since a prefix has not (yet) succeeded.
        """
        steps = self.length
        if not 0 <= start <= stop <= steps:
            raise ValueError(
                f"Trajectory.slice({start}, {stop}) is out of range for T = {steps} "
                "(need 0 <= start <= stop <= T)"
            )
        keep = (self.decision_steps >= start) & (self.decision_steps < stop)
        frames, metadata = follow_observations(self, np.arange(start, stop + 1))
        return Trajectory(
            observations=unflatten_tree(
                {p: a[start : stop + 1] for p, a in flatten_tree(self.observations).items()}
            ),
            actions=self.actions[start:stop],
            rewards=self.rewards[start:stop],
            terminated=self.terminated[start:stop],
            truncated=self.truncated[start:stop],
            success=self.success if stop == steps else False,
            instruction=self.instruction,
            task=self.task,
            suite=self.suite,
            seed=self.seed,
            info=unflatten_tree({p: a[start:stop] for p, a in flatten_tree(self.info).items()}),
            policy_outputs=unflatten_tree(
                {p: a[keep] for p, a in flatten_tree(self.policy_outputs).items()}
            ),
            decision_steps=self.decision_steps[keep] - start,
            metadata=metadata,
            frames=frames,
        )

    def to_dict(self) -> dict[str, Any]:
        """Flatten to ``{"observations/pixels/front": array, "success": bool, ...}`` for np.savez.

        Nested keys are joined with "/"; ``seed`` is omitted when None; ``metadata`` is stored as a
        JSON string. Every value is a plain array, bool, int or str, so
        ``np.load(..., allow_pickle=False)`` reads it back and ``from_dict`` restores it exactly.
        """
        self.validate()
        flat: dict[str, Any] = {}
        for field_name in _TREE_FIELDS:
            for path, value in flatten_tree(getattr(self, field_name)).items():
                flat["/".join((field_name, *path))] = value
        for name in _ARRAY_FIELDS:
            flat[name] = getattr(self, name)
        flat["success"] = bool(self.success)
        flat["instruction"] = self.instruction
        flat["task"] = self.task
        flat["suite"] = self.suite
        if self.seed is not None:
            flat["seed"] = int(self.seed)
        try:
            flat["metadata"] = json.dumps(self.metadata)
        except TypeError as error:
            raise ValueError(f"Trajectory.metadata is not JSON-serialisable: {error}") from error
        return flat

    @classmethod
    def from_dict(cls, flat: Mapping[str, Any]) -> Trajectory:
        """Rebuild a Trajectory from ``to_dict`` output (or a loaded npz) and validate it."""
        trees: dict[str, dict[tuple[str, ...], np.ndarray]] = {name: {} for name in _TREE_FIELDS}
        arrays: dict[str, np.ndarray] = {}
        for key in flat:
            group, _, rest = key.partition("/")
            if rest:
                path = tuple(rest.split("/"))
                if group not in trees or len(path) > 2:
                    raise ValueError(f"Trajectory.from_dict: unknown key {key!r}")
                trees[group][path] = np.asarray(flat[key])
            elif key in _ARRAY_FIELDS:
                arrays[key] = np.asarray(flat[key])
            elif key not in (*_REQUIRED_SCALARS, "seed", "metadata"):
                raise ValueError(f"Trajectory.from_dict: unknown key {key!r}")
        for key in (*_ARRAY_FIELDS, *_REQUIRED_SCALARS):
            if key not in flat:
                raise ValueError(f"Trajectory.from_dict: missing key {key!r}")

        def scalar(key: str) -> Any:
            value = flat[key]
            return value.item() if isinstance(value, np.ndarray) else value

        return cls(
            observations=unflatten_tree(trees["observations"]),
            actions=arrays["actions"],
            rewards=arrays["rewards"],
            terminated=arrays["terminated"],
            truncated=arrays["truncated"],
            success=bool(scalar("success")),
            instruction=str(scalar("instruction")),
            task=str(scalar("task")),
            suite=str(scalar("suite")),
            seed=int(scalar("seed")) if "seed" in flat else None,
            info=unflatten_tree(trees["info"]),
            policy_outputs=unflatten_tree(trees["policy_outputs"]),
            decision_steps=arrays["decision_steps"],
            metadata=json.loads(str(scalar("metadata"))) if "metadata" in flat else {},
        ).validate()


def _validate_array(name: str, value: Any) -> None:
    """Raise ValueError unless value is a numpy array."""
    if not isinstance(value, np.ndarray):
        raise ValueError(f"Trajectory.{name} must be a numpy array, got {type(value).__name__}")


def _validate_entries(name: str, tree: Any, has: str, symbol: str, length: int) -> None:
    """Check that ``tree`` (a Trajectory field) is a dict of arrays with ``length`` leading
    entries, ``symbol`` (T or K) as the other field it must match says (``has``)."""
    if not isinstance(tree, Mapping):
        raise ValueError(f"Trajectory.{name} must be a dict of arrays, got {type(tree).__name__}")
    for path, value in _validate_tree(name, tree).items():
        if value.shape[0] != length:
            raise ValueError(
                f"Trajectory.{has} but {leaf_name(name, path)} has {value.shape[0]} entries "
                f"(expected {symbol} = {length})"
            )


def _validate_tree(field_name: str, tree: Mapping[str, Any]) -> dict[tuple[str, ...], np.ndarray]:
    """Check keys and leaf types of a dict-of-arrays field and return its leaves."""
    for key, value in tree.items():
        if isinstance(value, Mapping) and not value:
            raise ValueError(f"Trajectory.{leaf_name(field_name, (key,))} is an empty dict")
    leaves = flatten_tree(tree)
    for path, value in leaves.items():
        name = leaf_name(field_name, path)
        for key in path:
            if not isinstance(key, str) or not key or "/" in key:
                raise ValueError(f"Trajectory.{name}: keys must be non-empty str without '/'")
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            shape = getattr(value, "shape", None)
            raise ValueError(
                f"Trajectory.{name} must be a numpy array with a leading time/decision axis "
                f"(nesting is one level deep), got {type(value).__name__} with shape {shape}"
            )
    return leaves


def follow_observations(trajectory: Trajectory, shown: np.ndarray) -> tuple[Any, dict[str, Any]]:
    """``frames`` and ``metadata`` for a trajectory made of ``trajectory``'s observations
    ``shown`` (a slice, a rewind): the frames taken along (``frames.take``, so replayed frames
    stay unrendered) and the black images of ``metadata["unrendered"]`` renumbered."""
    frames = None if trajectory.frames is None else trajectory.frames.take(shown, axis=0)
    metadata = dict(trajectory.metadata)
    if "unrendered" in metadata:
        unrendered = np.flatnonzero(np.isin(shown, metadata.pop("unrendered"))).tolist()
        if unrendered:
            metadata["unrendered"] = unrendered
    return frames, metadata


def trajectories_equal(a: Trajectory, b: Trajectory) -> bool:
    """Exact equality of two trajectories (dtypes, shapes, values, scalars, metadata)."""
    return (
        trees_equal(a.observations, b.observations)
        and all(arrays_equal(getattr(a, name), getattr(b, name)) for name in _ARRAY_FIELDS)
        and trees_equal(a.info, b.info)
        and trees_equal(a.policy_outputs, b.policy_outputs)
        and bool(a.success) == bool(b.success)
        and a.instruction == b.instruction
        and a.task == b.task
        and a.suite == b.suite
        and a.seed == b.seed
        and a.metadata == b.metadata
    )
