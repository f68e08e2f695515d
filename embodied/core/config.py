"""Typed configs: dataclass defaults, then a YAML file, then ``key=value`` command-line overrides.

Every job describes its settings as a (nested) dataclass. ``load_config`` merges the dataclass
defaults, an optional YAML file and dotted overrides such as ``train.lr=1e-4`` or
``sim.cameras=[front,wrist]`` with OmegaConf structured configs, and returns an instance of the
dataclass with real Python types. Mistakes (an unknown key, a value of the wrong type, a missing
file) raise ``ConfigError`` with a message that names the full dotted key and where it came from.

Ranges live beside the defaults: ``setting(default, low=..., high=..., choices=...)`` declares a
field and what it accepts, and ``validate(cfg)`` checks every declared range, every float for NaN
and each dataclass's own cross-field ``check()``, naming the dotted key, the value and what is
allowed. ``load_config`` validates what it builds and every job validates its config before it
writes anything, so a bad value never costs a run directory or a rollout.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from embodied.core.io import atomic_write_text

__all__ = [
    "SEED_MAX",
    "ConfigError",
    "check_choice",
    "check_ints",
    "config_to_dict",
    "load_config",
    "save_config",
    "seed_setting",
    "setting",
    "validate",
]

SEED_MAX = 2**32 - 1  # every seed, everywhere: what numpy, torch and Python all accept

T = TypeVar("T")


class ConfigError(ValueError):
    """A config could not be built: unknown key, wrong type, bad YAML file or bad override."""


# --- checks for model configs (built in code, not from YAML): policies and reward models --------
def check_ints(config: Any, lows: Mapping[str, int]) -> None:
    """Refuse a field that is not an int (bools included) of at least its lower bound."""
    for name, low in lows.items():
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            owner = type(config).__name__
            raise ValueError(f"{owner}.{name} must be an int >= {low}, got {value!r}")


def check_scalars(config: Any) -> None:
    """Refuse a ``float`` field of a dataclass that holds no number, or a ``bool`` field that holds
    no bool (a policy override such as ``policy_overrides.min_std=abc`` or
    ``policy_overrides.explore_executed=abc`` reaches a config unchecked by the loader's schema)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type in ("float", float) and (
            not isinstance(value, int | float) or isinstance(value, bool)
        ):
            raise ValueError(f"{type(config).__name__}.{f.name} must be a number, got {value!r}")
        if f.type in ("bool", bool) and not isinstance(value, bool):
            raise ValueError(
                f"{type(config).__name__}.{f.name} must be true or false, got {value!r}"
            )


def check_choice(config: Any, name: str, choices: Sequence[str]) -> None:
    """Refuse a field whose value is not one of ``choices``."""
    value = getattr(config, name)
    if value not in choices:
        names = [repr(c) for c in choices]
        allowed = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        raise ValueError(f"{type(config).__name__}.{name} must be {allowed}, got {value!r}")


def load_config(
    schema: type[T],
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
) -> T:
    """Merge ``schema`` defaults, the YAML at ``path``, then ``overrides``; return a ``schema``."""
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"load_config expects a dataclass type, got {schema!r}")
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'key=value' strings, not one string")

    cfg = OmegaConf.structured(schema)
    if path is not None:
        source = f"in {path}"
        cfg = _merge(cfg, _load_yaml(Path(path)), schema, source)
    for override in overrides:
        source = f"in override {override!r}"
        key = override.partition("=")[0].strip()
        cfg = _merge(cfg, _parse_override(override), schema, source, key)
    return _build(cfg, schema)


def config_from(schema: type[T], values: Mapping[str, Any], source: str = "") -> T:
    """A ``schema`` from its defaults updated by the nested mapping ``values`` (e.g. a section of
    another config); errors name the bad key and ``source``."""
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"config_from expects a dataclass type, got {schema!r}")
    update = OmegaConf.create(_paths_to_str(dict(values)))
    cfg = _merge(OmegaConf.structured(schema), update, schema, source or "in the given values")
    return _build(cfg, schema)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    low: float | None = None,
    high: float | None = None,
    choices: Sequence[Any] | None = None,
) -> Any:
    """A dataclass field with the range it accepts: ``low <= value <= high`` and/or one of
    ``choices`` (checked by ``validate``)."""
    metadata = {"low": low, "high": high, "choices": tuple(choices) if choices else None}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def seed_setting(default: int = 0) -> Any:
    """A seed field: an int in [0, 2**32 - 1], the same bound for every seed of every job."""
    return setting(default, low=0, high=SEED_MAX)


def validate(cfg: Any, prefix: str = "") -> Any:
    """Check a config dataclass (recursively): declared ranges and choices, no NaN or infinite
    float, then its own ``check()`` for rules between fields. Raises ``ConfigError`` naming the
    dotted key, the value and what is allowed; returns ``cfg``."""
    for f in dataclasses.fields(cfg):
        key, value = prefix + f.name, getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate(value, key + ".")
            continue
        _check_value(key, value, f.metadata)
    check = getattr(cfg, "check", None)
    if callable(check):
        try:
            check()
        except ValueError as error:
            message = str(error)
            raise ConfigError(message if not prefix else f"{prefix[:-1]}: {message}") from None
    return cfg


def _check_value(key: str, value: Any, metadata: Mapping[str, Any]) -> None:
    """One field against its declared range (module docstring)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{key}' = {value!r}: expected a finite number")
    choices, low, high = metadata.get("choices"), metadata.get("low"), metadata.get("high")
    if choices is not None and value not in choices:
        raise ConfigError(f"config key '{key}' = {value!r}: expected one of {list(choices)}")
    if low is None and high is None or isinstance(value, bool) or value is None:
        return
    if (
        not isinstance(value, int | float)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        where = (
            f"in [{low}, {high}]" if low is not None and high is not None
            else f">= {low}" if low is not None else f"<= {high}"
        )  # fmt: skip
        raise ConfigError(f"config key '{key}' = {value!r} is out of range: expected {where}")


def _build(cfg: DictConfig, schema: type[T]) -> T:
    """The dataclass instance of a merged config, with missing or bad values named."""
    try:
        return typing.cast(T, validate(OmegaConf.to_object(cfg)))
    except MissingMandatoryValue as error:
        raise ConfigError(f"config key '{error.full_key}' is required but was not set") from None
    except InterpolationResolutionError as error:
        raise ConfigError(
            f"config key '{error.full_key}' could not be resolved: {_first_line(error)}"
        ) from None
    except OmegaConfBaseException as error:
        raise ConfigError(_describe(error, schema, source="while building the config")) from None


def save_config(cfg: Any, path: str | os.PathLike[str]) -> None:
    """Write ``cfg`` (dataclass instance, DictConfig or dict) as resolved YAML, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # OmegaConf's dumper quotes strings its loader would misread (e.g. "1e-4"), so round trips hold.
    atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(config_to_dict(cfg))))


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Turn ``cfg`` into plain dicts, lists and scalars for YAML, JSON and checkpoints."""
    container = OmegaConf.to_container(_to_omegaconf(cfg), resolve=True, enum_to_str=True)
    return typing.cast(dict[str, Any], _paths_to_str(container))


def _paths_to_str(value: Any) -> Any:
    """Replace ``pathlib.Path`` values with strings, which every format can store."""
    if isinstance(value, dict):
        return {key: _paths_to_str(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_paths_to_str(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _to_omegaconf(cfg: Any) -> DictConfig:
    """Wrap a dataclass instance, a DictConfig or a mapping as a DictConfig."""
    if isinstance(cfg, DictConfig):
        return cfg
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return OmegaConf.structured(cfg)
    if isinstance(cfg, Mapping):
        return OmegaConf.create(dict(cfg))
    raise TypeError(f"expected a dataclass instance, DictConfig or mapping, got {type(cfg)!r}")


def _load_yaml(path: Path) -> DictConfig:
    """Read a YAML file that must hold a mapping at the top level."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML:\n{error}") from None
    except OSError as error:  # OmegaConf raises OSError for a scalar document, e.g. "3"
        raise ConfigError(f"config file {path} must hold a mapping of keys: {error}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"config file {path} must hold a mapping of keys, got {type(loaded).__name__}"
        )
    return loaded


def _parse_override(override: str) -> DictConfig:
    """Parse one ``dotted.key=value`` override; the value is read as YAML (``[a,b]``, ``1e-4``)."""
    key, sep, _ = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"malformed override {override!r}: expected 'dotted.key=value'")
    try:
        return OmegaConf.from_dotlist([override])
    except (yaml.YAMLError, OmegaConfBaseException) as error:
        raise ConfigError(f"cannot parse override {override!r}: {_first_line(error)}") from None


def _merge(
    cfg: DictConfig, update: DictConfig, schema: type, source: str, key: str | None = None
) -> DictConfig:
    """Merge ``update`` into ``cfg``, turning OmegaConf's errors into ``ConfigError``."""
    try:
        return typing.cast(DictConfig, OmegaConf.merge(cfg, update))
    except OmegaConfBaseException as error:
        if not error.full_key and key:
            # Replacing a whole section (``train=3``) fails without naming the key; we know it.
            error.full_key = key
            error.value = OmegaConf.select(update, key)
        raise ConfigError(_describe(error, schema, source)) from None
    except TypeError as error:  # e.g. "train.cameras.0.x=1": a mapping merged into a list
        raise ConfigError(f"invalid config ({source}): {error}") from None


def _describe(error: OmegaConfBaseException, schema: type, source: str) -> str:
    """Write a one-line message for an OmegaConf error that names the dotted key."""
    full_key = error.full_key
    if isinstance(error, ConfigKeyError) and full_key:
        parent, _, _ = full_key.rpartition(".")
        where = f"under '{parent}'" if parent else "at the top level"
        valid = _valid_keys(error.object_type)
        hint = f"; valid keys {where}: {', '.join(valid)}" if valid else ""
        return f"unknown config key '{full_key}' ({source}){hint}"
    if isinstance(error, ValidationError) and full_key:
        expected = _field_type(schema, full_key)
        got = _show_value(error.value)
        if expected is None:
            return (
                f"config key '{full_key}' got invalid value {got} ({source}): {_first_line(error)}"
            )
        return f"config key '{full_key}' expects {_type_name(expected)}, got {got} ({source})"
    return f"invalid config ({source}): {_first_line(error)}"


def _valid_keys(object_type: Any) -> list[str]:
    """List the field names of the dataclass that rejected a key (empty if unknown)."""
    if isinstance(object_type, type) and dataclasses.is_dataclass(object_type):
        return [field.name for field in dataclasses.fields(object_type)]
    return []


def _field_type(schema: type, full_key: str) -> Any | None:
    """Follow a dotted key such as ``train.cameras[0]`` through the schema to its declared type."""
    current: Any = schema
    for part in re.findall(r"[^.\[\]]+", full_key):
        current = _strip_optional(current)
        origin = typing.get_origin(current)
        args = typing.get_args(current)
        if isinstance(current, type) and dataclasses.is_dataclass(current):
            hints = typing.get_type_hints(current)
            if part not in hints:
                return None
            current = hints[part]
        elif origin in (list, tuple, Sequence) and args:
            current = args[0]
        elif origin in (dict, Mapping) and len(args) == 2:
            current = args[1]
        else:
            return None
    return current


def _strip_optional(annotation: Any) -> Any:
    """Turn ``X | None`` into ``X`` so the walk can look inside it."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return annotation
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return args[0] if len(args) == 1 else annotation


def _type_name(annotation: Any) -> str:
    """Name a type the way it is written in code: ``int``, ``list[str]``, ``Optional[float]``."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _show_value(value: Any) -> str:
    """Show a rejected value as plain Python (OmegaConf containers become dicts and lists)."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return repr(value)


def _first_line(error: BaseException) -> str:
    """OmegaConf appends ``full_key``/``object_type`` lines to its messages; keep the first."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
