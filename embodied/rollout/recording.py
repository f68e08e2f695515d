"""Recording rollouts into a LeRobot v3 dataset: a new one, or appending to one whose
observations match the env's (``embodied collect`` for scripted episodes, ``embodied eval
record=...`` for a policy's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

from embodied.core.features import ENV_STATE_KEY, observation_feature
from embodied.datasets import LeRobotDatasetWriter


def open_episode_writer(
    out: Path, env: Any, obs_mode: str, fps: int = 16, lossless: bool = False
) -> LeRobotDatasetWriter:
    """A writer for ``out``: a new dataset, or the one there after checking that ``env``'s
    observations (in ``obs_mode``) match it (ValueError naming the setting otherwise)."""
    out = Path(out)

    def append() -> LeRobotDatasetWriter:
        # Labels are derived from the whole dataset: appending drops them (a warning says so).
        return LeRobotDatasetWriter.open(out, fps=fps, lossless=lossless, drop_added_features=True)

    if (out / "meta" / "info.json").exists():
        writer = append()
    else:
        try:
            writer = LeRobotDatasetWriter(
                out, fps=fps, lossless=lossless, names=state_names(env, obs_mode)
            )
        except FileExistsError as error:
            if not (out / "meta" / "info.json").exists():
                raise ValueError(f"out: {error}") from None
            writer = append()  # another run created the dataset meanwhile
    try:
        check_observations(writer.features, env, out)
    except BaseException:
        writer.close()
        raise
    return writer


def check_observations(features: dict[str, Any], env: Any, out: Path) -> None:
    """The env's observations must be the dataset's observation features, with their shapes."""
    recorded = {
        name: list(feature["shape"])
        for name, feature in features.items()
        if str(feature.get("trajectory_field", "")).startswith("observations/")
    }
    if not recorded:  # a new (or empty) dataset takes whatever comes
        return
    ours: dict[str, list[int]] = {}

    def walk(space: Any, path: tuple[str, ...]) -> None:
        if isinstance(space, gym.spaces.Dict):
            for key, sub in space.spaces.items():
                walk(sub, (*path, key))
        else:
            ours[observation_feature(path)] = list(space.shape) or [1]

    walk(env.observation_space, ())
    if set(ours) != set(recorded):
        missing, extra = sorted(set(recorded) - set(ours)), sorted(set(ours) - set(recorded))
        hint = (
            " (obs_mode=pixels_state records it; eval: env.obs_mode=pixels_state)"
            if ENV_STATE_KEY in missing
            else ""
        )
        raise ValueError(
            f"obs_mode/cameras: this run records the observations {sorted(ours)} but the dataset "
            f"at {out} has {sorted(recorded)}: missing {missing}, extra {extra}{hint}"
        )
    for name, shape in ours.items():
        if shape != recorded[name]:
            setting_name = "image_size" if features[name]["dtype"] == "video" else "task/obs_mode"
            raise ValueError(
                f"{setting_name}: this run records {name} with shape {shape} but the dataset at "
                f"{out} has {recorded[name]}"
            )


def recorded_env_options(features: dict[str, Any]) -> dict[str, Any]:
    """The env options that record what a dataset holds (``features``: its info.json's): the
    named cameras and their image size, and ``obs_mode`` (whether it has images, the environment
    state or both), cameras in the dataset's order. A single unnamed camera
    (``observation.image``) is the env's default one: ``cameras`` is left unset."""
    fields = {str(feature.get("trajectory_field", "")): feature for feature in features.values()}
    images = {
        field.removeprefix("observations/pixels").lstrip("/"): feature
        for field, feature in fields.items()
        if field == "observations/pixels" or field.startswith("observations/pixels/")
    }
    has_state = ENV_STATE_KEY in features
    options: dict[str, Any] = {}
    if images:
        options["obs_mode"] = "pixels_state" if has_state else "pixels"
        options["image_size"] = int(next(iter(images.values()))["shape"][0])
        if "" not in images:
            options["cameras"] = list(images)
    elif has_state:
        options["obs_mode"] = "state"
    return options


def state_names(env: Any, obs_mode: str) -> dict[str, list[str]]:
    """The env's names for the state observations it returns in ``obs_mode``."""
    names = env.get_wrapper_attr("feature_names")
    returned = {"agent_pos"} | ({"environment_state"} if obs_mode != "pixels" else set())
    return {key: value for key, value in names.items() if key in returned}
