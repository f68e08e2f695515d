"""Shared pytest setup."""

from __future__ import annotations

import importlib.metadata
import os
import signal

import pytest
from tiny_vlm import tiny_llava


def _installed(distribution: str) -> bool:
    """Whether a distribution is installed (``find_spec`` would also find tests/lerobot, a
    namespace package once tests/ is on sys.path)."""
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# tests/lerobot needs LeRobot, which needs Python >= 3.12 and its own torch: `make test-lerobot`
# runs it in an environment of its own. Elsewhere (the main suite) it is not collected.
collect_ignore = [] if _installed("lerobot") else ["lerobot"]


def _threads_per_worker() -> int | None:
    """Cores per pytest-xdist worker (None outside xdist). Each worker's torch otherwise starts
    a thread per core: two workers on two cores then run four OpenMP threads whose spin-waits
    starve each other (a 4 s test took 36-150 s beside the Ray rollout test, which took 555 s
    instead of 31)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return None
    return max(1, len(os.sched_getaffinity(0)) // workers)


if (_threads := _threads_per_worker()) is not None:
    # The CLI subprocesses, Ray workers and collection workers the tests start inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Headless offscreen rendering: MuJoCo reads MUJOCO_GL when it is first imported, so this must run
# before any test module imports mujoco (a user's explicit choice wins).
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny convolutions and transformers run fastest that way,
    and results do not depend on the thread count. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def state_env(request):
    """A state-mode env of the task named by ``request.param`` (PickPlace by default): the tabletop
    tests (test_tabletop*.py) share it."""
    import embodied.sims as sims

    env = sims.make(getattr(request, "param", "PickPlace"), obs_mode="state")
    yield env
    env.close()


@pytest.fixture(scope="session")
def judge_dir(tmp_path_factory: pytest.TempPathFactory):
    """A saved tiny Llava with its processor: a local judge directory."""
    path = tmp_path_factory.mktemp("judge")
    model, processor = tiny_llava()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


@pytest.fixture
def ctrl_c_handled():
    """Python's own Ctrl-C handler for the test, as in a terminal's foreground process. A shell
    starts background jobs with SIGINT ignored, and Python keeps it so: a test of what Ctrl-C
    does would then see nothing happen."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
