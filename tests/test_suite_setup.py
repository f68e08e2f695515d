"""The test suite's own setup: pytest-xdist workers split the cores instead of each running a
torch thread per core (oversubscribed OpenMP threads made the suite twice as slow)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch


def test_xdist_workers_split_the_cores_and_their_subprocesses_inherit_it() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        pytest.skip("about pytest-xdist workers (make test runs -n 2)")
    cores = len(os.sched_getaffinity(0))
    assert torch.get_num_threads() == max(1, cores // workers)
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(child.stdout) == torch.get_num_threads()  # a CLI run a test starts
