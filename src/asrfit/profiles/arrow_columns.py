"""Numbers from pyarrow columns read off their buffers, without ``pyarrow.compute``.

``pyarrow.compute`` functions and ``Array.to_numpy(zero_copy_only=False)`` import pandas on
their first call (0.2-0.3 s, a tenth of a warm plan); the manifest scan needs neither.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def utf8_lengths(column: Any) -> np.ndarray:
    """Characters of each string of a pyarrow string array without nulls, as int64.

    Counted from the array's buffers (UTF-8 bytes that are not continuation bytes,
    ``0b10xxxxxx``), not with ``pyarrow.compute``, whose first call imports pandas (0.2-0.3 s
    of a warm plan).
    """
    import pyarrow as pa

    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=width)[
        column.offset : column.offset + len(column) + 1
    ]
    if data_buffer is None or not len(column):
        return np.zeros(len(column), dtype=np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum((data & 0xC0) != 0x80, dtype=np.int64)))
    return starts[offsets[1:]] - starts[offsets[:-1]]


def float64_values(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(values, is_null)`` of a pyarrow float64 array, from its buffers (a fresh copy).

    Not ``to_numpy``/``is_null``, which import pandas (see :func:`utf8_lengths`); a null's
    value is unspecified.
    """
    validity, values_buffer = column.buffers()
    n, start = len(column), column.offset
    values = np.frombuffer(values_buffer, dtype=np.float64)[start : start + n].copy()
    if validity is None or not column.null_count:
        return values, np.zeros(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    return values, ~bits[start : start + n].astype(bool)
