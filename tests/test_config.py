"""Tests for embodied.core.config: defaults, YAML/override precedence, types, clear errors."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from embodied.core.config import ConfigError, config_to_dict, load_config, save_config


@dataclass
class Train:
    lr: float = 1e-3
    steps: int = 10
    name: str = "x"
    cameras: list[str] = field(default_factory=lambda: ["front"])


@dataclass
class Cfg:
    train: Train = field(default_factory=Train)
    seed: int = 0


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_a_real_dataclass() -> None:
    cfg = load_config(Cfg)
    assert cfg == Cfg()
    assert type(cfg) is Cfg
    assert type(cfg.train) is Train
    assert type(cfg.train.cameras) is list


def test_yaml_then_overrides_take_precedence(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "seed: 3\ntrain:\n  lr: 0.5\n  steps: 20\n")
    cfg = load_config(Cfg, path, ["train.lr=1e-4", "seed=7"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.train.steps == 20  # from YAML
    assert cfg.train.name == "x"  # default
    assert cfg.seed == 7


def test_override_of_a_list() -> None:
    cfg = load_config(Cfg, overrides=["train.cameras=[front,wrist]"])
    assert cfg.train.cameras == ["front", "wrist"]


def test_values_are_converted_to_declared_python_types(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "train:\n  lr: 1\n  steps: '5'\n  name: 12\n")
    cfg = load_config(Cfg, str(path))
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 1.0
    assert isinstance(cfg.train.steps, int) and cfg.train.steps == 5
    assert cfg.train.name == "12"
    assert dataclasses.is_dataclass(cfg)


def test_unknown_override_key_names_key_and_valid_siblings() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Cfg, overrides=["train.lrr=1e-4"])
    message = str(info.value)
    assert "'train.lrr'" in message
    assert "override" in message
    assert "lr" in message and "steps" in message and "cameras" in message


def test_unknown_top_level_key_lists_top_level_keys() -> None:
    with pytest.raises(ConfigError, match="'sede'.*train, seed"):
        load_config(Cfg, overrides=["sede=1"])


def test_wrong_type_names_key_expected_type_and_value() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Cfg, overrides=["train.steps=abc"])
    message = str(info.value)
    assert "'train.steps'" in message
    assert "int" in message
    assert "abc" in message


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        load_config(Cfg, overrides=["seed=nope"])


def test_malformed_override_is_named() -> None:
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(Cfg, overrides=["train.lr"])


def test_unknown_key_in_yaml_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "train:\n  stepz: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(Cfg, path)
    assert "'train.stepz'" in str(info.value)
    assert str(path) in str(info.value)


def test_wrong_type_in_yaml_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "seed: [1, 2]\n")
    with pytest.raises(ConfigError) as info:
        load_config(Cfg, path)
    assert "'seed'" in str(info.value) and "int" in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(Cfg, path)


@pytest.mark.parametrize("text", ["- a\n- b\n", "42\n"])
def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "list.yaml", text)
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Cfg, path)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.yaml", "train: {lr: 1\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        load_config(Cfg, path)


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    cfg = load_config(Cfg, overrides=["train.lr=1e-4", "train.name=1e-4", "train.cameras=[a,b]"])
    path = tmp_path / "sub" / "config.yaml"
    save_config(cfg, path)
    assert load_config(Cfg, path) == cfg
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]  # no temp file left


def test_config_to_dict_is_plain() -> None:
    assert config_to_dict(Cfg()) == {
        "train": {"lr": 1e-3, "steps": 10, "name": "x", "cameras": ["front"]},
        "seed": 0,
    }
