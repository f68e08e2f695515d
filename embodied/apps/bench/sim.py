"""``embodied bench sim``: env steps/s of every task, state-only and per camera resolution, each
against the raw ``mj_step`` rate of the same model replaying the same controls (the physical
limit), so ``ratio`` is what the env costs on top of the physics."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

import embodied.sims as sims
from embodied.apps.bench.common import Row, median_rate, metaworld_available


@dataclass
class BenchRow(Row):
    """One measured figure and the baseline it is compared against."""

    suite: str
    task: str
    mode: str  # "state" or "camera <H>x<W>"
    steps_per_s: float
    baseline: str
    baseline_steps_per_s: float
    ratio: float  # time per env step / time per baseline step (1.0 = no overhead)


def _env_runner(env: Any, seed: int) -> Any:
    """A closure stepping ``env`` with fixed random actions, resetting when an episode ends."""
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1.0, 1.0, size=(4096, *env.action_space.shape)).astype(np.float32)
    state = {"i": 0, "seed": seed}
    env.reset(seed=seed)

    def run(steps: int) -> bool:
        """Take ``steps`` env steps; return whether the last one ended an episode."""
        ended = False
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(actions[state["i"] % len(actions)])
            state["i"] += 1
            ended = terminated or truncated
            if ended:
                state["seed"] += 1
                env.reset(seed=state["seed"])
        return ended

    return run


def _raw_runner(env: Any, seed: int, steps: int) -> Any:
    """A closure replaying, with bare ``mj_step`` calls, the physics of ``steps`` env steps.

    The env is run once with the same fixed random actions as ``_env_runner``, recording the
    full physics state at every episode start and the controls and mocap targets of every step.
    """
    inner = env.unwrapped
    model, data, substeps = inner.model, inner.data, int(inner.frame_skip)
    kind = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(model, kind)

    def snapshot() -> np.ndarray:
        state = np.empty(size)
        mujoco.mj_getState(model, data, state, kind)
        return state

    starts: dict[int, np.ndarray] = {}
    ctrl, mocap_pos, mocap_quat = [], [], []
    record = _env_runner(env, seed)  # resets the env to ``seed``
    starts[0] = snapshot()
    for i in range(steps):
        if record(1):
            starts[i + 1] = snapshot()
        ctrl.append(data.ctrl.copy())
        mocap_pos.append(data.mocap_pos.copy())
        mocap_quat.append(data.mocap_quat.copy())
    replay = mujoco.MjData(model)

    def run(n: int) -> None:
        for i in range(n):
            j = i % steps
            if j in starts:
                mujoco.mj_setState(model, replay, starts[j], kind)
            replay.ctrl[:] = ctrl[j]
            replay.mocap_pos[:], replay.mocap_quat[:] = mocap_pos[j], mocap_quat[j]
            mujoco.mj_step(model, replay, substeps)

    return run


def bench_env(
    suite: str,
    task: str,
    make: Any,
    resolutions: tuple[int, ...],
    steps: int,
    repeats: int,
    seed: int = 0,
) -> list[BenchRow]:
    """Rows for one task: state-only and per camera resolution, each against raw ``mj_step``."""
    env = make(obs_mode="state")
    raw = median_rate(_raw_runner(env, seed, steps), steps, repeats)
    baseline = f"raw mj_step x{env.unwrapped.frame_skip}"
    rows = []
    state_rate = median_rate(_env_runner(env, seed), steps, repeats)
    rows.append(BenchRow(suite, task, "state", state_rate, baseline, raw, raw / state_rate))
    env.close()
    for res in resolutions:
        env = make(obs_mode="pixels", image_size=res)
        rate = median_rate(_env_runner(env, seed), steps, repeats)
        rows.append(BenchRow(suite, task, f"camera {res}x{res}", rate, baseline, raw, raw / rate))
        env.close()
    return rows


def bench_sim(
    tasks: list[str] | None = None,
    resolutions: tuple[int, ...] = (64, 96, 128, 224),
    steps: int = 300,
    repeats: int = 5,
    metaworld: bool = True,
    progress: Any = None,
) -> list[BenchRow]:
    """Env steps/s of every tabletop task (and Meta-World reach/pick-place when installed)."""

    jobs = [("tabletop", t, functools.partial(sims.make, t)) for t in (tasks or sims.list_tasks())]
    if metaworld and metaworld_available():
        for name in ("reach-v3", "pick-place-v3"):
            jobs.append(("metaworld", name, functools.partial(sims.make, f"metaworld/{name}")))
    rows: list[BenchRow] = []
    for suite, task, make in jobs:
        if progress is not None:
            progress(f"{suite}/{task}")
        rows.extend(bench_env(suite, task, make, resolutions, steps, repeats))
    return rows
