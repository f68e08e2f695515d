"""The core data type: one episode as numpy arrays (``Trajectory``) and padded batches of them.

Layout of one ``Trajectory`` with T environment steps and K policy decisions:

- ``observations``: ``{key: [T+1, ...]}``; a value may also be a dict of arrays, one level deep
  (``observations["pixels"] = {"front": uint8[T+1,H,W,3], "wrist": ...}``).
- ``actions [T, A]``, ``rewards [T]``, ``terminated [T]``, ``truncated [T]``,
  ``info {key: [T, ...]}``.
- ``policy_outputs {key: [K, ...]}`` and ``decision_steps int64 [K]``: decision k was taken at
  env step ``decision_steps[k]``.

Conventions:

- Construction is cheap and does not check anything; call ``validate()`` (the builder,
  ``from_dict`` and the batch do) to get a ``ValueError`` naming the offending field.
- ``slice`` returns numpy views of the observation/action/info arrays; copy before mutating.
- ``TrajectoryBatch`` pads every trajectory to a common length. Padded observations repeat the
  last valid observation (so a model never sees out-of-distribution zeros); every other padded
  entry is zero / False, and padded ``decision_steps`` are -1. Masks say what is real.
- Numpy only: torch is imported lazily by ``TrajectoryBatch.to_torch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "ArrayTree",
    "Trajectory",
    "TrajectoryBatch",
    "TrajectoryBuilder",
    "concatenate",
    "trajectories_equal",
]

# A dict of arrays whose values may themselves be dicts of arrays (one level of nesting).
ArrayTree = dict[str, np.ndarray | dict[str, np.ndarray]]

# Keys of the dict-of-arrays fields, as used in ``to_dict`` ("observations/pixels/front").
_TREE_FIELDS = ("observations", "info", "policy_outputs")
_ARRAY_FIELDS = ("actions", "rewards", "terminated", "truncated", "decision_steps")
_REQUIRED_SCALARS = ("success", "instruction", "task", "suite")
_NUMERIC_KINDS = "biuf"  # bool, signed int, unsigned int, float


# ---------------------------------------------------------------------------------------------
# Helpers for one-level-nested dicts of arrays
# ---------------------------------------------------------------------------------------------


def _leaves(tree: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """Flatten a one-level-nested dict to {(key,) or (key, sub_key): value}, keeping order."""
    leaves: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                leaves[(key, sub_key)] = sub_value
        else:
            leaves[(key,)] = value
    return leaves


def _unflatten(leaves: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """Inverse of ``_leaves``."""
    tree: dict[str, Any] = {}
    for path, value in leaves.items():
        if len(path) == 1:
            tree[path[0]] = value
        else:
            tree.setdefault(path[0], {})[path[1]] = value
    return tree


def _field_name(field_name: str, path: tuple[str, ...]) -> str:
    """Human-readable name of a leaf, e.g. ``observations['pixels']['front']``."""
    return field_name + "".join(f"[{key!r}]" for key in path)


def _copy_tree(tree: Mapping[str, Any]) -> dict[tuple[str, ...], np.ndarray]:
    """Copy every leaf into a fresh numpy array (rollout loops often reuse buffers)."""
    return {path: np.array(value) for path, value in _leaves(tree).items()}


def _key_names(leaves: Mapping[tuple[str, ...], Any]) -> list[str]:
    """Sorted "a/b" names of flattened keys, for error messages."""
    return sorted("/".join(path) for path in leaves)


def _arrays_equal(a: Any, b: Any) -> bool:
    """Exact equality: same type, dtype, shape and values (NaN equals NaN)."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _trees_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Exact equality of two one-level-nested dicts of arrays."""
    leaves_a, leaves_b = _leaves(a), _leaves(b)
    if leaves_a.keys() != leaves_b.keys():
        return False
    return all(_arrays_equal(leaves_a[path], leaves_b[path]) for path in leaves_a)


def _check_same_keys(
    field_name: str, leaf_dicts: Sequence[Mapping[tuple[str, ...], Any]], what: str
) -> None:
    """Raise ValueError unless every item (segment / trajectory) has the keys of item 0."""
    reference = leaf_dicts[0]
    for index, leaves in enumerate(leaf_dicts[1:], start=1):
        for path in reference:
            if path not in leaves:
                name = _field_name(field_name, path)
                raise ValueError(f"{what} {index} is missing {name}, which {what} 0 has")
        for path in leaves:
            if path not in reference:
                name = _field_name(field_name, path)
                raise ValueError(f"{what} {index} has {name}, which {what} 0 lacks")


def _check_compatible(name: str, arrays: Sequence[np.ndarray], what: str) -> None:
    """Raise ValueError unless all arrays share dtype and per-step (trailing) shape."""
    reference = arrays[0]
    for index, array in enumerate(arrays[1:], start=1):
        if array.dtype != reference.dtype or array.shape[1:] != reference.shape[1:]:
            raise ValueError(
                f"{what} {index}: {name} has dtype {array.dtype} and per-step shape "
                f"{array.shape[1:]} but {what} 0 has dtype {reference.dtype} and per-step "
                f"shape {reference.shape[1:]}"
            )


def _stack(name: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """np.stack with an error that names the field and the first entry whose shape differs."""
    for index, array in enumerate(arrays):
        if array.shape != arrays[0].shape:
            raise ValueError(
                f"cannot stack {name}: entry {index} has shape {array.shape} "
                f"but entry 0 has shape {arrays[0].shape}"
            )
    return np.stack(arrays)


def _first_non_finite(array: np.ndarray) -> str | None:
    """Describe the first NaN/inf in a float array ("nan at index (3, 1)"); None if all finite."""
    bad = ~np.isfinite(array)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    where = index[0] if len(index) == 1 else index
    return f"{array[index]} at index {where}"


def _numeric_array(value: Any) -> np.ndarray | None:
    """Return value as a numeric/bool numpy array, or None if it is not numeric (e.g. a string)."""
    if value is None or isinstance(value, str | bytes | Mapping):
        return None
    try:
        array = np.array(value)
    except (TypeError, ValueError):
        return None
    if array.dtype.kind not in _NUMERIC_KINDS:
        return None
    return array


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
    def action_dim(self) -> int:
        """Size A of one action vector."""
        return int(self.actions.shape[1])

    @property
    def num_decisions(self) -> int:
        """Number K of policy decisions recorded in ``policy_outputs``."""
        return int(len(self.decision_steps))

    def __repr__(self) -> str:
        """Short summary instead of dumping every array."""
        keys = ["/".join(path) for path in _leaves(self.observations)]
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
                    f"{_field_name('observations', path)} has {value.shape[0]} entries "
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

        if not isinstance(self.info, Mapping):
            raise ValueError(f"Trajectory.info must be a dict of arrays, got {type(self.info)}")
        for path, value in _validate_tree("info", self.info).items():
            if value.shape[0] != steps:
                raise ValueError(
                    f"Trajectory.actions has {steps} steps but {_field_name('info', path)} "
                    f"has {value.shape[0]} entries (expected T = {steps})"
                )

        self._validate_decisions(steps)

        for name in ("actions", "rewards"):
            bad = _first_non_finite(getattr(self, name))
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
        if not isinstance(self.policy_outputs, Mapping):
            kind = type(self.policy_outputs).__name__
            raise ValueError(f"Trajectory.policy_outputs must be a dict of arrays, got {kind}")
        for path, value in _validate_tree("policy_outputs", self.policy_outputs).items():
            if value.shape[0] != num:
                raise ValueError(
                    f"Trajectory.decision_steps has {num} decisions but "
                    f"{_field_name('policy_outputs', path)} has {value.shape[0]} entries "
                    f"(expected K = {num})"
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

        Decisions taken in that range are kept with ``decision_steps`` shifted by ``-start``.
        ``success`` is kept only if the slice reaches the end of the episode (``stop == T``),
        since a prefix has not (yet) succeeded; ``concat`` takes the last segment's success.
        """
        steps = self.length
        if not 0 <= start <= stop <= steps:
            raise ValueError(
                f"Trajectory.slice({start}, {stop}) is out of range for T = {steps} "
                "(need 0 <= start <= stop <= T)"
            )
        keep = (self.decision_steps >= start) & (self.decision_steps < stop)
        return Trajectory(
            observations=_unflatten(
                {p: a[start : stop + 1] for p, a in _leaves(self.observations).items()}
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
            info=_unflatten({p: a[start:stop] for p, a in _leaves(self.info).items()}),
            policy_outputs=_unflatten(
                {p: a[keep] for p, a in _leaves(self.policy_outputs).items()}
            ),
            decision_steps=self.decision_steps[keep] - start,
            metadata=dict(self.metadata),
        )

    @classmethod
    def concat(cls, segments: Sequence[Trajectory]) -> Trajectory:
        """Join consecutive segments of one episode (inverse of ``slice``); ValueError if they gap.

        The last observation of segment i must equal the first of segment i+1 exactly. Success
        comes from the last segment, metadata from the first.
        """
        segments = list(segments)
        if not segments:
            raise ValueError("Trajectory.concat needs at least one segment")
        for index, segment in enumerate(segments):
            try:
                segment.validate()
            except ValueError as error:
                raise ValueError(f"segment {index}: {error}") from error
        first = segments[0]
        for index, segment in enumerate(segments[1:], start=1):
            for name in ("instruction", "task", "suite", "seed"):
                if getattr(segment, name) != getattr(first, name):
                    raise ValueError(
                        f"segment {index} has {name} = {getattr(segment, name)!r} but segment 0 "
                        f"has {name} = {getattr(first, name)!r}; concat joins one episode only"
                    )

        obs_leaves = [_leaves(s.observations) for s in segments]
        info_leaves = [_leaves(s.info) for s in segments]
        output_leaves = [_leaves(s.policy_outputs) for s in segments]
        _check_same_keys("observations", obs_leaves, "segment")
        _check_same_keys("info", info_leaves, "segment")
        _check_same_keys("policy_outputs", output_leaves, "segment")
        for index in range(1, len(segments)):
            for path, previous in obs_leaves[index - 1].items():
                if not np.array_equal(previous[-1], obs_leaves[index][path][0]):
                    raise ValueError(
                        f"segment {index} does not continue segment {index - 1}: the last "
                        f"{_field_name('observations', path)} of segment {index - 1} differs "
                        f"from the first of segment {index}"
                    )

        def join(field_name: str, leaf_dicts: list[dict], skip_first: bool) -> dict[str, Any]:
            joined = {}
            for path in leaf_dicts[0]:
                arrays = [leaves[path] for leaves in leaf_dicts]
                _check_compatible(_field_name(field_name, path), arrays, "segment")
                if skip_first:
                    arrays = [arrays[0]] + [a[1:] for a in arrays[1:]]
                joined[path] = np.concatenate(arrays)
            return _unflatten(joined)

        def join_array(name: str) -> np.ndarray:
            arrays = [getattr(s, name) for s in segments]
            _check_compatible(name, arrays, "segment")
            return np.concatenate(arrays)

        offsets = np.cumsum([0] + [s.length for s in segments[:-1]])
        decision_steps = [s.decision_steps + int(o) for s, o in zip(segments, offsets, strict=True)]
        _check_compatible("decision_steps", decision_steps, "segment")
        return cls(
            observations=join("observations", obs_leaves, skip_first=True),
            actions=join_array("actions"),
            rewards=join_array("rewards"),
            terminated=join_array("terminated"),
            truncated=join_array("truncated"),
            success=segments[-1].success,
            instruction=first.instruction,
            task=first.task,
            suite=first.suite,
            seed=first.seed,
            info=join("info", info_leaves, skip_first=False),
            policy_outputs=join("policy_outputs", output_leaves, skip_first=False),
            decision_steps=np.concatenate(decision_steps),
            metadata=dict(first.metadata),
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
            for path, value in _leaves(getattr(self, field_name)).items():
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
            observations=_unflatten(trees["observations"]),
            actions=arrays["actions"],
            rewards=arrays["rewards"],
            terminated=arrays["terminated"],
            truncated=arrays["truncated"],
            success=bool(scalar("success")),
            instruction=str(scalar("instruction")),
            task=str(scalar("task")),
            suite=str(scalar("suite")),
            seed=int(scalar("seed")) if "seed" in flat else None,
            info=_unflatten(trees["info"]),
            policy_outputs=_unflatten(trees["policy_outputs"]),
            decision_steps=arrays["decision_steps"],
            metadata=json.loads(str(scalar("metadata"))) if "metadata" in flat else {},
        ).validate()


def _validate_array(name: str, value: Any) -> None:
    """Raise ValueError unless value is a numpy array."""
    if not isinstance(value, np.ndarray):
        raise ValueError(f"Trajectory.{name} must be a numpy array, got {type(value).__name__}")


def _validate_tree(field_name: str, tree: Mapping[str, Any]) -> dict[tuple[str, ...], np.ndarray]:
    """Check keys and leaf types of a dict-of-arrays field and return its leaves."""
    for key, value in tree.items():
        if isinstance(value, Mapping) and not value:
            raise ValueError(f"Trajectory.{_field_name(field_name, (key,))} is an empty dict")
    leaves = _leaves(tree)
    for path, value in leaves.items():
        name = _field_name(field_name, path)
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


def concatenate(segments: Sequence[Trajectory]) -> Trajectory:
    """Join consecutive segments of one episode; same as ``Trajectory.concat``."""
    return Trajectory.concat(segments)


def trajectories_equal(a: Trajectory, b: Trajectory) -> bool:
    """Exact equality of two trajectories (dtypes, shapes, values, scalars, metadata)."""
    return (
        _trees_equal(a.observations, b.observations)
        and all(_arrays_equal(getattr(a, name), getattr(b, name)) for name in _ARRAY_FIELDS)
        and _trees_equal(a.info, b.info)
        and _trees_equal(a.policy_outputs, b.policy_outputs)
        and bool(a.success) == bool(b.success)
        and a.instruction == b.instruction
        and a.task == b.task
        and a.suite == b.suite
        and a.seed == b.seed
        and a.metadata == b.metadata
    )


# ---------------------------------------------------------------------------------------------
# TrajectoryBuilder
# ---------------------------------------------------------------------------------------------


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
        self._observations = [_copy_tree(first_obs)]
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
        observation = _copy_tree(obs)
        if observation.keys() != self._observations[0].keys():
            raise ValueError(
                f"observation after step {step} has keys {_key_names(observation)} but the "
                f"first observation has {_key_names(self._observations[0])}"
            )

        kept = {}
        for key, value in (info_step or {}).items():
            array = _numeric_array(value)
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
        copied = _copy_tree(outputs)
        if self._decision_outputs and copied.keys() != self._decision_outputs[0].keys():
            raise ValueError(
                f"policy outputs at step {step_index} have keys {_key_names(copied)} but the "
                f"first decision had {_key_names(self._decision_outputs[0])}"
            )
        self._decision_steps.append(step_index)
        self._decision_outputs.append(copied)

    def build(self, success: bool | None = None) -> Trajectory:
        """Stack everything into a validated Trajectory.

        ``success`` defaults to ``bool(info["success"][-1])`` when that info key exists, else False.
        """
        observations = {
            path: _stack(_field_name("observations", path), [o[path] for o in self._observations])
            for path in self._observations[0]
        }
        # With no steps the action dimension is unknown; (0, 0) keeps actions 2-D.
        actions = np.stack(self._actions) if self._actions else np.zeros((0, 0), np.float32)
        info = {key: _stack(_field_name("info", (key,)), v) for key, v in self._info.items()}
        policy_outputs = {}
        if self._decision_outputs:
            for path in self._decision_outputs[0]:
                arrays = [outputs[path] for outputs in self._decision_outputs]
                policy_outputs[path] = _stack(_field_name("policy_outputs", path), arrays)
        if success is None:
            success = bool(info["success"][-1]) if "success" in info else False
        return Trajectory(
            observations=_unflatten(observations),
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
            policy_outputs=_unflatten(policy_outputs),
            decision_steps=np.array(self._decision_steps, dtype=np.int64),
            metadata=dict(self.metadata),
        ).validate()


# ---------------------------------------------------------------------------------------------
# TrajectoryBatch
# ---------------------------------------------------------------------------------------------


def _pad_stack(
    name: str,
    arrays: Sequence[np.ndarray],
    length: int,
    pad_value: int = 0,
    repeat_last: bool = False,
) -> np.ndarray:
    """Stack arrays [n_i, ...] into [B, length, ...], padding with pad_value or the last entry."""
    _check_compatible(name, arrays, "trajectory")
    reference = arrays[0]
    out = np.full((len(arrays), length, *reference.shape[1:]), pad_value, dtype=reference.dtype)
    for row, array in enumerate(arrays):
        n = array.shape[0]
        out[row, :n] = array
        if repeat_last and n < length:
            out[row, n:] = array[-1]
    return out


def _pad_stack_tree(
    field_name: str, trees: Sequence[Mapping[str, Any]], length: int, repeat_last: bool = False
) -> dict[str, Any]:
    """``_pad_stack`` for every leaf of a dict-of-arrays field, checking keys match."""
    leaf_dicts = [_leaves(tree) for tree in trees]
    _check_same_keys(field_name, leaf_dicts, "trajectory")
    stacked = {}
    for path in leaf_dicts[0]:
        arrays = [leaves[path] for leaves in leaf_dicts]
        name = _field_name(field_name, path)
        stacked[path] = _pad_stack(name, arrays, length, repeat_last=repeat_last)
    return _unflatten(stacked)


def _take_rows(tree: Mapping[str, Any], row: int, n: int) -> dict[str, Any]:
    """Copy of ``a[row, :n]`` for every leaf of a batched dict-of-arrays field."""
    return _unflatten({path: np.array(a[row, :n]) for path, a in _leaves(tree).items()})


@dataclass(eq=False)
class TrajectoryBatch:
    """Trajectories padded to a common length with masks; the input format of every algorithm.

    B trajectories, Tmax steps, Kmax decisions. Padded observations repeat the last valid
    observation; padded actions, rewards, info and policy outputs are zero, padded flags False,
    padded ``decision_steps`` -1. Build with ``from_trajectories``; ``unbatch`` inverts it exactly.
    """

    observations: ArrayTree  # [B, Tmax+1, ...]
    obs_mask: np.ndarray  # bool [B, Tmax+1]
    actions: np.ndarray  # [B, Tmax, A]
    mask: np.ndarray  # bool [B, Tmax], True on real steps
    rewards: np.ndarray  # [B, Tmax]
    terminated: np.ndarray  # bool [B, Tmax]
    truncated: np.ndarray  # bool [B, Tmax]
    info: ArrayTree  # [B, Tmax, ...]
    policy_outputs: ArrayTree  # [B, Kmax, ...]
    decision_steps: np.ndarray  # int64 [B, Kmax], -1 where padded
    decision_mask: np.ndarray  # bool [B, Kmax]
    success: np.ndarray  # bool [B]
    lengths: np.ndarray  # int64 [B]
    instructions: list[str]
    tasks: list[str]
    suites: list[str]
    seeds: list[int | None]
    metadata: list[dict[str, Any]]

    @property
    def batch_size(self) -> int:
        """Number of trajectories B."""
        return int(self.lengths.shape[0])

    @property
    def max_length(self) -> int:
        """Padded number of steps Tmax."""
        return int(self.actions.shape[1])

    @property
    def max_decisions(self) -> int:
        """Padded number of decisions Kmax."""
        return int(self.decision_steps.shape[1])

    @classmethod
    def from_trajectories(
        cls, trajectories: Sequence[Trajectory], pad_to: int | None = None
    ) -> TrajectoryBatch:
        """Validate and pad trajectories to max T (or ``pad_to`` steps) and max K, with masks."""
        trajectories = list(trajectories)
        if not trajectories:
            raise ValueError("TrajectoryBatch.from_trajectories needs at least one trajectory")
        for index, trajectory in enumerate(trajectories):
            try:
                trajectory.validate()
            except ValueError as error:
                raise ValueError(f"trajectory {index}: {error}") from error
            if trajectory.action_dim != trajectories[0].action_dim:
                raise ValueError(
                    f"trajectory {index} has action_dim {trajectory.action_dim} but trajectory 0 "
                    f"has action_dim {trajectories[0].action_dim}"
                )

        lengths = np.array([t.length for t in trajectories], dtype=np.int64)
        num_decisions = np.array([t.num_decisions for t in trajectories], dtype=np.int64)
        max_length = int(lengths.max())
        if pad_to is not None:
            if pad_to < max_length:
                raise ValueError(f"pad_to = {pad_to} is shorter than the longest trajectory")
            max_length = pad_to
        max_decisions = int(num_decisions.max())

        def stack(name: str, pad_value: int = 0) -> np.ndarray:
            arrays = [getattr(t, name) for t in trajectories]
            return _pad_stack(name, arrays, max_length, pad_value)

        decision_steps = [t.decision_steps.astype(np.int64) for t in trajectories]
        return cls(
            observations=_pad_stack_tree(
                "observations", [t.observations for t in trajectories], max_length + 1, True
            ),
            obs_mask=np.arange(max_length + 1)[None, :] <= lengths[:, None],
            actions=stack("actions"),
            mask=np.arange(max_length)[None, :] < lengths[:, None],
            rewards=stack("rewards"),
            terminated=stack("terminated"),
            truncated=stack("truncated"),
            info=_pad_stack_tree("info", [t.info for t in trajectories], max_length),
            policy_outputs=_pad_stack_tree(
                "policy_outputs", [t.policy_outputs for t in trajectories], max_decisions
            ),
            decision_steps=_pad_stack("decision_steps", decision_steps, max_decisions, -1),
            decision_mask=np.arange(max_decisions)[None, :] < num_decisions[:, None],
            success=np.array([bool(t.success) for t in trajectories], dtype=bool),
            lengths=lengths,
            instructions=[t.instruction for t in trajectories],
            tasks=[t.task for t in trajectories],
            suites=[t.suite for t in trajectories],
            seeds=[t.seed for t in trajectories],
            metadata=[dict(t.metadata) for t in trajectories],
        )

    def unbatch(self) -> list[Trajectory]:
        """Cut the padding off again: the exact inverse of ``from_trajectories`` (arrays copied)."""
        trajectories = []
        for row in range(self.batch_size):
            steps = int(self.lengths[row])
            decisions = int(self.decision_mask[row].sum())
            trajectories.append(
                Trajectory(
                    observations=_take_rows(self.observations, row, steps + 1),
                    actions=np.array(self.actions[row, :steps]),
                    rewards=np.array(self.rewards[row, :steps]),
                    terminated=np.array(self.terminated[row, :steps]),
                    truncated=np.array(self.truncated[row, :steps]),
                    success=bool(self.success[row]),
                    instruction=self.instructions[row],
                    task=self.tasks[row],
                    suite=self.suites[row],
                    seed=self.seeds[row],
                    info=_take_rows(self.info, row, steps),
                    policy_outputs=_take_rows(self.policy_outputs, row, decisions),
                    decision_steps=np.array(self.decision_steps[row, :decisions]),
                    metadata=dict(self.metadata[row]),
                )
            )
        return trajectories

    def to_torch(self, device: str | torch.device = "cpu") -> dict[str, Any]:
        """Same fields as a dict, arrays (nested ones too) as torch tensors on ``device``."""
        import torch

        def convert(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device)

        def convert_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
            return _unflatten({path: convert(a) for path, a in _leaves(tree).items()})

        return {
            "observations": convert_tree(self.observations),
            "obs_mask": convert(self.obs_mask),
            "actions": convert(self.actions),
            "mask": convert(self.mask),
            "rewards": convert(self.rewards),
            "terminated": convert(self.terminated),
            "truncated": convert(self.truncated),
            "info": convert_tree(self.info),
            "policy_outputs": convert_tree(self.policy_outputs),
            "decision_steps": convert(self.decision_steps),
            "decision_mask": convert(self.decision_mask),
            "success": convert(self.success),
            "lengths": convert(self.lengths),
            "instructions": list(self.instructions),
            "tasks": list(self.tasks),
            "suites": list(self.suites),
            "seeds": list(self.seeds),
            "metadata": [dict(m) for m in self.metadata],
        }
