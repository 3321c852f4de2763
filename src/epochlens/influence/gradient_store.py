"""The gradient store: the training samples' projected gradients (:mod:`.projection`) on disk, written
once per checkpoint and scored against any queries.

A store is one or more shards, each a contiguous range of the training samples in two files:

* ``store_{k}-of-{n}.npy``: (n_k, width) float32 or float16, a standard ``.npy`` (``np.load(path,
  mmap_mode="r")`` maps it); a float16 row is the gradient divided by its scale. Written batch by
  batch (:class:`StoreWriter`), read chunk by chunk (:meth:`GradientStore.chunks`) with plain reads,
  not a memory map: a mapped file's pages count in the job's resident memory, which would grow with N.
* ``store_{k}-of-{n}.pt``: what the rows are (:class:`ShardInfo`): their positions in the training
  split, scales, losses, which are usable, the layers' columns, the sums of the projected
  Gauss-Newton matrices from the Fisher's gradients, and the key of the settings and checkpoint.

:func:`store_scores` gives the (Q, N) influence of the stored samples on preconditioned queries and
each stored sample's self-influence, reading the store once, ``chunk_bytes`` at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from epochlens.atomic import atomic_path
from epochlens.errors import InfluenceError

#: Bytes of stored rows that scoring reads (and turns into float64) at a time.
CHUNK_BYTES = 64 * 2**20


class StoreWriter:
    """Write a shard's rows in order as they come (``writer(positions, rows, scales)``; positions
    not given are NaN rows), atomically: the ``.npy`` appears complete or not at all."""

    def __init__(self, path: str | Path, n: int, width: int, dtype: str) -> None:
        self.path, self.n, self.width, self.dtype = Path(path), n, width, np.dtype(dtype)
        self._atomic = atomic_path(self.path)
        self.next = 0

    def __enter__(self) -> StoreWriter:
        tmp = self._atomic.__enter__()
        self.file = open(tmp, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False}
        np.lib.format.write_array_header_2_0(self.file, {**header, "shape": (self.n, self.width)})
        return self

    def __call__(self, positions: np.ndarray, rows: np.ndarray, scales: np.ndarray) -> None:
        if len(positions) == 0:
            return
        if positions[0] < self.next or np.any(np.diff(positions) <= 0):
            raise ValueError("store rows must come in increasing positions")
        for pos, row in zip(positions, rows.astype(self.dtype), strict=True):
            self._fill(int(pos))
            self.file.write(row.tobytes())
            self.next = int(pos) + 1

    def _fill(self, stop: int) -> None:
        if stop > self.next:
            self.file.write(np.full((stop - self.next, self.width), np.nan, self.dtype).tobytes())
            self.next = stop

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self._fill(self.n)
        self.file.close()
        self._atomic.__exit__(*exc)


@dataclass
class ShardInfo:
    """The ``.pt`` beside a shard's rows.

    Attributes:
        positions: (n,) int64 the rows' positions in the training split.
        scales: (n,) float32; losses: (n,) float64; usable: (n,) bool.
        layers: [name, out_dim, in_dim, k_out, k_in, offset] per tracked layer, in column order.
        fisher: kind -> layer -> float64 sums over the Fisher's projected gradients: gauss_newton
            (Σ g̃ g̃ᵀ), activation and gradient (the projected Kronecker factors' sums).
        n_fisher: samples in the sums. skipped, vanished: global indices left out.
        key: the settings, projection and checkpoint the rows are of (checked when scoring).
        timings: seconds of the pass.
    """

    positions: np.ndarray
    scales: np.ndarray
    losses: np.ndarray
    usable: np.ndarray
    layers: list
    fisher: dict
    n_fisher: int
    skipped: list
    vanished: list
    key: dict
    timings: dict

    def save(self, path: str | Path) -> None:
        payload = asdict(self)
        for k in ("positions", "scales", "losses", "usable"):
            payload[k] = torch.from_numpy(np.ascontiguousarray(payload[k]))
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)

    @classmethod
    def load(cls, path: str | Path) -> ShardInfo:
        try:
            # mapped: the Fisher's sums are read only where they are summed, not by every scoring
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            for k in ("positions", "scales", "losses", "usable"):
                payload[k] = payload[k].numpy()
            return cls(**payload)
        except Exception as exc:
            raise InfluenceError(
                f"{path}: not a readable gradient-store shard ({type(exc).__name__}: {str(exc)[:200]}). "
                "Delete it (and its .npy) and compute the shard again."
            ) from exc


def merged_fisher(infos: Sequence[ShardInfo]) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """The Fisher's sums (:class:`ShardInfo`) added over the shards, and the number of samples in them.

    Raises:
        InfluenceError: shards of other settings, checkpoints or layers.
    """
    first = infos[0]
    if any(i.key != first.key or i.layers != first.layers for i in infos[1:]):
        raise InfluenceError(
            "the gradient store's shards were written with other settings or checkpoints; delete them "
            "and compute them again"
        )
    sums = {kind: {n: t.clone() for n, t in part.items()} for kind, part in first.fisher.items()}
    for info in infos[1:]:
        for kind, part in sums.items():
            for n in part:
                part[n] += info.fisher[kind][n]
    return sums, sum(i.n_fisher for i in infos)


def _npy_layout(path: Path) -> tuple[tuple[int, int], np.dtype, int]:
    """(shape, dtype, offset of the data) of a ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(f)
        if fortran or len(shape) != 2:
            raise InfluenceError(f"{path}: not a (samples, width) C-ordered gradient store")
        return shape, dtype, f.tell()


class GradientStore:
    """The shards of one checkpoint's store, in order (positions increasing from shard to shard)."""

    def __init__(self, shards: Sequence[tuple[str | Path, str | Path]]) -> None:
        if not shards:
            raise InfluenceError("no gradient-store shards")
        self.paths = [Path(npy) for npy, _ in shards]
        self.infos = [ShardInfo.load(meta) for _, meta in shards]
        self.layouts = []
        for path, info in zip(self.paths, self.infos, strict=True):
            try:
                shape, dtype, offset = _npy_layout(path)
            except (OSError, ValueError) as exc:
                raise InfluenceError(
                    f"{path}: unreadable gradient store ({exc}); delete the shard, rerun"
                ) from exc
            if shape[0] != len(info.positions):
                raise InfluenceError(
                    f"{path}: {shape[0]} rows but its .pt describes {len(info.positions)}: the two files "
                    "are of different runs of the shard; delete both and compute the shard again."
                )
            self.layouts.append((shape, dtype, offset))
        first = self.infos[0]
        for k, info in enumerate(self.infos[1:], start=1):
            if info.key != first.key or info.layers != first.layers:
                raise InfluenceError(
                    f"{self.paths[k]}: written with other settings or another checkpoint than "
                    f"{self.paths[0]}; delete the store's shards and compute them again."
                )
        self.width = self.layouts[0][0][1]

    @property
    def key(self) -> dict:
        return self.infos[0].key

    @property
    def positions(self) -> np.ndarray:
        return np.concatenate([i.positions for i in self.infos])

    def concatenated(self, name: str) -> np.ndarray:
        return np.concatenate([getattr(i, name) for i in self.infos])

    def fisher(self) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
        """The Fisher's sums over every shard (:func:`merged_fisher`)."""
        return merged_fisher(self.infos)

    def __len__(self) -> int:
        return sum(len(i.positions) for i in self.infos)

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[slice, np.ndarray]]:
        """(rows of the concatenated store, (rows, width) float64 gradients scaled back)."""
        start = 0
        for path, info, (shape, dtype, offset) in zip(self.paths, self.infos, self.layouts, strict=True):
            step = max(1, chunk_bytes // max(1, shape[1] * 8))
            with open(path, "rb") as f:
                for lo in range(0, shape[0], step):
                    hi = min(lo + step, shape[0])
                    f.seek(offset + lo * shape[1] * dtype.itemsize)
                    rows = np.fromfile(f, dtype=dtype, count=(hi - lo) * shape[1]).reshape(hi - lo, shape[1])
                    if len(rows) != hi - lo:
                        raise InfluenceError(f"{path}: truncated; delete the shard and compute it again")
                    values = rows.astype(np.float64) * info.scales[lo:hi, None]
                    yield slice(start + lo, start + hi), values
            start += shape[0]


def store_scores(
    store: GradientStore, curvature, queries: np.ndarray, chunk_bytes: int = CHUNK_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """(pairwise (Q, N) = (P g̃_q)ᵀ g̃_n for ``queries`` = P g̃_q (Q, width), self (N,) = g̃_nᵀ P g̃_n)
    of every stored sample, P ``curvature.apply``; one read of the store. NaN for unusable rows."""
    n = len(store)
    pairwise = np.full((len(queries), n), np.nan)
    self_ = np.full(n, np.nan)
    for rows, g in store.chunks(chunk_bytes):
        pairwise[:, rows] = queries @ g.T
        self_[rows] = np.einsum("nd,nd->n", curvature.apply(g), g)
    return pairwise, self_


@dataclass
class TopK:
    """Exact top-k of the store's influence on each query and of each stored sample over the queries.

    Attributes:
        query_indices, query_scores: (Q, k) rows of the store (positions in the concatenated store)
            with the k largest influences on each query, largest first (-1 and NaN past the usable).
        sample_indices, sample_scores: (N, k') the k' = min(k, Q) queries each stored sample
            influences most, largest first (NaN for unusable rows).
    """

    query_indices: np.ndarray
    query_scores: np.ndarray
    sample_indices: np.ndarray
    sample_scores: np.ndarray


def _largest(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of the k largest finite entries of each row, largest first; NaN never wins."""
    filled = np.where(np.isfinite(scores), scores, -np.inf)
    k = min(k, scores.shape[1])
    top = np.argpartition(-filled, k - 1, axis=1)[:, :k] if k < scores.shape[1] else np.argsort(-filled, 1)
    order = np.argsort(-np.take_along_axis(filled, top, 1), axis=1, kind="stable")
    top = np.take_along_axis(top, order, 1)
    values = np.take_along_axis(filled, top, 1)
    return np.where(np.isfinite(values), top, -1), np.where(np.isfinite(values), values, np.nan)


def store_topk(store: GradientStore, queries: np.ndarray, k: int, chunk_bytes: int = CHUNK_BYTES) -> TopK:
    """The exact top-k of (P g̃_q)ᵀ g̃_n (``queries`` = P g̃_q, (Q, width)) per query over the store,
    and per stored sample over the queries, in one read of the store: memory Q x (k + chunk rows),
    not Q x N."""
    q, n = len(queries), len(store)
    best_idx, best_val = np.full((q, 0), -1, np.int64), np.full((q, 0), np.nan)
    per_sample = min(k, q)
    sample_idx, sample_val = np.full((n, per_sample), -1, np.int64), np.full((n, per_sample), np.nan)
    for rows, g in store.chunks(chunk_bytes):
        scores = queries @ g.T  # (Q, rows)
        idx, val = _largest(np.concatenate([best_val, scores], 1), k)
        candidates = np.concatenate(
            [best_idx, np.broadcast_to(np.arange(rows.start, rows.stop), scores.shape)], 1
        )
        best_idx = np.where(idx >= 0, np.take_along_axis(candidates, np.maximum(idx, 0), 1), -1)
        best_val = val
        if per_sample:
            sample_idx[rows], sample_val[rows] = _largest(scores.T, per_sample)
    return TopK(best_idx, best_val, sample_idx, sample_val)
