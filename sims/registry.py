"""Task names, Gymnasium registration and the public constructors (``make``, ``make_expert``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# Tabletop task name -> episode length limit (steps at 16 Hz control).
TABLETOP_TASKS: dict[str, int] = {
    "Reach": 80,
    "Push": 150,
    "PickPlace": 150,
    "Stack": 150,
    "DrawerOpen": 120,
    "ButtonPress": 100,
}
METAWORLD_PREFIX = "metaworld/"


def task_id(task: str) -> str:
    """Gymnasium id of a tabletop task name, e.g. ``PickPlace`` -> ``embodied/PickPlace-v0``."""
    return f"embodied/{task}-v0"


def _register() -> None:
    for name, steps in TABLETOP_TASKS.items():
        if task_id(name) not in gym.registry:
            gym.register(
                id=task_id(name),
                entry_point="embodied.sims.tabletop:TabletopEnv",
                kwargs={"task": name},
                max_episode_steps=steps,
            )
    if "embodied/MetaWorld-v0" not in gym.registry:
        gym.register(
            id="embodied/MetaWorld-v0",
            entry_point="embodied.sims.metaworld:MetaWorldEnv",
        )


_register()


def suite_of(task: str) -> str:
    """The suite of a task name: ``metaworld`` for ``metaworld/<name>``, else ``tabletop``."""
    return "metaworld" if task.startswith(METAWORLD_PREFIX) else "tabletop"


def list_tasks(suite: str = "tabletop") -> list[str]:
    """Task names of a suite: ``tabletop`` (built in) or ``metaworld`` (needs the extra)."""
    if suite == "tabletop":
        return list(TABLETOP_TASKS)
    if suite == "metaworld":
        from embodied.sims.metaworld import metaworld_tasks

        return [METAWORLD_PREFIX + name for name in metaworld_tasks()]
    raise ValueError(f"unknown suite {suite!r}; available: tabletop, metaworld")


def make(task: str, **kwargs: Any) -> gym.Env:
    """Build one environment from a task name (``PickPlace``, ``metaworld/reach-v3``) or an id."""
    if task.startswith(METAWORLD_PREFIX):
        # Meta-World enforces its own episode limit: hand it over rather than wrap a TimeLimit.
        if "max_episode_steps" in kwargs:
            kwargs["max_path_length"] = kwargs.pop("max_episode_steps")
        return gym.make("embodied/MetaWorld-v0", task=task[len(METAWORLD_PREFIX) :], **kwargs)
    name = task.removeprefix("embodied/").removesuffix("-v0")
    if name not in TABLETOP_TASKS:
        raise ValueError(
            f"unknown task {task!r}; available: {', '.join(TABLETOP_TASKS)}, "
            f"or '{METAWORLD_PREFIX}<name>' for Meta-World"
        )
    return gym.make(task_id(name), **kwargs)


class ScriptedExpert:
    """The scripted expert of an env as a policy: ``expert(obs) -> action``.

    ``noise`` adds Gaussian action noise from the expert's own generator (seeded by ``seed``), so
    envs reset to the same seed still get different noise per expert.
    """

    def __init__(
        self,
        env: gym.Env,
        noise: float = 0.0,
        seed: int | None = None,
        goal: dict[str, str] | None = None,
    ) -> None:
        if not hasattr(env.unwrapped, "scripted_action"):
            raise TypeError(f"{type(env.unwrapped).__name__} has no scripted expert")
        self.env, self.noise, self.goal = env, float(noise), goal
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: Any = None) -> np.ndarray:
        """Next action for the env's current state (``obs`` is accepted like a policy's)."""
        if self.goal is None:
            action = self.env.unwrapped.scripted_action()
        else:
            action = self.env.unwrapped.scripted_action(goal=self.goal)
        return self.add_noise(action)

    def add_noise(self, actions: np.ndarray) -> np.ndarray:
        """Add this expert's Gaussian noise to actions of any batch shape and clip to [-1, 1]."""
        return add_action_noise(actions, self.noise, self.rng)


def add_action_noise(actions: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian action noise (std ``noise``) from ``rng``, clipped to the [-1, 1] action box."""
    actions = np.asarray(actions, dtype=np.float32)
    if noise > 0:
        actions = actions + rng.normal(0.0, noise, size=actions.shape)
    return np.clip(actions, -1.0, 1.0).astype(np.float32)


def make_expert(
    env: gym.Env, noise: float = 0.0, seed: int | None = None, goal: dict[str, str] | None = None
) -> ScriptedExpert:
    """The scripted expert for ``env`` (tabletop rules, or Meta-World's ``metaworld.policies``)."""
    return ScriptedExpert(env, noise=noise, seed=seed, goal=goal)
