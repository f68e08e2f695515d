"""Test helper: wait on a subprocess's progress, failing with what it never did."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

TIMEOUT_S = 60.0


def wait_until(ready: Callable[[], bool], process: subprocess.Popen, what: str) -> None:
    """Poll ``ready`` until it holds; fail if ``process`` exits or 60 s pass first.

    ``what`` completes "the run exited before ..." (followed by the tail of its stderr, where
    that is a pipe) and "60 s passed without ...".
    """
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        if process.poll() is not None:
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise AssertionError(
                f"the run exited (rc {process.returncode}) before {what}: {stderr[-2000:]}"
            )
        assert time.monotonic() < deadline, f"{TIMEOUT_S:.0f} s passed without {what}"
        time.sleep(0.005)
