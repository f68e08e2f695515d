"""Rollouts on one machine or a Ray cluster, behind one interface.

``make_rollouts(cfg, task, env_kwargs, policy, num_envs)`` gives a backend with
``set_weights(policy)``, ``run(seeds, sample_seed, deterministic, tasks) -> trajectories`` (in
episode order) and ``close()``. ``task`` may be several tasks of one suite, ``num_envs`` sub-envs
each, in one vector env: a multi-task policy steps all of them with one batched call (``tasks``
then names each episode's task).

- ``local``: one vector env in this process, one batched policy call per step.
- ``ray`` (extra ``distributed``): ``workers`` Ray actors, each with its own vector env (by
  default its share of the local backend's sub-envs, so a worker steps all its episodes with one
  batched policy call, as the local backend does) and a policy copy; weights are broadcast once
  per ``set_weights`` (an object-store reference), each task's episodes are split into
  contiguous chunks, one per worker, and gathered in order. Every episode's sampling noise is
  seeded by ``(sample_seed, episode id)`` (``PolicyActor``), so the same seeds give the same
  trajectories as the local backend. A worker that dies is dropped with a warning and its chunk
  runs again on the others.

``address=""`` starts a private Ray instance (``num_cpus``) whose workers run at this process's
priority; ``"auto"`` or ``ray://host:port`` joins an existing cluster. Backends that take turns
(a multi-task run whose tasks need envs of different options) reserve ``1 / backends`` of a CPU
per actor: ``workers`` CPUs in all, the ones that work at any time (a whole CPU each would leave
a 2-CPU machine's third actor waiting for a CPU forever).
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import embodied.sims as sims
from embodied.core.config import setting, validate
from embodied.rollout.episodes import PolicyActor, rollout_vector

BACKENDS = ("local", "ray")


@dataclass
class DistributedConfig:
    """Where rollouts run; part of the GRPO/TPO configs as ``distributed.*``."""

    backend: str = setting("local", choices=BACKENDS)
    address: str = ""  # ray: "" = a private local instance, "auto" or ray://host:port = a cluster
    workers: int = setting(2, low=1)  # ray actors
    # A worker's sub-envs of each task; 0 = its share of the local backend's. A pixel
    # planner's step is mostly its batched denoising chain, which costs little more for 8
    # sub-envs than for 4: fewer sub-envs than episodes queue the rest behind them
    envs_per_worker: int = setting(0, low=0)
    num_cpus: int = setting(0, low=0)  # a private instance's CPUs; 0 = Ray's default (all)

    def worker_envs(self, num_envs: int) -> int:
        """A Ray worker's sub-envs where the local backend would hold ``num_envs``."""
        return self.envs_per_worker or math.ceil(num_envs / self.workers)


def task_list(task: str | Sequence[str]) -> list[str]:
    """A backend's tasks: one, or several distinct ones."""
    tasks = [task] if isinstance(task, str) else [str(t) for t in task]
    if not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"a backend runs one task or several distinct ones, got {task!r}")
    return tasks


def episode_tasks(tasks: list[str], episodes: int, given: Sequence[str] | None) -> list[str]:
    """Each episode's task: ``given``, or the backend's only task."""
    if given is None:
        if len(tasks) > 1:
            raise ValueError(f"this backend runs {tasks}: name each episode's task (tasks=...)")
        return tasks * episodes
    if len(given) != episodes:
        raise ValueError(f"got {len(given)} tasks for {episodes} episodes")
    unknown = sorted(set(given) - set(tasks))
    if unknown:
        raise ValueError(f"task(s) {unknown} are not this backend's; it runs {tasks}")
    return [str(t) for t in given]


class TaskEnvs:
    """A vector env with ``num_envs`` sub-envs of each task, and the rollouts it runs."""

    def __init__(self, tasks: list[str], env_kwargs: dict[str, Any], num_envs: int,
                 asynchronous: bool = False) -> None:  # fmt: skip
        self.tasks, self.env_kwargs = tasks, env_kwargs
        self.env_tasks = [task for task in tasks for _ in range(num_envs)]
        self.vec = sims.make_vec_env(self.env_tasks, len(self.env_tasks), asynchronous=asynchronous,
                                     autoreset_mode="disabled", **env_kwargs)  # fmt: skip

    def rollout(self, policy: Any, seeds: Sequence[int], ids: Sequence[int], tasks: list[str],
                sample_seed: int, deterministic: bool) -> list[Any]:  # fmt: skip
        """Episodes ``seeds`` (ids ``ids``, on ``tasks``), decisions recorded, in the given order;
        with ``render_state`` their frames render when read (and a camera policy's env renders
        only the images the policy reads)."""
        actor = PolicyActor(
            policy, self.vec.num_envs, deterministic=deterministic, seed=sample_seed, record=True
        )
        skip = sims.skips_unread_images(self.env_kwargs)
        trajs = rollout_vector(self.vec, actor, list(seeds), episode_ids=list(ids),
                               skip_unread_images=skip, env_tasks=self.env_tasks,
                               episode_tasks=tasks)  # fmt: skip
        by_id = {int(t.metadata["episode_id"]): t for t in trajs}  # yielded in finishing order
        ordered = [by_id[i] for i in ids]
        for task in dict.fromkeys(tasks):
            mine = [t for t, k in zip(ordered, tasks, strict=True) if k == task]
            sims.attach_replay_frames(mine, task, self.env_kwargs)
        return ordered

    def close(self) -> None:
        self.vec.close()


class LocalRollouts:
    """All episodes on one vector env in this process (``num_envs`` sub-envs per task)."""

    def __init__(
        self,
        task: str | Sequence[str],
        env_kwargs: dict[str, Any],
        policy: Any,
        num_envs: int,
        asynchronous: bool = False,
    ) -> None:
        self.policy, self.tasks = policy, task_list(task)
        self.envs = TaskEnvs(self.tasks, env_kwargs, num_envs, asynchronous)

    def set_weights(self, policy: Any) -> None:
        """Act with ``policy`` (the same object: nothing to copy)."""
        self.policy = policy

    def run(self, seeds: Sequence[int], sample_seed: int, deterministic: bool = False,
            tasks: Sequence[str] | None = None) -> list[Any]:  # fmt: skip
        """One episode per seed (on ``tasks[e]`` where the backend has several), in order."""
        tasks = episode_tasks(self.tasks, len(seeds), tasks)
        return self.envs.rollout(self.policy, seeds, range(len(seeds)), tasks, sample_seed,
                                 deterministic)  # fmt: skip

    def close(self) -> None:
        self.envs.close()


class RolloutWorker:
    """A Ray actor's state: its own vector env and policy copy (built inside the worker)."""

    def __init__(self, tasks: list[str], env_kwargs: dict[str, Any], policy: Any,
                 num_envs: int) -> None:  # fmt: skip
        torch.set_num_threads(1)  # one core per worker: the workers share the machine
        self.policy = policy.eval()
        self.envs = TaskEnvs(tasks, env_kwargs, num_envs)

    def set_weights(self, state: dict[str, Any]) -> bool:
        self.policy.load_state_dict(state)
        return True

    def run(self, seeds: list[int], ids: list[int], tasks: list[str], sample_seed: int,
            deterministic: bool) -> list:  # fmt: skip
        return self.envs.rollout(self.policy, seeds, ids, tasks, sample_seed, deterministic)

    def pid(self) -> int:
        return os.getpid()


class RayRollouts:
    """Episodes split over Ray actors (see the module docstring)."""

    def __init__(
        self,
        cfg: DistributedConfig,
        task: str | Sequence[str],
        env_kwargs: dict[str, Any],
        policy: Any,
        num_envs: int,
        cpus_per_worker: float = 1.0,
    ) -> None:
        try:
            import ray
        except ImportError as error:
            raise ImportError(
                "distributed.backend=ray needs Ray: pip install 'embodied-toolkit[distributed]'"
            ) from error
        self.ray = ray
        if not ray.is_initialized():
            env = {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
            kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": False}
            if cfg.address:
                kwargs["address"] = cfg.address
            else:
                # Ray starts workers 15 nicer than itself, where anything else on the machine
                # (an evaluation, tests, another run) starves the rollouts the learner waits on;
                # the local backend steps at the learner's priority, and so do these workers.
                kwargs["_system_config"] = {"worker_niceness": 0}
                if cfg.num_cpus:
                    kwargs["num_cpus"] = cfg.num_cpus
            ray.init(**kwargs)
        cpus = ray.cluster_resources().get("CPU", 0)
        if not cfg.address and cfg.workers > cpus:  # a cluster may add nodes; this machine won't
            raise ValueError(
                f"distributed.workers={cfg.workers}: the local Ray instance has {cpus:g} CPUs and "
                "a worker takes one; use at most that many workers (or raise distributed.num_cpus)"
            )
        self.tasks = task_list(task)
        self.envs_per_worker = cfg.worker_envs(num_envs)  # of each task
        remote = ray.remote(num_cpus=cpus_per_worker)(RolloutWorker)
        # A CPU copy for the workers: Module.to moves in place, and the learner keeps its device.
        cpu_policy = copy.deepcopy(policy).to("cpu")
        self.workers = [
            remote.remote(self.tasks, env_kwargs, cpu_policy, self.envs_per_worker)
            for _ in range(cfg.workers)
        ]

    def set_weights(self, policy: Any) -> None:
        """Broadcast ``policy``'s weights to every worker (one object-store copy)."""
        state = self.ray.put({k: v.detach().cpu() for k, v in policy.state_dict().items()})
        self._call_all(lambda w: w.set_weights.remote(state))

    def _call_all(self, call: Any) -> None:
        for worker in list(self.workers):
            try:
                self.ray.get(call(worker))
            except self.ray.exceptions.RayActorError:
                self._drop(worker)

    def _drop(self, worker: Any) -> None:
        self.workers.remove(worker)
        warnings.warn(
            f"a rollout worker died; continuing on the {len(self.workers)} left", stacklevel=3
        )
        if not self.workers:
            raise RuntimeError("every rollout worker died")

    def run(self, seeds: Sequence[int], sample_seed: int, deterministic: bool = False,
            tasks: Sequence[str] | None = None) -> list[Any]:  # fmt: skip
        """One episode per seed (on ``tasks[e]`` where the backend has several), in order; a dead
        worker's chunk runs again on the others."""
        tasks = episode_tasks(self.tasks, len(seeds), tasks)
        pending = list(range(len(seeds)))
        done: dict[int, Any] = {}
        while pending:
            if not self.workers:
                raise RuntimeError("every rollout worker died")
            # each worker takes its share of every task's episodes: its sub-envs hold that share
            chunks: list[list[int]] = [[] for _ in self.workers]
            for task in self.tasks:
                parts = _split([i for i in pending if tasks[i] == task], len(self.workers))
                for chunk, part in zip(chunks, parts, strict=True):
                    chunk += part
            calls = [
                (worker, chunk, worker.run.remote([seeds[i] for i in chunk], chunk,
                                                  [tasks[i] for i in chunk], sample_seed,
                                                  deterministic))
                for worker, chunk in zip(self.workers, chunks, strict=True)
                if chunk
            ]  # fmt: skip
            failed: list[int] = []
            for worker, chunk, ref in calls:
                try:
                    for i, traj in zip(chunk, self.ray.get(ref), strict=True):
                        done[i] = traj
                except self.ray.exceptions.RayActorError:
                    self._drop(worker)
                    failed += chunk
            pending = failed
        return [done[i] for i in range(len(seeds))]

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []


def _split(items: list[int], parts: int) -> list[list[int]]:
    """``items`` in ``parts`` contiguous chunks of nearly equal size."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (p < extra)
        out.append(items[start:end])
        start = end
    return out


def make_rollouts(
    cfg: DistributedConfig,
    task: str | Sequence[str],
    env_kwargs: dict[str, Any],
    policy: Any,
    num_envs: int,
    backends: int = 1,
) -> LocalRollouts | RayRollouts:
    """The configured backend for ``task`` (one, or several of one suite), ``num_envs`` the local
    backend's sub-envs per task, which Ray's workers split unless ``envs_per_worker`` is set,
    as one of ``backends`` that take turns (Ray actors reserve ``1 / backends`` of a CPU each)."""
    validate(cfg)
    if cfg.backend == "local":
        return LocalRollouts(task, env_kwargs, policy, num_envs)
    return RayRollouts(cfg, task, env_kwargs, policy, num_envs, cpus_per_worker=1.0 / backends)
