"""Whole tasks in worker processes, for ``embodied eval --workers W --envs N``: each process
evaluates one task at a time on its own batched sub-envs, so a suite's tasks keep W cores busy
where one process's batched policy calls keep about one. Nothing crosses processes per step; a
task's result comes back when it finishes. A worker exits when the evaluating process is gone,
however it ended (a ``kill`` runs no ``finally``)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any

import torch

import embodied.sims as sims


def _start(threads: int, evaluator: Connection) -> None:
    """A worker's torch threads (its share of the cores), and a thread that ends the worker when
    the evaluating process's end of ``evaluator`` closes: it died without stopping its workers
    (SIGTERM or SIGKILL), which would otherwise run their tasks on, orphaned, for minutes."""
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_when_closed, args=(evaluator,), daemon=True).start()


def _exit_when_closed(evaluator: Connection) -> None:
    """Block until the other end of ``evaluator`` is closed (nothing is ever sent), then exit."""
    with contextlib.suppress(EOFError):
        evaluator.recv()
    os._exit(1)


def map_tasks(
    run: Callable[[str], Any], tasks: Sequence[str], workers: int
) -> Iterator[tuple[int, Any]]:
    """``(index, run(task))`` for each task as it finishes, ``workers`` tasks at a time, each in
    a process of its own (``run`` must pickle: a module-level callable). An interrupt or error
    stops the workers without waiting for their tasks."""
    workers = min(workers, len(tasks))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    context = sims.worker_context([__name__])
    others = set(multiprocessing.active_children())
    # Closed when this process ends (only it holds the sending end): the workers then exit too
    evaluator, alive = context.Pipe(duplex=False)
    threads = max(1, (cores or 1) // workers)
    pool = ProcessPoolExecutor(workers, context, _start, (threads, evaluator))
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
        pool.shutdown(wait=finished, cancel_futures=True)
        if not finished:  # running tasks would hold the exit for minutes
            for process in set(multiprocessing.active_children()) - others:
                process.terminate()
        alive.close()  # after the workers stopped: closing it ends any that remain
        evaluator.close()
