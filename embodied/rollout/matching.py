"""Matching a policy to an environment: the env options that give a policy exactly the inputs its
``ObservationSpec`` names, and a check, before any rollout, that an env can feed it and take its
actions (action size, cameras and image sizes, state size and the names of the state values)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from embodied.core.features import (
    CAMERA_PREFIX,
    ENV_STATE_KEY,
    GOAL_PREFIX,
    IMAGE_KEY,
    STATE_KEY,
    ActionSpec,
    ObservationSpec,
    one_camera_alias,
)


def env_options(spec: ObservationSpec) -> dict[str, Any]:
    """Env options (``obs_mode``, ``cameras``, ``image_size``) that render what ``spec`` reads
    and nothing else: no camera for a state-only policy, no privileged state for a pixel policy.

    A single ``observation.image`` names no camera: the env's default camera (tabletop
    ``front``, Meta-World ``corner2``) is the one that produced it, so no camera is passed.
    State values named ``goal.*`` ask for the goal in the state (``goal_state``)."""
    reads_goal = any(n.startswith(GOAL_PREFIX) for n in spec.env_state_names)
    goal = {"goal_state": True} if reads_goal else {}
    if not spec.cameras:
        return {"obs_mode": "state", **goal}
    keys = list(spec.cameras)
    sizes = {tuple(spec.cameras[k]) for k in keys}
    if len(sizes) > 1:
        raise ValueError(f"the cameras {keys} have different sizes {sorted(sizes)}")
    options: dict[str, Any] = {
        "obs_mode": "pixels_state" if spec.privileged else "pixels",
        "image_size": sizes.pop(),
    }
    if keys != [IMAGE_KEY]:
        options["cameras"] = [camera_name(k) for k in keys]
    return options | goal


def camera_name(key: str) -> str:
    """``observation.images.wrist`` -> ``wrist``; refuses a key that names no camera."""
    if not key.startswith(CAMERA_PREFIX):
        raise ValueError(f"{key!r} is not a named camera feature ({CAMERA_PREFIX}<camera>)")
    return key[len(CAMERA_PREFIX) :]


def _env_attr(env: gym.Env | gym.vector.VectorEnv, name: str, default: Any) -> Any:
    """An attribute of an env, or of a vector env's first sub-env; ``default`` where there is
    none to ask."""
    if isinstance(env, gym.vector.VectorEnv):
        return env.get_attr(name)[0] if hasattr(env, "get_attr") else default
    return getattr(env.unwrapped, name, default)


def image_camera(env: gym.Env | gym.vector.VectorEnv) -> str | None:
    """The camera an env's single ``observation.image`` shows (its only camera), where it says
    (``cameras``, as the tabletop and Meta-World envs do); None otherwise."""
    try:
        cameras = _env_attr(env, "cameras", None)
    except AttributeError:  # a sub-env that does not say
        return None
    return str(cameras[0]) if cameras is not None and len(cameras) == 1 else None


def env_spec(env: gym.Env | gym.vector.VectorEnv) -> tuple[ObservationSpec, int]:
    """What an env (or each sub-env of a vector env) offers: its cameras with sizes, state sizes
    with value names (when the env names them, ``feature_names``), and its action size."""
    if isinstance(env, gym.vector.VectorEnv):
        space, action_space = env.single_observation_space, env.single_action_space
    else:
        space, action_space = env.observation_space, env.action_space
    names = _env_attr(env, "feature_names", {})
    cameras: dict[str, tuple[int, int]] = {}
    pixels = space.spaces.get("pixels") if isinstance(space, gym.spaces.Dict) else None
    if isinstance(pixels, gym.spaces.Dict):
        cameras = {CAMERA_PREFIX + c: tuple(s.shape[:2]) for c, s in pixels.spaces.items()}
    elif pixels is not None:
        cameras = {IMAGE_KEY: tuple(pixels.shape[:2])}
    sizes = {key: int(s.shape[-1]) for key, s in space.spaces.items() if key != "pixels"}
    offered = ObservationSpec(
        cameras=cameras,
        state_dim=sizes.get("agent_pos", 0),
        state_names=tuple(names.get("agent_pos", ())),
        env_state_dim=sizes.get("environment_state", 0),
        env_state_names=tuple(names.get("environment_state", ())),
    )
    return offered, int(action_space.shape[-1])


def check_policy_env(
    spec: ObservationSpec,
    action: ActionSpec,
    env: gym.Env | gym.vector.VectorEnv,
    task: str,
    what: str = "the policy",
) -> None:
    """Refuse an env that cannot feed ``spec`` or take ``action``'s actions, naming both sides:
    action size, each camera and its size, state sizes, and the state values' names where both
    sides name them (a tabletop policy on Meta-World has the same sizes but other values)."""
    offered, action_dim = env_spec(env)
    alias = one_camera_alias(list(spec.cameras), offered.cameras, image_camera(env))
    problems: list[str] = []
    if action.dim != action_dim:
        problems.append(f"{what} outputs {action.dim}-D actions, {task} takes {action_dim}-D")
    for key, size in spec.cameras.items():
        key = alias.get(key, key)
        if key not in offered.cameras:
            problems.append(
                f"{what} reads {key}, {task} offers {sorted(offered.cameras) or 'none'}"
            )
        elif tuple(offered.cameras[key]) != tuple(size):
            problems.append(f"{what} reads {key} at {tuple(size)}, {task} renders it at "
                            f"{tuple(offered.cameras[key])}")  # fmt: skip
    for key, dim, names, env_dim, env_names in (
        (STATE_KEY, spec.state_dim, spec.state_names, offered.state_dim, offered.state_names),
        (ENV_STATE_KEY, spec.env_state_dim, spec.env_state_names, offered.env_state_dim,
         offered.env_state_names),
    ):  # fmt: skip
        if not dim:
            continue
        if dim != env_dim:
            problems.append(f"{what} reads a {dim}-D {key}, {task} gives {env_dim}-D")
        elif names and env_names and tuple(names) != tuple(env_names):
            problems.append(f"{what} reads {key} values {list(names)}, {task} gives "
                            f"{list(env_names)}")  # fmt: skip
    if problems:
        raise ValueError("policy and environment do not match: " + "; ".join(problems))
