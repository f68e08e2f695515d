"""Rollouts on one machine or a Ray cluster, behind one interface.

``make_rollouts(cfg, task, env_kwargs, policy)`` gives a backend with ``set_weights(policy)``,
``run(seeds, sample_seed, deterministic) -> trajectories`` (in episode order) and ``close()``:

- ``local``: one vector env in this process, one batched policy call per step.
- ``ray`` (extra ``distributed``): ``workers`` Ray actors, each with its own vector env (by
  default its share of the local backend's sub-envs, so a worker steps all its episodes with one
  batched policy call, as the local backend does) and a policy copy; weights are broadcast once
  per ``set_weights`` (an object-store reference), the episodes are split into contiguous
  chunks, one per worker, and gathered in order. Every episode's sampling noise is seeded by
  ``(sample_seed, episode id)`` (``PolicyActor``), so the same seeds give the same trajectories
  as the local backend. A worker that dies is dropped with a warning and its chunk runs again on
  the others.

``address=""`` starts a private Ray instance (``num_cpus``); ``"auto"`` or ``ray://host:port``
joins an existing cluster. A multi-task run builds one backend per task and rolls the tasks out
one after another, so each task's actors reserve ``1 / tasks`` of a CPU: ``workers`` CPUs in all,
the ones that work at any time (a whole CPU each would leave a 2-CPU machine's third actor
waiting for a CPU forever).
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
    # A worker's sub-envs; 0 = its share of the sub-envs the local backend would hold. A pixel
    # planner's step is mostly its batched denoising chain, which costs little more for 8
    # sub-envs than for 4: fewer sub-envs than episodes queue the rest behind them
    envs_per_worker: int = setting(0, low=0)
    num_cpus: int = setting(0, low=0)  # a private instance's CPUs; 0 = Ray's default (all)

    def worker_envs(self, num_envs: int) -> int:
        """A Ray worker's sub-envs where the local backend would hold ``num_envs``."""
        return self.envs_per_worker or math.ceil(num_envs / self.workers)


def _rollout(vec: Any, policy: Any, seeds: Sequence[int], ids: Sequence[int], sample_seed: int,
             deterministic: bool, task: str, env_kwargs: dict[str, Any]) -> list[Any]:  # fmt: skip
    """Episodes ``seeds`` (ids ``ids``) on ``vec`` (built from ``task`` and ``env_kwargs``),
    decisions recorded, in the given order; with ``render_state`` their frames render when read
    (and a camera policy's env renders only the images the policy reads)."""
    actor = PolicyActor(
        policy, vec.num_envs, deterministic=deterministic, seed=sample_seed, record=True
    )
    skip = sims.skips_unread_images(env_kwargs)
    trajs = rollout_vector(vec, actor, list(seeds), episode_ids=list(ids), skip_unread_images=skip)
    by_id = {int(t.metadata["episode_id"]): t for t in trajs}  # yielded in finishing order
    ordered = [by_id[i] for i in ids]
    sims.attach_replay_frames(ordered, task, env_kwargs)
    return ordered


class LocalRollouts:
    """All episodes on one vector env in this process."""

    def __init__(
        self,
        task: str,
        env_kwargs: dict[str, Any],
        policy: Any,
        num_envs: int,
        asynchronous: bool = False,
    ) -> None:
        self.policy, self.task, self.env_kwargs = policy, task, env_kwargs
        self.vec = sims.make_vec_env(
            task, num_envs, asynchronous=asynchronous, autoreset_mode="disabled", **env_kwargs
        )

    def set_weights(self, policy: Any) -> None:
        """Act with ``policy`` (the same object: nothing to copy)."""
        self.policy = policy

    def run(self, seeds: Sequence[int], sample_seed: int, deterministic: bool = False) -> list[Any]:
        """One episode per seed, in order."""
        ids = range(len(seeds))
        return _rollout(self.vec, self.policy, seeds, ids, sample_seed, deterministic, self.task,
                        self.env_kwargs)  # fmt: skip

    def close(self) -> None:
        self.vec.close()


class RolloutWorker:
    """A Ray actor's state: its own vector env and policy copy (built inside the worker)."""

    def __init__(self, task: str, env_kwargs: dict[str, Any], policy: Any, num_envs: int) -> None:
        torch.set_num_threads(1)  # one core per worker: the workers share the machine
        self.policy, self.task, self.env_kwargs = policy.eval(), task, env_kwargs
        self.vec = sims.make_vec_env(task, num_envs, autoreset_mode="disabled", **env_kwargs)

    def set_weights(self, state: dict[str, Any]) -> bool:
        self.policy.load_state_dict(state)
        return True

    def run(self, seeds: list[int], ids: list[int], sample_seed: int, deterministic: bool) -> list:
        return _rollout(self.vec, self.policy, seeds, ids, sample_seed, deterministic, self.task,
                        self.env_kwargs)  # fmt: skip

    def pid(self) -> int:
        return os.getpid()


class RayRollouts:
    """Episodes split over Ray actors (see the module docstring)."""

    def __init__(
        self,
        cfg: DistributedConfig,
        task: str,
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
            elif cfg.num_cpus:
                kwargs["num_cpus"] = cfg.num_cpus
            ray.init(**kwargs)
        cpus = ray.cluster_resources().get("CPU", 0)
        if not cfg.address and cfg.workers > cpus:  # a cluster may add nodes; this machine won't
            raise ValueError(
                f"distributed.workers={cfg.workers}: the local Ray instance has {cpus:g} CPUs and "
                "a worker takes one; use at most that many workers (or raise distributed.num_cpus)"
            )
        self.envs_per_worker = cfg.worker_envs(num_envs)
        remote = ray.remote(num_cpus=cpus_per_worker)(RolloutWorker)
        # A CPU copy for the workers: Module.to moves in place, and the learner keeps its device.
        cpu_policy = copy.deepcopy(policy).to("cpu")
        self.workers = [
            remote.remote(task, env_kwargs, cpu_policy, self.envs_per_worker)
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

    def run(self, seeds: Sequence[int], sample_seed: int, deterministic: bool = False) -> list[Any]:
        """One episode per seed, in order; a dead worker's chunk runs again on the others."""
        pending = list(range(len(seeds)))
        done: dict[int, Any] = {}
        while pending:
            if not self.workers:
                raise RuntimeError("every rollout worker died")
            chunks = _split(pending, len(self.workers))
            calls = [
                (worker, chunk, worker.run.remote([seeds[i] for i in chunk], chunk, sample_seed,
                                                  deterministic))
                for worker, chunk in zip(self.workers, chunks, strict=False)
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
    task: str,
    env_kwargs: dict[str, Any],
    policy: Any,
    num_envs: int,
    tasks: int = 1,
) -> LocalRollouts | RayRollouts:
    """The configured backend (``num_envs`` is the local backend's vector size, which Ray's workers
    split unless ``envs_per_worker`` is set) for one of ``tasks`` backends that take turns (Ray
    actors reserve ``1 / tasks`` of a CPU each)."""
    validate(cfg)
    if cfg.backend == "local":
        return LocalRollouts(task, env_kwargs, policy, num_envs)
    return RayRollouts(cfg, task, env_kwargs, policy, num_envs, cpus_per_worker=1.0 / tasks)
