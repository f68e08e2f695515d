"""One writer at a time, and writes that Ctrl-C cannot cut in half.

``DatasetLock`` holds an exclusive ``flock`` on ``<root>/.embodied.lock`` while a writer (the
``LeRobotDatasetWriter``, ``add_frame_feature``) changes a dataset. The kernel drops the lock when
the process dies, however it dies, so a killed writer never leaves a stale lock behind; the file
itself stays (removing it would race with a process about to lock it). A second writer fails at
once with ``DatasetBusyError`` naming the process that holds the lock. Readers take no lock: a
commit is atomic (info.json last), so they see the dataset before or after it.

``defer_interrupts`` holds back SIGINT (Ctrl-C) during a block that must finish once begun (an
episode's buffering, a commit) and delivers it when the block ends, so the KeyboardInterrupt
reaches the caller between two consistent states of the writer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from embodied.datasets.lerobot.layout import LOCK_NAME, DatasetBusyError

try:
    import fcntl
except ImportError:  # Windows: no flock; writers are not serialised there
    fcntl = None  # type: ignore[assignment]


class DatasetLock:
    """An exclusive, non-blocking lock on a dataset directory (``acquire`` / ``release``)."""

    def __init__(self, root: Path, purpose: str) -> None:
        """Prepare a lock on ``root`` for ``purpose`` (what the holder file says it does)."""
        self.root = root
        self.purpose = purpose
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._file is not None

    def acquire(self) -> None:
        """Take the lock, or raise ``DatasetBusyError`` naming the process holding it."""
        if self._file is not None or fcntl is None:
            return
        path = self.root / LOCK_NAME
        file = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(file)
            file.close()
            raise DatasetBusyError(
                f"{self.root} is being written by another process ({holder}); wait for it to "
                "finish, or write to another directory"
            ) from None
        except BaseException:
            file.close()
            raise
        try:
            file.seek(0)
            file.truncate()
            command = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]).strip()
            if len(command) > 200:
                command = command[:197] + "..."
            what = f"running {command}" if command else self.purpose
            file.write(f"pid {os.getpid()} on {socket.gethostname()}, {what}\n")
            file.flush()
        except OSError:  # the note is informative only; the flock is what counts
            pass
        self._file = file

    def release(self) -> None:
        """Drop the lock (safe to call when not held)."""
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.seek(0)
                file.truncate()
            file.close()  # closing the descriptor releases the flock


def _read_holder(file: IO[str]) -> str:
    """Who holds the lock, from the note the holder wrote into the lock file."""
    for _ in range(20):  # the holder writes its note just after locking
        file.seek(0)
        note = file.read().strip()
        if note:
            return note
        threading.Event().wait(0.01)
    return "a process that has not said which"


@contextlib.contextmanager
def defer_interrupts() -> Iterator[None]:
    """Hold SIGINT back during the block and re-deliver it afterwards (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    if previous is None:  # installed outside Python: it cannot be put back, so do not defer
        signal.signal(signal.SIGINT, signal.default_int_handler)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # delivered now, to whatever handles it normally
