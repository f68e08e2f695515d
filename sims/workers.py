"""Worker processes that render: a fork server started without SIGINT, and ``WorkerPool``, the
process pool that ``embodied collect``, ``embodied eval --envs`` and the benches run their
simulator work on."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def worker_context(preload: Sequence[str] = ()) -> Any:
    """The multiprocessing context for worker processes that render: a fork server started
    without SIGINT (``start_forkserver_without_sigint``) where the platform has one, so workers
    start clean (no GL state inherited), else the platform's default."""
    start_forkserver_without_sigint(preload)
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else None)


def start_forkserver_without_sigint(preload: Sequence[str] = ()) -> None:
    """Start multiprocessing's fork server (which forks the workers) and resource tracker
    ignoring SIGINT, so the workers ignore it too; ``preload``: modules the server imports once
    for all its workers.

    Ctrl-C in a terminal signals the whole process group: each worker would die mid-step with a
    KeyboardInterrupt traceback (Gymnasium's async workers send theirs back as errors) while
    the main process handles the interrupt and closes them. Workers take the server's handlers.
    Helpers running already are left as they are.
    """
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    if (
        "forkserver" not in multiprocessing.get_all_start_methods()
        or threading.current_thread() is not threading.main_thread()
    ):
        return
    if preload:
        multiprocessing.set_forkserver_preload(list(preload))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.resource_tracker.ensure_running()
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


class WorkerPool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` of ``workers`` processes from ``worker_context(preload)``, each
    running ``initializer(*initargs)`` first, whose workers never outlive this process.

    Each worker follows a lifeline, a pipe whose sending end only this process holds: should this
    process die first (a ``kill`` runs no ``finally``), the pipe closes and the workers exit,
    where they would run on, orphaned. ``stop`` ends the pool, waiting for the running jobs or
    ending them; leaving a ``with`` block stops it, without waiting on an error or interrupt."""

    def __init__(
        self,
        workers: int,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple = (),
        preload: Sequence[str] = (),
    ) -> None:
        context = worker_context(preload)
        self._lifeline = context.Pipe(duplex=False)  # (receive, send)
        self._started, self._pids = context.SimpleQueue(), set()  # each worker's pid as it starts
        self._stopped = False
        start = (self._lifeline[0], self._started, initializer, initargs)
        super().__init__(workers, context, _start, start)

    def stop(self, wait: bool = True, cancel: bool = False) -> None:
        """Shut the pool down once it has no process left, dropping the jobs not started when
        ``cancel``. ``wait=False`` ends the running jobs (a stuck one, or those an interrupt
        abandons) instead of waiting for them: closing the lifeline ends every worker, even one
        still starting, and a worker stuck where that cannot reach it is terminated."""
        if self._stopped:
            return
        self._stopped = True
        if not wait:
            self._lifeline[1].close()
            self._terminate_workers()
        # Waiting for the pool's threads: left closing its pipes while Python exits, they race
        # its exit hook ("Exception ignored ... OSError: Bad file descriptor").
        self.shutdown(wait=True, cancel_futures=cancel or not wait)
        for end in self._lifeline:  # the workers have stopped: closing it ends any that remain
            end.close()
        self._started.close()

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        self.stop(wait=exc_type is None)
        return False

    def _terminate_workers(self) -> None:
        """Terminate this pool's workers (those that said they started) that still run."""
        while not self._started.empty():
            self._pids.add(self._started.get())
        for process in multiprocessing.active_children():
            if process.pid in self._pids:
                process.terminate()


def _start(
    receive: Any, started: Any, initializer: Callable[..., Any] | None, initargs: tuple
) -> None:
    """A worker's first job: follow the lifeline, say it started, run the pool's initializer."""
    threading.Thread(target=_exit_when_closed, args=(receive,), daemon=True).start()
    started.put(os.getpid())
    if initializer is not None:
        initializer(*initargs)


def _exit_when_closed(receive: Any) -> None:
    """Block until the pipe closes (nothing is ever sent on it), then end the process."""
    with contextlib.suppress(EOFError):
        receive.recv()
    os._exit(1)
