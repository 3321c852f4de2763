"""The dossier's columns as arrow arrays, each of its declared type
(:func:`epochlens.samples.columns.column_spec`): the series as list columns, identity and further
columns as one table, and a row range of any of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from epochlens.samples.columns import column_spec


def series_arrays(series: Mapping[str, np.ndarray], epochs: Sequence[int]) -> dict[str, pa.Array]:
    """Each (m, N) series as a list column of N lists of m values, plus ``epochs``."""
    n = next(iter(series.values())).shape[1]
    m = len(epochs)
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * m)
    cols = {"epochs": pa.ListArray.from_arrays(offsets, pa.array(np.tile(np.asarray(epochs, np.int32), n)))}
    for key, values in series.items():
        kind = column_spec(key)[0]
        flat = pa.array(np.ascontiguousarray(np.asarray(values).T).reshape(-1)).cast(kind.value_type)
        cols[key] = pa.ListArray.from_arrays(offsets, flat)
    return cols


def frame_table(frame: pd.DataFrame, extra: Mapping[str, object]) -> pa.Table:
    """Identity columns and further columns (numpy arrays, lists of arrays, pyarrow arrays) as one
    arrow table, each column of its declared type."""
    arrays, names = [], []
    columns = {**{c: frame[c].to_numpy() for c in frame.columns}, **extra}
    for name, values in columns.items():
        kind = column_spec(name)[0]
        if name == "target" and len(values) and isinstance(values[0], np.ndarray):
            kind = pa.list_(pa.float64())  # a target of several values per sample
        if isinstance(values, pa.Array):
            arrays.append(values.cast(kind))
        elif isinstance(values, pd.api.extensions.ExtensionArray):
            arrays.append(pa.array(values.to_numpy(dtype=object, na_value=None), type=kind))
        elif pa.types.is_list(kind):
            arrays.append(pa.array([np.asarray(v).tolist() for v in values], type=kind))
        else:
            arrays.append(pa.array(np.asarray(values), type=kind, from_pandas=True))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def row_range(values, lo: int, hi: int):
    """Rows ``lo:hi`` of a column (a numpy array, a list or a pyarrow array: a view)."""
    return values.slice(lo, hi - lo) if isinstance(values, pa.Array) else values[lo:hi]
