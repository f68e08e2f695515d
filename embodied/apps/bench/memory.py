"""``embodied bench memory``: what each further env of a task costs in memory, built and rendering,
against the first env of that task in the process, which makes the render context (meshes,
textures, framebuffer) that every later env of the task draws with."""

from __future__ import annotations

import os
import resource
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import embodied.sims as sims
from embodied.apps.bench.common import Row, metaworld_available

# Meta-World's row reads the two cameras the MT10 planner reads (configs/bc_pixels_mt10.yaml).
METAWORLD = ("metaworld/push-v3", {"cameras": ["corner", "topview"]})


@dataclass
class MemoryRow(Row):
    """Resident memory of one task's envs (pixel observations, rendered by a reset), a vector env
    of ``envs`` in a fresh process: its first env against each further one."""

    task: str
    camera: str
    envs: int
    first_env_mb: float
    further_env_mb: float  # per further env
    baseline: str
    ratio: float  # further / first


def resident_mb() -> float:
    """This process's resident memory in MiB (its peak where /proc is missing: the figures here
    only grow)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _measure(task: str, envs: int, options: dict[str, Any]) -> tuple[float, float]:
    """In a fresh process: MiB of the first env built and reset, and of each further one."""
    start = resident_mb()
    first = sims.make_vec_env(task, 1, autoreset_mode="disabled", **options)
    first.reset(seed=0)
    one = resident_mb()
    rest = sims.make_vec_env(task, envs - 1, autoreset_mode="disabled", **options)
    rest.reset(seed=list(range(1, envs)))
    further = (resident_mb() - one) / (envs - 1)
    first.close()
    rest.close()
    return one - start, further


def bench_memory(
    tasks: tuple[str, ...] = (),
    envs: int = 8,
    image_size: int = 64,
    repeats: int = 3,
    metaworld: bool = True,
    progress: Any = None,
) -> list[MemoryRow]:
    """MiB per env of ``tasks`` (default: PickPlace, and Meta-World push with the MT10 planner's
    two cameras when installed) at ``image_size`` px, each figure the median over ``repeats``
    fresh processes (memory freed in a process is not given back, so no process measures
    twice)."""

    if envs < 2:
        raise ValueError(
            f"envs = {envs}: need >= 2 (the bench compares further envs with the first)"
        )
    jobs = [(task, {}) for task in tasks] or [("PickPlace", {})]
    if metaworld and not tasks and metaworld_available():
        jobs.append(METAWORLD)
    rows = []
    for task, extra in jobs:
        options = {"obs_mode": "pixels_state", "image_size": image_size, **extra}
        if progress is not None:
            progress(task)
        figures = []
        for _ in range(repeats):
            with sims.WorkerPool(1) as pool:  # a fresh process, ended if this one dies
                figures.append(pool.submit(_measure, task, envs, options).result())
        first = statistics.median(f[0] for f in figures)
        further = statistics.median(f[1] for f in figures)
        camera = f"{image_size}x{image_size} " + ",".join(extra.get("cameras", ["default"]))
        rows.append(MemoryRow(task, camera, envs, round(first, 1), round(further, 1),
                              "the first env", round(further / first, 3)))  # fmt: skip
    return rows
