"""``embodied bench rollout``: GRPO-style rollouts on each backend, against a sync vector env; and
a camera planner's rollouts rendering only the images it reads, against rendering every step, and
on one sub-env (one policy call per episode step, as ``embodied eval --workers 1`` runs) against the
batched call of several (``--envs``)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import embodied.policies  # noqa: F401  (registers the policy types)
from embodied.apps.bench.common import Row, tabletop_features
from embodied.apps.bench.policy import POLICY_VARIANTS
from embodied.core.policy import POLICIES
from embodied.rollout.backends import DistributedConfig, LocalRollouts, make_rollouts

CAMERA_EVERY = "sync, camera planner, every image rendered"
CAMERA_READ = "sync, camera planner, read images rendered"
CAMERA_ONE = "sync, camera planner, read images rendered, one env"
RAY_SHARE = "ray, a sub-env per episode"
BASELINES = {
    CAMERA_EVERY: CAMERA_EVERY,
    CAMERA_READ: CAMERA_EVERY,
    CAMERA_ONE: CAMERA_READ,
    RAY_SHARE: "ray",
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


def bench_rollout(
    task: str = "PickPlace",
    envs: int = 4,
    episodes: int = 8,
    repeats: int = 3,
    ray_workers: int = 2,
    max_steps: int = 0,
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
    ``max_steps`` > 0 cuts episodes at that many steps (the task's own limit otherwise)."""

    if max_steps < 0:
        raise ValueError(f"max_steps = {max_steps}: expected >= 0 (0: the task's own limit)")
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
    backends: list[tuple[str, int, Any]] = [
        ("sync", envs, lambda: LocalRollouts(task, env_kwargs, policy, envs)),
        ("async", envs, lambda: LocalRollouts(task, env_kwargs, policy, envs, asynchronous=True)),
        (CAMERA_EVERY, envs, lambda: LocalRollouts(task, every, camera, envs)),
        (CAMERA_READ, envs, lambda: LocalRollouts(task, every | READ, camera, envs)),
        (CAMERA_ONE, 1, lambda: LocalRollouts(task, every | READ, camera, 1)),
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
            ),
            (
                RAY_SHARE,
                ray_workers * share.worker_envs(episodes),
                lambda: make_rollouts(share, task, env_kwargs, policy, episodes),
            ),
        ]
    except ImportError:
        pass
    rates: dict[str, tuple[int, float, float]] = {}
    for name, count, build in backends:
        if progress is not None:
            progress(f"rollouts on {name} ({count} envs)")
        rollouts = build()
        try:
            rollouts.run(list(range(count)), sample_seed=0)  # warm-up: workers, first renders
            runs = []
            for r in range(repeats):
                start = time.perf_counter()
                trajs = rollouts.run([1000 * r + e for e in range(episodes)], sample_seed=r)
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
