"""One layer's ``.npy`` or ``.safetensors`` file of a snapshot folder (:mod:`epochlens.features.stored`),
read whole by ``pread`` after its header into a buffer reused from layer to layer: large sequential
reads, not the page faults of a memory map or of fresh memory. A bfloat16 tensor stays its 16 bits
(:class:`BFloat16Rows`), widened to float32 a batch of rows at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from epochlens.errors import FeatureError


class ReusedBuffer:
    """Bytes that each layer of a split is read into, kept for the next layer: fresh memory costs
    a page fault per 4 KiB on first touch (0.62x a plain read against 0.8x)."""

    def __init__(self) -> None:
        self.array = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int, reuse: bool = True) -> np.ndarray:
        """``nbytes`` bytes: this buffer's (valid until the next call) or, ``reuse`` False, new ones."""
        if not reuse:
            return np.empty(nbytes, dtype=np.uint8)
        if len(self.array) < nbytes:
            self.array = np.empty(nbytes, dtype=np.uint8)
        return self.array[:nbytes]


def read_npy(path: Path, where: str, buffer: ReusedBuffer, reuse: bool) -> np.ndarray:
    """A ``.npy`` layer (N, *shape) read into ``buffer`` by ``pread`` after its header (one large
    sequential read, not the page faults of a memory map); a Fortran-ordered or object array is
    memory-mapped (or loaded) as numpy does."""
    if not path.exists():
        raise FeatureError(f"{where}: no such file; store the layer or fix features.layers.")
    with open(path, "rb", buffering=0) as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0
            if version != (1, 0):
                read_header = np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
        except ValueError as exc:
            raise FeatureError(f"{where}: not a readable .npy file ({exc}); store the layer again.") from None
        if fortran or dtype.hasobject or not shape:
            return np.load(path, mmap_mode="r")
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if path.stat().st_size - f.tell() < nbytes:
            raise FeatureError(f"{where}: the file is truncated (shape {shape}); store the layer again.")
        dest = buffer.take(nbytes, reuse).view(dtype).reshape(shape)
        pread_into(f.fileno(), memoryview(dest.reshape(-1).view(np.uint8)), f.tell(), None)
    return dest


def pread_into(fd: int, dest: memoryview, offset: int, view: np.ndarray | None) -> None:
    """Fill ``dest`` from the file at ``offset`` (where os.preadv is missing: copy ``view``, or
    seek and read when there is none)."""
    if not hasattr(os, "preadv") and view is None:
        os.lseek(fd, offset, os.SEEK_SET)
        done = 0
        while done < len(dest):
            n = os.readv(fd, [dest[done:]])
            if n <= 0:
                raise FeatureError(
                    f"file descriptor {fd}: short read at byte {offset + done}; the file is truncated."
                )
            done += n
        return
    if not hasattr(os, "preadv"):
        dest[:] = view.reshape(-1).view(np.uint8)
        return
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n <= 0:
            raise FeatureError(
                f"file descriptor {fd}: short read at byte {offset + done}; the file is truncated."
            )
        done += n


# safetensors dtype codes (https://huggingface.co/docs/safetensors): little-endian numpy dtypes;
# BF16 as its 16 bits (numpy has no bfloat16), widened to float32 by BFloat16Rows
SAFETENSORS_DTYPES = {
    "F16": "<f2",
    "F32": "<f4",
    "F64": "<f8",
    "BF16": "<u2",
    "I8": "i1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
    "U8": "u1",
    "U16": "<u2",
    "U32": "<u4",
    "U64": "<u8",
}


class BFloat16Rows:
    """A bfloat16 layer (its 16-bit patterns, N x *shape) whose rows are float32 when taken: a
    bfloat16 is the upper half of the float32 of the same value, so a 16-bit shift widens it
    exactly (the representations work in float32)."""

    def __init__(self, bits: np.ndarray) -> None:
        self.bits = bits
        self.shape = bits.shape

    def __len__(self) -> int:
        return len(self.bits)

    def __getitem__(self, rows) -> np.ndarray:
        return np.left_shift(self.bits[rows], 16, dtype=np.uint32).view(np.float32)


def read_safetensors(path: Path, where: str, buffer: ReusedBuffer, reuse: bool) -> np.ndarray | BFloat16Rows:
    """A one-tensor ``.safetensors`` layer (N, *shape) read into ``buffer`` by ``pread`` after its
    header, as :func:`read_npy` (a bfloat16 tensor: :class:`BFloat16Rows` over its bits)."""
    if not path.exists():
        raise FeatureError(f"{where}: no such file; store the layer or fix features.layers.")
    with open(path, "rb", buffering=0) as f:
        code, shape, offset, nbytes = _safetensors_header(f, path.stat().st_size, where)
        dest = buffer.take(nbytes, reuse).view(SAFETENSORS_DTYPES[code]).reshape(shape)
        pread_into(f.fileno(), memoryview(dest.reshape(-1).view(np.uint8)), offset, None)
    return BFloat16Rows(dest) if code == "BF16" else dest


def _safetensors_header(f, size: int, where: str) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype code, shape, offset of the data in the file, its bytes) of a one-tensor file: an
    8-byte little-endian header length, the JSON header, then the data (offsets from its start)."""
    store = "store the layer again (safetensors.numpy.save_file({name: array}, path))"
    head = f.read(8)
    length = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 0 < length <= size - 8:
        raise FeatureError(f"{where}: not a safetensors file or truncated (header length {length}); {store}.")
    try:
        header = json.loads(f.read(length))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    except (ValueError, AttributeError) as exc:
        raise FeatureError(f"{where}: unreadable safetensors header ({exc}); {store}.") from exc
    if len(tensors) != 1:
        raise FeatureError(
            f"{where}: {len(tensors)} tensors {sorted(tensors)[:5]}; store one tensor per layer file."
        )
    ((name, info),) = tensors.items()
    code, shape, (begin, end) = info.get("dtype"), tuple(info.get("shape", ())), info.get("data_offsets")
    if code not in SAFETENSORS_DTYPES:
        raise FeatureError(
            f"{where}: tensor {name!r} of dtype {code}; store {sorted(SAFETENSORS_DTYPES)} "
            "(floats for activations, integers for ids)."
        )
    if not shape:
        raise FeatureError(f"{where}: tensor {name!r} is a scalar, not rows (N, *shape); {store}.")
    nbytes = int(np.prod(shape)) * np.dtype(SAFETENSORS_DTYPES[code]).itemsize
    if end - begin != nbytes:
        raise FeatureError(
            f"{where}: tensor {name!r} of shape {list(shape)} {code} needs {nbytes} bytes, its "
            f"header gives {end - begin}; {store}."
        )
    if size < 8 + length + end:
        raise FeatureError(
            f"{where}: the file is truncated ({size} bytes, the header's tensor {name!r} of shape "
            f"{list(shape)} ends at byte {8 + length + end}); {store}."
        )
    return code, shape, 8 + length + begin, nbytes
