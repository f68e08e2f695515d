"""Numpy <-> arrow columns: scalars as plain columns, per-frame arrays as nested
fixed-size lists, so a parquet column's type gives its exact per-frame shape."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _to_arrow(values: np.ndarray) -> pa.Array:
    """A [N, ...] array as an arrow column: scalars plain, trailing dims as fixed-size lists."""
    array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _from_arrow(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Inverse of ``_to_arrow``: a fresh, writable numpy array [N, ...]."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows, shape = len(array), []
    while pa.types.is_fixed_size_list(array.type):
        shape.append(array.type.list_size)
        array = array.flatten()
    return np.array(array.to_numpy(zero_copy_only=False)).reshape(rows, *shape)


def _arrow_spec(arrow_type: pa.DataType) -> tuple[np.dtype, tuple[int, ...]]:
    """Numpy dtype and per-frame shape that an arrow column type stores."""
    shape = []
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    return np.dtype(arrow_type.to_pandas_dtype()), tuple(shape)
