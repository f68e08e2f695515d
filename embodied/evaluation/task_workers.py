"""Whole tasks in worker processes, for ``embodied eval --workers W --envs N``: each process
evaluates one task at a time on its own batched sub-envs, so a suite's tasks keep W cores busy
where one process's batched policy calls keep about one. Nothing crosses processes per step; a
task's result comes back when it finishes. A worker exits when the evaluating process is gone,
however it ended (a ``kill`` runs no ``finally``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

import embodied.sims as sims


def _start(threads: int) -> None:
    """A worker's torch threads: its share of the cores."""
    torch.set_num_threads(threads)


def map_tasks(
    run: Callable[[str], Any], tasks: Sequence[str], workers: int
) -> Iterator[tuple[int, Any]]:
    """``(index, run(task))`` for each task as it finishes, ``workers`` tasks at a time, each in
    a process of its own (``run`` must pickle: a module-level callable). An interrupt or error
    stops the workers without waiting for their tasks."""
    workers = min(workers, len(tasks))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // workers)
    pool = sims.WorkerPool(workers, _start, (threads,), preload=[__name__])
    pending = {pool.submit(run, task): i for i, task in enumerate(tasks)}
    finished = False
    try:
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=pending.get):
                index = pending.pop(future)
                try:
                    yield index, future.result()
                except BrokenProcessPool:
                    raise RuntimeError(
                        f"an evaluation worker died (killed or crashed) running {tasks[index]}"
                    ) from None
        finished = True
    finally:
        pool.stop(wait=finished)  # running tasks would hold the exit for minutes
