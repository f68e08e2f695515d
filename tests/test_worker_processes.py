"""Worker processes of ``embodied eval --workers W --envs N`` and ``embodied collect --workers W``:
a worker that dies is an error naming its task, and a command that is killed leaves no process
running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import embodied.sims as sims
from embodied.evaluation.task_workers import map_tasks


def _die_on_push(task: str) -> str:
    """A task evaluation whose process dies on Push (a killed or crashed worker)."""
    if task == "Push":
        os._exit(3)
    return task


def _report_then_sleep(marker: str) -> None:
    """A long task that first writes its worker's pid to ``marker``."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(300)


def test_a_dead_evaluation_worker_is_an_error_naming_its_task() -> None:
    """A worker process that dies mid-task ends ``embodied eval`` with the task's name, not a
    hang or a bare BrokenProcessPool; the tasks before it came back."""
    came_back = []
    with pytest.raises(RuntimeError, match="an evaluation worker died .* running Push"):
        for _, task in map_tasks(_die_on_push, ["Reach", "Push"], workers=1):
            came_back.append(task)
    assert came_back == ["Reach"]


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for_pid(marker: Path) -> int:
    """The pid a worker wrote to ``marker``."""
    deadline = time.monotonic() + 120
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
    return int(marker.read_text())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("stuck_in", ["initializer", "job"])
def test_stopping_a_pool_without_waiting_ends_its_stuck_worker(
    tmp_path: Path, stuck_in: str
) -> None:
    """``WorkerPool.stop(wait=False)`` (a collection worker that never built its env, an
    interrupted evaluation) returns with the worker gone, where it would wait on the worker's
    5-minute job; the job's result is an error, not a value."""
    marker = tmp_path / "worker"
    start = (_report_then_sleep, (str(marker),)) if stuck_in == "initializer" else (None, ())
    pool = sims.WorkerPool(1, *start)
    job = pool.submit(_report_then_sleep, str(marker))
    pid = _wait_for_pid(marker)
    pool.stop(wait=False)
    assert not _running(pid)
    assert job.done() and (job.cancelled() or job.exception() is not None)


def _running_after_killing(parent: subprocess.Popen, sig: int, pids: list[int]) -> list[int]:
    """Signal ``parent`` and wait for it; the ``pids`` that still run 15 s later."""
    parent.send_signal(sig)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 15
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _running(pid)]


def _kill_all(parent: subprocess.Popen, pids: list[int]) -> None:
    """Whatever a failed test left running."""
    parent.kill()
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_evaluation_leaves_no_worker_running(tmp_path: Path, sig: int) -> None:
    """``kill`` of an evaluation whose workers are mid-task (no ``finally`` runs in it) ends the
    workers within seconds, where they ran their tasks on, orphaned."""
    markers = [str(tmp_path / f"worker-{i}") for i in range(2)]
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_worker_processes import _report_then_sleep\n"
        "from embodied.evaluation.task_workers import map_tasks\n"
        f"for _ in map_tasks(_report_then_sleep, {markers!r}, workers=2): pass\n"
    )
    evaluation = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while not all(Path(m).exists() and Path(m).read_text() for m in markers):
            assert evaluation.poll() is None and time.monotonic() < deadline, "no workers"
            time.sleep(0.1)
        workers = [int(Path(m).read_text()) for m in markers]
        assert _running_after_killing(evaluation, sig, workers) == []
    finally:
        _kill_all(evaluation, [int(Path(m).read_text()) for m in markers if Path(m).exists()])


def _descendants(pid: int) -> set[int]:
    """The running processes under ``pid`` (children, theirs, ...)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if _running(p)}


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_collection_leaves_no_process_running(tmp_path: Path) -> None:
    """SIGKILL of ``embodied collect --workers 2`` mid-run: its workers (and the fork server
    and resource tracker they keep alive) end within seconds, where they waited, orphaned."""
    command = "from embodied.apps.cli import run; run()"
    args = ["collect", "--task", "Reach", "--episodes", "200", "--workers", "2",
            "--out", str(tmp_path / "data")]  # fmt: skip
    collection, left = subprocess.Popen([sys.executable, "-c", command, *args]), []
    try:
        deadline = time.monotonic() + 120
        while len(_descendants(collection.pid)) < 4:  # a tracker, a fork server, two workers
            assert collection.poll() is None and time.monotonic() < deadline, "no workers"
            time.sleep(0.1)
        time.sleep(1.0)
        left = sorted(_descendants(collection.pid))
        assert _running_after_killing(collection, signal.SIGKILL, left) == []
    finally:
        _kill_all(collection, left)
