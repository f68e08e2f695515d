"""Atomic file writes, so a crash or Ctrl-C never leaves a half-written config or checkpoint.

Every writer in the toolkit that replaces a whole file goes through these helpers: the data is
written to a temporary file in the same directory, flushed to disk, then moved over the target
with ``os.replace`` (atomic on POSIX and Windows). Readers see either the old file or the new one.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text", "read_json_object"]

_WRITE_MODES = ("w", "wt", "wb")


@contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", encoding: str | None = None
) -> Iterator[IO[Any]]:
    """Yield a file that replaces ``path`` atomically when the block ends, and vanishes on error."""
    if mode not in _WRITE_MODES:
        raise ValueError(f"atomic_open supports modes {_WRITE_MODES}, got {mode!r}")
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    path = Path(path)
    tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    # O_EXCL: never write into somebody else's file; 0o666 lets the umask decide permissions.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp_path, flags, 0o666)
    try:
        with os.fdopen(fd, mode, encoding=encoding) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see ``atomic_open``)."""
    with atomic_open(path, "wb") as file:
        file.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_open``)."""
    with atomic_open(path, "w", encoding=encoding) as file:
        file.write(text)


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; unreadable JSON or another kind of value is a ``ValueError``
    naming the file."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _fsync_dir(directory: Path) -> None:
    """Flush a directory entry so the rename itself survives a power loss (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows, where directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
