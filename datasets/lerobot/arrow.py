"""Numpy <-> arrow columns. The writer stores scalars as plain columns and per-frame arrays as
nested fixed-size lists, so a column's type gives its exact per-frame shape. Datasets LeRobot
writes also hold variable-size lists (its 2-D features, ``datasets.Array2D``: every row has the
same lengths, checked on reading; an extension type where ``datasets`` is imported) and images as
``struct<bytes, path>`` with PNG bytes
(``dtype: image`` features), decoded here to ``uint8 [N, H, W, 3]``."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UNKNOWN = -1  # a size that a variable-size list type does not fix


def _to_arrow(values: np.ndarray) -> pa.Array:
    """A [N, ...] array as an arrow column: scalars plain, trailing dims as fixed-size lists."""
    array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _is_list(arrow_type: pa.DataType) -> bool:
    """A fixed- or variable-size list type."""
    return (
        pa.types.is_fixed_size_list(arrow_type)
        or pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
    )


def _is_image(arrow_type: pa.DataType) -> bool:
    """An image column as Hugging Face ``datasets`` stores one: ``struct<bytes, path>``."""
    return pa.types.is_struct(arrow_type) and arrow_type.get_field_index("bytes") >= 0


def _from_arrow(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Inverse of ``_to_arrow`` (also reads variable-size lists of equal lengths and PNG image
    structs): a fresh, writable numpy array [N, ...]; ValueError for ragged lists, nulls or an
    image without its bytes."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array, pa.ExtensionArray):  # Array2D etc., when `datasets` registered them
        array = array.storage
    if _is_image(array.type):
        return _decode_images(array)
    rows, shape = len(array), []
    while _is_list(array.type):
        if array.null_count:
            raise ValueError("a list column has empty (null) entries")
        if pa.types.is_fixed_size_list(array.type):
            size = array.type.list_size
        else:
            lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
            size = int(lengths[0]) if len(lengths) else 0
            if (lengths != size).any():
                raise ValueError(
                    f"a list column holds lists of lengths {sorted(set(lengths.tolist()))[:4]}; "
                    "a feature needs one shape"
                )
        shape.append(size)
        array = array.flatten()
    return np.array(array.to_numpy(zero_copy_only=False)).reshape(rows, *shape)


def _decode_images(array: pa.StructArray) -> np.ndarray:
    """PNG (or any PIL-readable) images of a ``struct<bytes, path>`` column as uint8 RGB."""
    from PIL import Image

    images = []
    for index, data in enumerate(array.field("bytes").to_pylist()):
        if data is None:
            raise ValueError(
                f"image {index} of an image column has no embedded bytes (only a path); "
                "LeRobot v3.0 datasets embed their images"
            )
        with Image.open(io.BytesIO(data)) as image:
            images.append(np.asarray(image.convert("RGB")))
    if not images:
        return np.zeros((0, 0, 0, 3), dtype=np.uint8)
    return np.stack(images)


def _arrow_spec(
    arrow_type: pa.DataType, declared: list[int] | None = None
) -> tuple[np.dtype, tuple[int, ...]]:
    """Numpy dtype and per-frame shape that an arrow column type stores; ``UNKNOWN`` for each
    size a variable-size list leaves open (filled from info.json's ``declared`` shape when
    given); images: uint8 of shape (UNKNOWN, UNKNOWN, 3)."""
    dtype, shape = _stored_spec(arrow_type)
    if declared is not None and UNKNOWN in shape and len(shape) == len(declared):
        shape = tuple(int(size) for size in declared)
    return dtype, shape


def _stored_spec(arrow_type: pa.DataType) -> tuple[np.dtype, tuple[int, ...]]:
    """``_arrow_spec`` of the type alone."""
    if isinstance(arrow_type, pa.ExtensionType):
        arrow_type = arrow_type.storage_type
    if _is_image(arrow_type):
        return np.dtype(np.uint8), (UNKNOWN, UNKNOWN, 3)
    shape = []
    while _is_list(arrow_type):
        fixed = pa.types.is_fixed_size_list(arrow_type)
        shape.append(arrow_type.list_size if fixed else UNKNOWN)
        arrow_type = arrow_type.value_type
    return np.dtype(arrow_type.to_pandas_dtype()), tuple(shape)


def _shape_fits(stored: tuple[int, ...], declared: list[int]) -> bool:
    """Whether a column's per-frame shape (``_arrow_spec``; scalars ``()``) can hold a feature
    of info.json's ``shape`` (scalars ``[1]``); ``UNKNOWN`` sizes fit any."""
    stored = tuple(stored) or (1,)
    return len(stored) == len(declared) and all(
        size in (UNKNOWN, want) for size, want in zip(stored, declared, strict=True)
    )
