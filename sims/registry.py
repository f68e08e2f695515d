"""The task registry and the public constructors (``make``, ``make_expert``, ``list_tasks``).

Each tabletop task module registers its ``Task`` class once (``register_task``); the registry is
the one place that maps a name to its class, and so to its episode length and scripted expert, and
it gives every task the Gymnasium id ``embodied/<name>-v0``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from embodied.sims.tasks.base import Task

METAWORLD_PREFIX = "metaworld/"
_TABLETOP_ENTRY_POINT = "embodied.sims.tabletop:TabletopEnv"  # a string: no MuJoCo import here
_TASKS: dict[str, type[Task]] = {}  # tabletop task name -> class, in registration order
TaskClass = TypeVar("TaskClass", bound=type[Task])
_MAKE_KEYWORDS = {"max_episode_steps", "disable_env_checker"}  # gym.make's own, beside the env's

if "embodied/MetaWorld-v0" not in gym.registry:
    gym.register(id="embodied/MetaWorld-v0", entry_point="embodied.sims.metaworld:MetaWorldEnv")


def task_id(task: str) -> str:
    """Gymnasium id of a tabletop task name, e.g. ``PickPlace`` -> ``embodied/PickPlace-v0``."""
    return f"embodied/{task}-v0"


def register_task(cls: TaskClass) -> TaskClass:
    """Register a tabletop task class under ``cls.name``; use it as the class's decorator.

    ``make(name)``, ``gymnasium.make("embodied/<name>-v0")`` (time limit ``cls.episode_steps``),
    ``make_expert`` and ``list_tasks`` then know the task. Registering the same class again (a
    re-imported module) replaces it; another class under a taken name is refused.
    """
    _check_task_class(cls)
    name, known = cls.name, _TASKS.get(cls.name)
    if known is not None and _qualname(known) != _qualname(cls):
        raise ValueError(
            f"task name {name!r} is taken by {_qualname(known)}; "
            f"call unregister_task({name!r}) first to replace it"
        )
    if known is None and task_id(name) in gym.registry:
        raise ValueError(f"task name {name!r} clashes with the Gymnasium id {task_id(name)!r}")
    _TASKS[name] = cls
    gym.registry.pop(task_id(name), None)  # re-registration: no "overriding" warning
    gym.register(
        id=task_id(name),
        entry_point=_TABLETOP_ENTRY_POINT,
        kwargs={"task": name},
        max_episode_steps=cls.episode_steps,
    )
    return cls


def unregister_task(task: str) -> None:
    """Remove a registered tabletop task (and its Gymnasium id), e.g. a test's own task."""
    name = get_task(task).name
    del _TASKS[name]
    gym.registry.pop(task_id(name), None)


def get_task(task: str) -> type[Task]:
    """The registered ``Task`` class of a tabletop task name or id (``embodied/<name>-v0``)."""
    name = task.removeprefix("embodied/").removesuffix("-v0")
    if name not in _TASKS:
        raise ValueError(
            f"unknown task {task!r}; available: {', '.join(_TASKS)}, "
            f"or '{METAWORLD_PREFIX}<name>' for Meta-World"
        )
    return _TASKS[name]


def task_stages(task: str) -> tuple[str, ...]:
    """Ordered stage names of a task, which its ``info["stage"]`` indexes: a tabletop task (name
    or id) or a Meta-World task, with its ``metaworld/`` prefix or bare as datasets name it."""
    name = task.removeprefix(METAWORLD_PREFIX)
    if name == task and not name.endswith("-v3"):  # Meta-World's names end in their version
        return get_task(task).stages
    from embodied.sims.metaworld_stages import stage_rule  # no Meta-World import

    return stage_rule(name).names


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_task_class(cls: Any) -> None:
    """Refuse what is not a complete ``Task`` subclass, naming the missing or bad attribute."""
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task takes a subclass of {_qualname(Task)}, got {cls!r}")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(f"{_qualname(cls)} does not implement {missing}")
    where = _qualname(cls)
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{where}.name must be an identifier like 'PickPlace', got {name!r}")
    for attr in ("stages", "templates"):
        value = getattr(cls, attr, None)
        if not (isinstance(value, tuple) and value and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{where}.{attr} must be a non-empty tuple of str, got {value!r}")
    steps = getattr(cls, "episode_steps", None)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"{where}.episode_steps must be a positive int, got {steps!r}")


def suite_of(task: str) -> str:
    """The suite of a task name: ``metaworld`` for ``metaworld/<name>``, else ``tabletop``."""
    return "metaworld" if task.startswith(METAWORLD_PREFIX) else "tabletop"


def list_tasks(suite: str = "tabletop") -> list[str]:
    """Task names of a suite: ``tabletop`` (registered tasks, the built-in ones first) or
    ``metaworld`` (needs the extra)."""
    if suite == "tabletop":
        return list(_TASKS)
    if suite == "metaworld":
        from embodied.sims.metaworld import metaworld_tasks

        return [METAWORLD_PREFIX + name for name in metaworld_tasks()]
    raise ValueError(f"unknown suite {suite!r}; available: tabletop, metaworld")


def check_env_options(task: str, options: Mapping[str, Any]) -> None:
    """Refuse, before anything is built, options the task's env does not take: a ValueError
    naming them and the ones it takes (its constructor's keywords and ``gym.make``'s)."""
    if task.startswith(METAWORLD_PREFIX):
        env_id = "embodied/MetaWorld-v0"
    else:
        env_id = task_id(get_task(task).name)
    env_class = load_env_creator(gym.spec(env_id).entry_point)
    accepted = (set(inspect.signature(env_class).parameters) - {"task"}) | _MAKE_KEYWORDS
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(
            f"{task} takes no env option {', '.join(unknown)}; "
            f"its options: {', '.join(sorted(accepted))}"
        )


def make(task: str, **kwargs: Any) -> gym.Env:
    """Build one environment from a task name (``PickPlace``, ``metaworld/reach-v3``) or an id;
    unknown options are refused by name (``check_env_options``)."""
    check_env_options(task, kwargs)
    if task.startswith(METAWORLD_PREFIX):
        # Meta-World enforces its own episode limit: hand it over rather than wrap a TimeLimit.
        if "max_episode_steps" in kwargs:
            kwargs["max_path_length"] = kwargs.pop("max_episode_steps")
        return gym.make("embodied/MetaWorld-v0", task=task[len(METAWORLD_PREFIX) :], **kwargs)
    return gym.make(task_id(get_task(task).name), **kwargs)


def episode_limit(env: gym.Env) -> int | None:
    """The step limit of an env built by ``make``: Gymnasium's time limit, or the one Meta-World
    enforces itself (``max_episode_steps`` given to ``make`` either way); None when it has none."""
    if env.spec is not None and env.spec.max_episode_steps is not None:
        return int(env.spec.max_episode_steps)
    limit = getattr(env.unwrapped, "max_episode_steps", None)
    return None if limit is None else int(limit)


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
