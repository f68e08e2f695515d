"""Keep freed memory in the process (glibc): CPU training stops page-faulting its tensors back in.

glibc's malloc serves every block above its mmap threshold (32 MiB at most) with a fresh ``mmap``
and unmaps it on ``free``. A training step's activations are such blocks (32 clips x 8 frames x
16 channels at 96 px is 150 MB), so each step the kernel maps and zero-fills them again: about half
of a reward-model training step's CPU time was system time on this 2-core machine. With mmap off
and trimming off, freed blocks stay in the heap and the next step reuses them; the process keeps
its peak memory instead of returning it (``embodied bench train`` measures both settings).

The ``embodied`` command turns this on at start, unless the user set glibc's own
``MALLOC_MMAP_MAX_`` or ``MALLOC_TRIM_THRESHOLD_`` (then theirs is kept). Other C libraries are
left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["keep_freed_memory"]

# mallopt parameters and glibc's defaults (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD = 128 * 1024
DEFAULT_MMAP_MAX = 65536
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest one (2 GiB of free heap top)
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory(keep: bool = True, respect_environment: bool = True) -> bool:
    """Make glibc's malloc keep freed blocks for reuse (``keep``) or restore its defaults.

    Returns whether the setting was applied: ``False`` on a C library other than glibc, or when
    ``respect_environment`` and the user configured malloc through its environment variables.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if respect_environment and any(name in os.environ for name in USER_SETTINGS):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = mallopt(M_MMAP_MAX, 0 if keep else DEFAULT_MMAP_MAX)
    applied &= mallopt(M_TRIM_THRESHOLD, NEVER_TRIM if keep else DEFAULT_TRIM_THRESHOLD)
    return bool(applied)
