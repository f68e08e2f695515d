"""Helpers for the one-level-nested dicts of arrays a ``Trajectory`` holds (``observations``,
``info``, ``policy_outputs``): flatten to paths, rebuild, copy, compare and stack them with errors
that name the field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NUMERIC_KINDS = "biuf"  # bool, signed int, unsigned int, float


def flatten_tree(tree: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """Flatten a one-level-nested dict to {(key,) or (key, sub_key): value}, keeping order."""
    leaves: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                leaves[(key, sub_key)] = sub_value
        else:
            leaves[(key,)] = value
    return leaves


def unflatten_tree(leaves: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """Inverse of ``_leaves``."""
    tree: dict[str, Any] = {}
    for path, value in leaves.items():
        if len(path) == 1:
            tree[path[0]] = value
        else:
            tree.setdefault(path[0], {})[path[1]] = value
    return tree


def leaf_name(field_name: str, path: tuple[str, ...]) -> str:
    """Human-readable name of a leaf, e.g. ``observations['pixels']['front']``."""
    return field_name + "".join(f"[{key!r}]" for key in path)


def copy_tree(tree: Mapping[str, Any]) -> dict[tuple[str, ...], np.ndarray]:
    """Copy every leaf into a fresh numpy array (rollout loops often reuse buffers)."""
    return {path: np.array(value) for path, value in flatten_tree(tree).items()}


def key_names(leaves: Mapping[tuple[str, ...], Any]) -> list[str]:
    """Sorted "a/b" names of flattened keys, for error messages."""
    return sorted("/".join(path) for path in leaves)


def arrays_equal(a: Any, b: Any) -> bool:
    """Exact equality: same type, dtype, shape and values (NaN equals NaN)."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def trees_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Exact equality of two one-level-nested dicts of arrays."""
    leaves_a, leaves_b = flatten_tree(a), flatten_tree(b)
    if leaves_a.keys() != leaves_b.keys():
        return False
    return all(arrays_equal(leaves_a[path], leaves_b[path]) for path in leaves_a)


def stack_named(name: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """np.stack with an error that names the field and the first entry whose shape differs."""
    for index, array in enumerate(arrays):
        if array.shape != arrays[0].shape:
            raise ValueError(
                f"cannot stack {name}: entry {index} has shape {array.shape} "
                f"but entry 0 has shape {arrays[0].shape}"
            )
    return np.stack(arrays)


def first_non_finite(array: np.ndarray) -> str | None:
    """Describe the first NaN/inf in a float array ("nan at index (3, 1)"); None if all finite."""
    bad = ~np.isfinite(array)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    where = index[0] if len(index) == 1 else index
    return f"{array[index]} at index {where}"


def numeric_array(value: Any) -> np.ndarray | None:
    """Return value as a numeric/bool numpy array, or None if it is not numeric (e.g. a string)."""
    if value is None or isinstance(value, str | bytes | Mapping):
        return None
    try:
        array = np.array(value)
    except (TypeError, ValueError):
        return None
    if array.dtype.kind not in NUMERIC_KINDS:
        return None
    return array
