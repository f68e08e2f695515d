"""Where ``embodied collect`` runs its episodes: each worker process builds its env once, then
runs whole episodes of the scripted policy, cuts or rewinds them and prepares them for the
dataset (stats and encoded video). Nothing crosses processes per step, and the costly half of
writing (stats, encoding) runs beside the simulation, so collection scales with the workers;
the main process only adds the prepared episodes, in seed order.

An episode depends on its seed alone (its noise and rewind draws come from its own generator),
so one worker or several write the same dataset.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

import embodied.sims as sims
from embodied.datasets import EpisodeSettings, PreparedEpisode, prepare_episode
from embodied.datasets.lerobot.lock import defer_interrupts
from embodied.rewards.rewind import rewind, rewind_split
from embodied.rollout.episodes import ExpertActor, RandomActor, rollout_vector

# Mixed into each episode's seed for its own generator (noise, rewind), apart from the run's.
EPISODE_STREAM = 1
STARTUP_TIMEOUT_S = 300  # for a worker process to import the simulator and build its env


@dataclass(frozen=True)
class EpisodeRecipe:
    """How every episode of a run is made: the env, the scripted policy, the rewind share and
    the settings of the writer it is prepared for."""

    task: str
    env_kwargs: dict[str, Any]
    policy: str  # "expert" or "random"
    noise: float
    record: str
    rewind: float
    settings: EpisodeSettings
    task_module: str | None = None  # sims.task_module: a fresh process imports it first


_worker: dict[str, Any] = {}  # this process's env and recipe


def start_worker(recipe: EpisodeRecipe, ready: Any = None) -> None:
    """Build this process's env for ``recipe`` (a pool's initializer, or once in-process), then
    release ``ready`` (a semaphore) when given."""
    sims.enter_worker(recipe.task_module)
    close_worker()
    vec = sims.make_vec_env(recipe.task, 1, autoreset_mode="disabled", **recipe.env_kwargs)
    _worker.update(vec=vec, recipe=recipe)
    if ready is not None:
        ready.release()


def close_worker() -> None:
    """Close this process's env, if it has one."""
    vec = _worker.pop("vec", None)
    if vec is not None:
        vec.close()


def run_episode(index: int, seed: int, keep: float | None) -> list[PreparedEpisode]:
    """The run's episode ``index``, from ``seed`` (cut off ``keep`` of the way to success when
    given), and its rewound copy when drawn, prepared for the dataset."""
    vec, recipe = _worker["vec"], _worker["recipe"]
    rng = np.random.default_rng([seed, EPISODE_STREAM])
    if recipe.policy == "random":
        act: Any = RandomActor(vec, rng)
    else:
        act = ExpertActor(vec, recipe.noise, rng, record=recipe.record)
    suite = sims.suite_of(recipe.task)
    traj = next(rollout_vector(vec, act, [seed], suite, episode_ids=[index]))
    if keep is not None:
        traj = cut_off(traj, keep)
    episodes = [traj]
    if traj.success and traj.length > 3 and rng.random() < recipe.rewind:
        episodes.append(rewind(traj, rewind_split(traj.length, rng)))
    return [prepare_episode(episode, recipe.settings) for episode in episodes]


class EpisodeRunner:
    """A run's episodes (``(index, seed, keep)`` jobs) on ``workers`` processes, or in this
    one for a single worker, handed back in job order. Built once every worker has its env; a
    worker that dies (killed, crashed) is a RuntimeError naming the episode, not a hang."""

    def __init__(self, recipe: EpisodeRecipe, jobs: list[tuple], workers: int) -> None:
        self.jobs, self._next = jobs, 0
        self._last: list[PreparedEpisode] = []  # the job handed back last, in-process
        self._pool: Any = None
        workers = min(workers, max(len(jobs), 1))  # no process without an episode to run
        if workers == 1:
            start_worker(recipe)
            return
        # A fork server starts workers clean (no GL state inherited; see sims.make_vec_env),
        # ignoring Ctrl-C, and imports this module once for all of them (a fresh worker spent
        # ~5 s importing torch, the simulators and the dataset writer).
        ready = sims.worker_context([__name__]).Semaphore(0)
        self._pool = sims.WorkerPool(workers, start_worker, (recipe, ready), preload=[__name__])
        self._results = [self._pool.submit(run_episode, *job) for job in jobs]  # starts them
        started, deadline = 0, time.monotonic() + STARTUP_TIMEOUT_S
        while started < workers:
            if ready.acquire(timeout=0.1):
                started += 1
            elif any(result.done() for result in self._results):
                break  # episodes are coming back, or a worker died: iterating says which
            elif time.monotonic() > deadline:
                self._pool.stop(wait=False)  # a stuck worker is not waited for
                raise RuntimeError(f"a collection worker did not build its {recipe.task} env "
                                   f"within {STARTUP_TIMEOUT_S} s")  # fmt: skip

    def __iter__(self) -> Iterator[list[PreparedEpisode]]:
        """Each job's episodes, in job order, as they come."""
        while self._next < len(self.jobs):
            if self._pool is None:
                episodes = run_episode(*self.jobs[self._next])
            else:
                try:
                    episodes = self._results[self._next].result()
                except BrokenProcessPool:
                    seed = self.jobs[self._next][1]
                    raise RuntimeError(
                        f"a collection worker died (killed or crashed) before the episode from "
                        f"seed {seed} came back; the episodes before it are in the dataset"
                    ) from None
            self._next, self._last = self._next + 1, episodes
            yield episodes

    def finished(self, start: int) -> list[list[PreparedEpisode]]:
        """After an interrupt: the jobs from index ``start`` on (those the caller has not
        written: one handed back as the interrupt came, and any not handed back yet) whose
        episodes are ready, in job order. Iteration ends."""
        if self._pool is None:
            return [self._last] if start == self._next - 1 else []
        left, self._next = self._results[start:], len(self.jobs)
        done = [f for f in left if f.done() and not f.cancelled() and f.exception() is None]
        return [future.result() for future in done]

    def close(self, terminate: bool = False) -> None:
        """Stop the workers and return once they and the pool's threads are gone
        (``terminate``: drop the episodes not started; the running ones end first).

        Returning before that would leave the pool's manager thread closing its pipes while
        Python exits, which races Python's own exit hook for the pool: "Exception ignored ...
        OSError: Bad file descriptor" after a Ctrl-C. Python's exit waits for the running
        episodes anyway, so waiting here costs nothing; a Ctrl-C during it comes after."""
        if self._pool is None:
            close_worker()
            return
        with defer_interrupts():
            self._pool.stop(cancel=terminate)


def cut_off(traj: Any, fraction: float) -> Any:
    """The episode stopped ``fraction`` of the way to its first success (or its end): the
    prefix, not successful, truncated at the cut, as if the expert had been stopped there.
    Measured to the first success because Meta-World episodes run on after it. An episode
    that succeeds at its first step has no such prefix and is returned as it is."""
    success = np.asarray(traj.info.get("success", np.zeros(traj.length)), dtype=bool)
    reached = int(np.argmax(success)) + 1 if success.any() else traj.length
    if reached < 2:
        return traj
    part = traj.slice(0, min(max(int(fraction * reached), 1), reached - 1))
    part.terminated = np.zeros_like(part.terminated)
    part.truncated = np.zeros_like(part.truncated)
    part.truncated[-1] = True
    return part
