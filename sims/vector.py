"""Vector envs (gymnasium.vector) built lazily inside workers, and seed groups for GRPO."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState

from embodied.sims.registry import get_task, make, suite_of
from embodied.sims.workers import start_forkserver_without_sigint


def grouped_seeds(seeds: Sequence[int], group_size: int) -> list[int]:
    """Repeat each seed ``group_size`` times: ``vec.reset(seed=grouped_seeds([3, 7], 2))`` puts
    envs 0-1 in the initial state of seed 3 and envs 2-3 in that of seed 7 (a GRPO group each)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return [int(s) for s in seeds for _ in range(group_size)]


def _check_action_count(actions: Any, num_envs: int) -> None:
    """Refuse a batch with one action too many or too few, naming both counts (Gymnasium's own
    error is ``zip() argument 2 is shorter than argument 1``)."""
    try:
        count = len(actions)
    except TypeError:
        raise ValueError(f"expected a batch of {num_envs} actions, got {actions!r}") from None
    if count != num_envs:
        raise ValueError(f"got {count} actions for {num_envs} envs: give one action per env")


class _TaskInfos:
    """Infos batched over sub-envs of several tasks: an array whose shape differs between them
    (a render state's size follows the task's model) goes into an object array, one entry per
    sub-env, where Gymnasium would batch it into the first sub-env's shape and fail."""

    num_envs: int

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any],
                  env_num: int) -> dict[str, Any]:  # fmt: skip
        for key, value in env_info.items():
            batched = vector_infos.get(key)
            if (isinstance(value, np.ndarray) and isinstance(batched, np.ndarray)
                    and batched.dtype != object and batched.shape[1:] != value.shape):  # fmt: skip
                entries = np.empty(self.num_envs, dtype=object)
                for i, row in enumerate(batched):
                    entries[i] = row
                vector_infos[key] = entries
        return super()._add_info(vector_infos, env_info, env_num)  # type: ignore[misc]


class _SyncVectorEnv(_TaskInfos, gym.vector.SyncVectorEnv):
    def step(self, actions: Any) -> tuple[Any, ...]:
        _check_action_count(actions, self.num_envs)
        return super().step(actions)


class _AsyncVectorEnv(_TaskInfos, gym.vector.AsyncVectorEnv):
    def step_async(self, actions: Any) -> None:
        # Checked before any worker is sent a step, so the vector env stays usable.
        _check_action_count(actions, self.num_envs)
        super().step_async(actions)

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Closing with a call still pending (Ctrl-C between sending a step, reset or render
        and reading every answer) terminates the workers: Gymnasium would wait for all the
        answers, some of which may have been read already, and hang."""
        if self._state != AsyncState.DEFAULT:
            self._state, terminate = AsyncState.DEFAULT, True
        super().close_extras(timeout, terminate)


def render_envs(vec: gym.vector.VectorEnv, envs: Sequence[int]) -> dict[int, Any]:
    """``render()`` of the sub-envs ``envs`` only, by index. Gymnasium's ``call("render")``
    renders every sub-env: an evaluation filming 2 of 50 envs drew 25x the frames it kept. A sync
    vector env renders just those; an async one renders all (its workers share no per-env call)
    and keeps those."""
    envs = list(envs)
    if not envs:
        return {}
    if isinstance(vec, gym.vector.SyncVectorEnv):
        return {i: vec.envs[i].render() for i in envs}
    images = vec.call("render")
    return {i: images[i] for i in envs}


def task_module(task: str) -> str | None:
    """The module that registered a tabletop task, for a fresh worker process to import (None
    for other suites)."""
    return get_task(task).__module__ if suite_of(task) == "tabletop" else None


def enter_worker(module: str | None = None) -> None:
    """Set up a worker process (not the main one) for its envs: one render thread, and the
    module that registered its task (``task_module``) imported.

    Mesa's software renderer (llvmpipe) uses every core in each process; with one env per
    worker process, one render thread each lets the workers, not the threads, share the cores
    (2 cores: 596 vs 492 frames/s with 2 workers). An explicit setting wins. A fresh worker
    process knows the built-in tasks only: importing the module that registered the task
    registers it there too.
    """
    if multiprocessing.parent_process() is None:
        return  # the main process, where Gymnasium builds a throwaway env to read the spaces
    os.environ.setdefault("LP_NUM_THREADS", "1")
    if module is not None:
        importlib.import_module(module)


def _build(
    task: str, env_kwargs: dict[str, Any], in_worker: bool = False, module: str | None = None
) -> gym.Env:
    if in_worker:
        enter_worker(module)
    return make(task, **env_kwargs)


def make_vec_env(
    task: str | Sequence[str],
    num_envs: int,
    asynchronous: bool = False,
    autoreset_mode: str = "next_step",
    context: str | None = None,
    **env_kwargs: Any,
) -> gym.vector.VectorEnv:
    """Sync or async vector env. Each copy is constructed by its worker and renders lazily, so no
    GL context exists before the fork. ``autoreset_mode`` is Gymnasium's (``next_step``,
    ``same_step`` or ``disabled``). ``task`` may name one task per sub-env (tasks of one suite,
    whose observations share their spaces): a multi-task policy then steps them in one batch."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    tasks = [task] * num_envs if isinstance(task, str) else [str(t) for t in task]
    if len(tasks) != num_envs:
        raise ValueError(f"got {len(tasks)} tasks for {num_envs} envs: give one task per env")
    # Gymnasium's enum values are "NextStep", "SameStep", "Disabled"; accept those, the
    # snake_case names documented here, or the enum itself.
    modes = {m.name.lower(): m for m in gym.vector.AutoresetMode}
    modes.update({m.value: m for m in gym.vector.AutoresetMode})
    mode = modes.get(getattr(autoreset_mode, "value", autoreset_mode))
    if mode is None:
        raise ValueError(
            f"autoreset_mode must be one of {sorted(k for k in modes if k.islower())}, "
            f"got {autoreset_mode!r}"
        )
    builds = {t: functools.partial(_build, t, dict(env_kwargs), asynchronous, task_module(t))
              for t in dict.fromkeys(tasks)}  # fmt: skip
    fns = [builds[t] for t in tasks]
    if asynchronous:
        if context is None and "forkserver" in multiprocessing.get_all_start_methods():
            # Not "fork": a worker forked after the parent rendered inherits its GL state without
            # the driver's threads (Mesa llvmpipe's rasterizers) and hangs on its first render. A
            # fork server starts clean (it is Python 3.14's default on Linux). Pass context="fork"
            # to opt back in when the parent never renders.
            context = "forkserver"
        if context == "forkserver":
            start_forkserver_without_sigint()
        return _AsyncVectorEnv(fns, context=context, autoreset_mode=mode)
    return _SyncVectorEnv(fns, autoreset_mode=mode)
