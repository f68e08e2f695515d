"""``embodied bench rollout``: GRPO-style rollouts on each backend, against a sync vector env; and
a camera planner's rollouts rendering only the images it reads, against rendering every step, on
one sub-env (one policy call per episode step, as ``embodied eval --workers 1`` runs) against the
batched call of several (``--envs``), and over several tasks in one vector env (one batched call
for all, as a multi-task GRPO run steps them) against a backend per task in turn."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import embodied.policies  # noqa: F401  (registers the policy types)
import embodied.sims as sims
from embodied.apps.bench.common import Row, tabletop_features
from embodied.apps.bench.policy import POLICY_VARIANTS
from embodied.core.policy import POLICIES
from embodied.rollout.backends import DistributedConfig, LocalRollouts, make_rollouts

CAMERA_EVERY = "sync, camera planner, every image rendered"
CAMERA_READ = "sync, camera planner, read images rendered"
CAMERA_ONE = "sync, camera planner, read images rendered, one env"
RAY_SHARE = "ray, a sub-env per episode"
TASKS_IN_TURN = "sync, camera planner, a backend per task in turn"
TASKS_SHARED = "sync, camera planner, the tasks in one vector env"
BASELINES = {
    CAMERA_EVERY: CAMERA_EVERY,
    CAMERA_READ: CAMERA_EVERY,
    CAMERA_ONE: CAMERA_READ,
    RAY_SHARE: "ray",
    TASKS_IN_TURN: TASKS_IN_TURN,
    TASKS_SHARED: TASKS_IN_TURN,
}
READ = {"render_state": True}  # what lets a rollout skip the images no policy reads


@dataclass
class RolloutRow(Row):
    """Rollout throughput of the policy-driven engine on one backend, against a synchronous
    vector env in this process."""

    backend: str
    envs: int
    steps_per_s: float
    episodes_per_min: float
    baseline: str
    speedup: float


class InTurn:
    """A backend per task, each task's episodes run after the previous task's: what a multi-task
    run does with tasks whose envs differ in their options."""

    def __init__(self, tasks: list[str], build: Any) -> None:
        self.backends = {task: build(task) for task in tasks}

    def run(self, seeds: list[int], sample_seed: int, tasks: list[str]) -> list[Any]:
        out = []
        for task, backend in self.backends.items():
            mine = [s for s, t in zip(seeds, tasks, strict=True) if t == task]
            out += backend.run(mine, sample_seed=sample_seed) if mine else []
        return out

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


def bench_rollout(
    task: str = "PickPlace",
    envs: int = 4,
    episodes: int = 8,
    repeats: int = 3,
    ray_workers: int = 2,
    max_steps: int = 0,
    multi: int = 3,
    progress: Any = None,
) -> list[RolloutRow]:
    """Env steps/s of GRPO-style rollouts (the ``configs/bc_diffusion.yaml`` planner, untrained,
    stochastic, decisions recorded, state observations): a sync vector env in this process, an
    async one (a process per env), and Ray actors when Ray is installed. Then the demo's camera
    planner (64 px front camera, 4 actions per decision) on a sync vector env rendering only the
    images it reads (``render_state``: the rest are replayed when read), against rendering every
    step, and on a single sub-env against the batched ones. Ray runs with ``envs`` sub-envs in
    all (more episodes queue behind them), and with its default of a sub-env per episode
    (``envs_per_worker=0``: each worker steps its share of the episodes in one batched call).
    Last, the camera planner on ``multi`` tabletop tasks (``task`` and the next ones), ``episodes``
    each: one vector env of ``envs`` sub-envs a task, against a backend per task in turn.
    ``max_steps`` > 0 cuts episodes at that many steps (the task's own limit otherwise)."""

    if max_steps < 0:
        raise ValueError(f"max_steps = {max_steps}: expected >= 0 (0: the task's own limit)")
    others = [t for t in sims.list_tasks("tabletop") if t != task]
    if not 1 <= multi <= len(others) + 1:
        raise ValueError(f"multi = {multi}: expected 1 to {len(others) + 1} tabletop tasks")
    several = [task, *others[: multi - 1]]
    tasks = ["put the red block on the green plate"]
    config = POLICIES["diffusion"].config_from_dataset(
        tabletop_features(64, env_state=True), tasks, **POLICY_VARIANTS[1][2], n_action_steps=4
    )
    policy = POLICIES["diffusion"](config).eval()
    camera_config = POLICIES["diffusion"].config_from_dataset(
        tabletop_features(64), tasks, **POLICY_VARIANTS[2][2], n_action_steps=4
    )
    camera = POLICIES["diffusion"](camera_config).eval()
    limit = {"max_episode_steps": max_steps} if max_steps > 0 else {}
    env_kwargs = {"obs_mode": "state", **limit}
    every = {"obs_mode": "pixels", "image_size": 64, **limit}
    one = [task]
    backends: list[tuple[str, int, Any, list[str]]] = [
        ("sync", envs, lambda: LocalRollouts(task, env_kwargs, policy, envs), one),
        ("async", envs, lambda: LocalRollouts(task, env_kwargs, policy, envs, True), one),
        (CAMERA_EVERY, envs, lambda: LocalRollouts(task, every, camera, envs), one),
        (CAMERA_READ, envs, lambda: LocalRollouts(task, every | READ, camera, envs), one),
        (CAMERA_ONE, 1, lambda: LocalRollouts(task, every | READ, camera, 1), one),
    ]
    try:
        import ray  # noqa: F401

        per_worker = max(1, envs // ray_workers)
        fixed = DistributedConfig("ray", workers=ray_workers, envs_per_worker=per_worker)
        share = DistributedConfig("ray", workers=ray_workers)
        backends += [
            (
                "ray",
                ray_workers * per_worker,
                lambda: make_rollouts(fixed, task, env_kwargs, policy, 1),
                one,
            ),
            (
                RAY_SHARE,
                ray_workers * share.worker_envs(episodes),
                lambda: make_rollouts(share, task, env_kwargs, policy, episodes),
                one,
            ),
        ]
    except ImportError:
        pass

    def camera_backend(tasks: str | list[str]) -> LocalRollouts:
        return LocalRollouts(tasks, every | READ, camera, envs)

    backends += [
        (TASKS_IN_TURN, envs, lambda: InTurn(several, camera_backend), several),
        (TASKS_SHARED, envs * multi, lambda: camera_backend(several), several),
    ]
    rates: dict[str, tuple[int, float, float]] = {}
    for name, count, build, names in backends:
        if progress is not None:
            progress(f"rollouts on {name} ({count} envs)")
        rollouts = build()
        try:
            per = count if len(names) == 1 else envs  # warm-up: workers, first renders
            warm = [t for t in names for _ in range(per)]
            rollouts.run([e for _ in names for e in range(per)], sample_seed=0, tasks=warm)
            runs = []
            for r in range(repeats):
                start = time.perf_counter()
                seeds = [1000 * r + e for _ in names for e in range(episodes)]
                each = [t for t in names for _ in range(episodes)]
                trajs = rollouts.run(seeds, sample_seed=r, tasks=each)
                seconds = time.perf_counter() - start
                steps = sum(t.length for t in trajs)
                runs.append((steps / seconds, len(trajs) / seconds * 60))
        finally:
            rollouts.close()
        rates[name] = (
            count,
            statistics.median(s for s, _ in runs),
            statistics.median(e for _, e in runs),
        )
    rows = []
    for name, (count, steps, eps) in rates.items():
        base = BASELINES.get(name, "sync")
        label = f"{base} ({rates[base][0]} envs)"
        rows.append(RolloutRow(name, count, steps, eps, label, steps / rates[base][1]))
    return rows
