"""The dataset's parquet and JSON files: atomic writes (temp file + rename), and reads that
raise ``DatasetError`` naming the file when it is missing or corrupt.

Parquet files are written with page checksums (CRC32 per data page, part of the parquet format)
and read with their verification on: a flipped byte inside a page is an error naming the file,
never a silently different value. Readers that do not verify them (LeRobot, pandas) ignore them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embodied.core.io import atomic_open, atomic_write_text
from embodied.datasets.lerobot.layout import DatasetError


def _write_parquet(path: Path, table: pa.Table, compact: bool = False) -> None:
    """Write a parquet file atomically (temp file + rename).

    ``compact`` leaves out what only pays off in big files (column statistics, dictionaries):
    an episodes file of one commit holds a few rows of ~250 columns (per-episode stats), and
    they took a quarter of its ~117 KB. (The serialized arrow schema, another 35 KB, stays:
    without it list columns read back with other child names than earlier files have.)
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"write_statistics": False, "use_dictionary": False}
    with atomic_open(path, "wb") as file:
        pq.write_table(table, file, write_page_checksum=True, **(options if compact else {}))


def _write_json(path: Path, data: Any) -> None:
    """Write a JSON file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=4) + "\n")


def _read_json(root: Path, relative: str) -> Any:
    """Parse a JSON file of the dataset; DatasetError naming it if missing or invalid."""
    path = root / relative
    if not path.is_file():
        raise DatasetError(f"{relative}: missing ({root} is not a LeRobot v3.0 dataset?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DatasetError(f"{relative}: not valid JSON ({error})") from error


def _open_parquet(root: Path, relative: str, referenced_by: str) -> pq.ParquetFile:
    """Open a parquet file (reads its footer); DatasetError naming it if missing or corrupt."""
    path = root / relative
    if not path.is_file():
        raise DatasetError(f"{relative}: missing (referenced by {referenced_by})")
    try:
        return pq.ParquetFile(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"{relative}: unreadable or truncated parquet ({error})") from error


def _read_table(root: Path, relative: str, referenced_by: str, **kwargs: Any) -> pa.Table:
    """Read a whole parquet file (or some ``columns``); DatasetError naming it on failure."""
    parquet = _open_parquet(root, relative, referenced_by)
    try:
        return parquet.read(**kwargs)
    except (OSError, pa.ArrowException, ValueError) as error:
        raise DatasetError(f"{relative}: unreadable or truncated parquet ({error})") from error
