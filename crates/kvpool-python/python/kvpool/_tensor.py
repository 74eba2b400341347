"""Tensors as objects, in Mooncake's layout: a 304-byte ``TensorMetadata``
header, then the tensor's bytes (C order). The same layout is what
``put_tensor_from`` takes and ``get_tensor_into`` leaves in a buffer, so
buffers move between Mooncake and kvpool code unchanged.

Header (little-endian)::

    offset size field
         0    4 magic            0x4d4f4f4e
         4    2 version          1
         6    2 header length    304
         8    4 dtype            Mooncake's numbering (DTYPES below)
        12    4 ndim             0..8
        16    8 layout           0 plain tensor, 1 tensor-parallel shard
        24    8 data offset      304
        32    8 data bytes
        40   64 shape[8]         the whole tensor's shape (-1 past ndim)
       104   64 shard shape[8]   this object's shape (-1 past ndim)
       168    8 axes             parallel axes that follow (0 or 1)
       176   32 axis             kind (1 = TP), rank u32, size u32, split dim, shard extent
       208   96 zero

kvpool writes and reads the plain layout and one tensor-parallel axis; torch
is imported only when a tensor call is made."""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Tuple

MAGIC = 0x4D4F4F4E
HEADER = 304
MAX_DIMS = 8
KIND_TP = 1

# Mooncake's dtype numbers, by torch dtype name.
DTYPES = {
    "float32": 0,
    "float64": 1,
    "int8": 2,
    "uint8": 3,
    "int16": 4,
    "uint16": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "uint64": 9,
    "bool": 10,
    "float16": 11,
    "bfloat16": 12,
    "float8_e4m3fn": 13,
    "float8_e5m2": 14,
}
_NAMES = {v: k for k, v in DTYPES.items()}


class BadTensor(ValueError):
    """A tensor or header kvpool cannot store or read (−600 to Mooncake callers)."""


def torch_module() -> Any:
    """torch, or :class:`BadTensor` if it is not installed."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the tests install torch
        raise BadTensor("the tensor calls need torch") from None
    return torch


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (torch imported only if it could be)."""
    mod = type(obj).__module__
    if not mod.startswith("torch"):
        return False
    return isinstance(obj, torch_module().Tensor)


def dtype_code(t: Any) -> int:
    """Mooncake's number for ``t``'s dtype."""
    name = str(t.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise BadTensor(f"dtype {t.dtype} is not storable (Mooncake's tensor layout has no number for it)")
    return DTYPES[name]


def torch_dtype(code: int) -> Any:
    """The torch dtype of Mooncake's number ``code``."""
    torch = torch_module()
    name = _NAMES.get(code)
    if name is None or not hasattr(torch, name):
        raise BadTensor(f"unknown tensor dtype number {code}")
    return getattr(torch, name)


def _dims(shape: Tuple[int, ...]) -> List[int]:
    return list(shape) + [-1] * (MAX_DIMS - len(shape))


def header(
    t: Any,
    full_shape: Optional[Tuple[int, ...]] = None,
    axis: Optional[Tuple[int, int, int, int]] = None,
) -> bytes:
    """The header of contiguous tensor ``t``, stored whole or (``axis`` =
    (rank, size, split_dim, start)) as one shard of a tensor of ``full_shape``."""
    shape = tuple(t.shape)
    if len(shape) > MAX_DIMS:
        raise BadTensor(f"{len(shape)} dimensions (at most {MAX_DIMS})")
    nbytes = t.numel() * t.element_size()
    full = tuple(full_shape) if full_shape is not None else shape
    head = struct.pack("<IHHiiqQQ", MAGIC, 1, HEADER, dtype_code(t), len(shape), 1 if axis else 0, HEADER, nbytes)
    head += struct.pack("<8q", *_dims(full)) + struct.pack("<8q", *_dims(shape))
    if axis:
        rank, size, split_dim, _start = axis
        # Mooncake records the shard's extent along the split dimension.
        head += struct.pack("<qqIIqq", 1, KIND_TP, rank, size, split_dim, shape[split_dim] if shape else 0)
    else:
        head += struct.pack("<q", 0)
    return head + bytes(HEADER - len(head))


class Meta:
    """A parsed header."""

    def __init__(self, dtype: int, shape: Tuple[int, ...], full: Tuple[int, ...], nbytes: int,
                 axis: Optional[Tuple[int, int, int, int]]) -> None:
        self.dtype = dtype
        self.shape = shape
        self.full = full
        self.nbytes = nbytes
        self.axis = axis


def parse(buf: Any, total: Optional[int] = None) -> Meta:
    """The header at the start of ``buf`` (bytes-like, at least 304 bytes);
    with ``total``, the object's size, which must be header + data exactly."""
    mv = memoryview(buf).cast("B")
    if len(mv) < HEADER:
        raise BadTensor(f"{len(mv)} bytes cannot hold a tensor header")
    magic, version, hlen, dtype, ndim, layout, off, nbytes = struct.unpack_from("<IHHiiqQQ", mv, 0)
    if magic != MAGIC or hlen != HEADER or off != HEADER or not 0 <= ndim <= MAX_DIMS:
        raise BadTensor("not a tensor header")
    full = struct.unpack_from("<8q", mv, 40)[:ndim]
    shape = struct.unpack_from("<8q", mv, 104)[:ndim]
    if any(d < 0 for d in shape) or any(d < 0 for d in full):
        raise BadTensor("negative dimension in tensor header")
    dt = torch_dtype(dtype)
    elem = torch_module().empty(0, dtype=dt).element_size()
    count = 1
    for d in shape:
        count *= d
    if count * elem != nbytes:
        raise BadTensor("tensor header sizes disagree")
    if total is not None and total != HEADER + nbytes:
        raise BadTensor(f"object of {total} bytes holds a {HEADER}-byte header and {nbytes} data bytes")
    axis = None
    if layout == 1:
        n, kind, rank, size, split_dim, extent = struct.unpack_from("<qqIIqq", mv, 168)
        if n >= 1 and kind == KIND_TP:
            axis = (rank, size, split_dim, rank * extent)
    return Meta(dtype, tuple(shape), tuple(full), nbytes, axis)


def contiguous(t: Any) -> Any:
    """``t`` in C order on the CPU (a copy only where it is not already)."""
    if t.device.type != "cpu":
        raise BadTensor(f"tensor is on {t.device}; store CPU tensors (or use the _into_cuda reads)")
    return t if t.is_contiguous() else t.contiguous()


def data_view(t: Any) -> memoryview:
    """The bytes of contiguous CPU tensor ``t``, without a copy."""
    if t.numel() == 0:
        return memoryview(b"")
    torch = torch_module()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def from_buffer(buf: Any, meta: Meta, offset: int = HEADER) -> Any:
    """A tensor over ``buf``'s bytes after the header (no copy; the tensor
    keeps ``buf`` alive)."""
    torch = torch_module()
    dt = torch_dtype(meta.dtype)
    count = 1
    for d in meta.shape:
        count *= d
    if count == 0:
        return torch.empty(meta.shape, dtype=dt)
    return torch.frombuffer(buf, dtype=dt, count=count, offset=offset).view(meta.shape)


def split(t: Any, size: int, split_dim: int) -> List[Tuple[Any, Tuple[int, int, int, int]]]:
    """Shards of ``t`` for ``size`` tensor-parallel ranks along
    ``split_dim``, each contiguous, with its axis; uneven splits are refused."""
    if size <= 0 or split_dim < 0 or split_dim >= t.dim():
        raise BadTensor(f"cannot split a {t.dim()}-d tensor into {size} along dimension {split_dim}")
    extent = t.shape[split_dim]
    if extent % size:
        raise BadTensor(f"dimension {split_dim} of {extent} does not split evenly into {size}")
    per = extent // size
    return [(contiguous(s), (r, size, split_dim, r * per)) for r, s in enumerate(t.split(per, dim=split_dim))]


#: Magic of the manifest Mooncake writes beside a tensor's writer partitions.
MANIFEST_MAGIC = 0x574D414E
#: Bytes of that manifest: a 32-byte header, then the whole tensor's shape.
MANIFEST = 96


def writer_manifest(t: Any, size: int, split_dim: int) -> bytes:
    """Mooncake's record of a tensor stored as ``size`` writer partitions
    split along ``split_dim``: dtype, the whole shape, the split."""
    shape = tuple(t.shape)
    head = struct.pack("<IHHiiiiii", MANIFEST_MAGIC, 1, MANIFEST, dtype_code(t), len(shape), split_dim, size, 0, 0)
    return head + struct.pack("<8q", *_dims(shape))


def parse_writer_manifest(buf: Any) -> Tuple[int, Tuple[int, ...], int, int]:
    """(dtype, whole shape, split dim, partitions) of a writer manifest."""
    mv = memoryview(buf).cast("B")
    if len(mv) != MANIFEST:
        raise BadTensor("not a writer manifest")
    magic, version, hlen, dtype, ndim, split_dim, size, _, _ = struct.unpack_from("<IHHiiiiii", mv, 0)
    if magic != MANIFEST_MAGIC or version != 1 or hlen != MANIFEST or not 0 <= split_dim < ndim <= MAX_DIMS or size <= 0:
        raise BadTensor("not a writer manifest")
    shape = struct.unpack_from("<8q", mv, 32)[:ndim]
    if any(d < 0 for d in shape):
        raise BadTensor("negative dimension in writer manifest")
    return dtype, tuple(shape), split_dim, size


def shard_shape(full: Tuple[int, ...], size: int, split_dim: int) -> Tuple[int, ...]:
    """The shape of one shard of ``full`` split ``size`` ways along ``split_dim``."""
    s = list(full)
    s[split_dim] //= size
    return tuple(s)


def safetensors_bytes(name: str, t: Any) -> bytes:
    """A safetensors file holding tensor ``t`` as ``name``."""
    import json

    codes = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int8": "I8", "uint8": "U8",
             "int16": "I16", "uint16": "U16", "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
             "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
    dt = str(t.dtype).replace("torch.", "")
    if dt not in codes:
        raise BadTensor(f"dtype {t.dtype} has no safetensors name")
    data = bytes(data_view(contiguous(t)))
    head = json.dumps({name: {"dtype": codes[dt], "shape": list(t.shape), "data_offsets": [0, len(data)]}}).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


def safetensors_load(blob: bytes, name: Optional[str]) -> Tuple[str, Any, bool]:
    """Tensor ``name`` (or, if absent, the file's first one) of a safetensors
    file: its name, the tensor, and whether it was the one asked for."""
    import json

    torch = torch_module()
    names = {"F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16", "I8": "int8", "U8": "uint8",
             "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
             "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
    if len(blob) < 8:
        raise BadTensor("not a safetensors file")
    (n,) = struct.unpack_from("<Q", blob, 0)
    if n > len(blob) - 8:
        raise BadTensor("not a safetensors file")
    meta = json.loads(blob[8 : 8 + n])
    entries = [(k, v) for k, v in meta.items() if k != "__metadata__"]
    if not entries:
        raise BadTensor("the safetensors file holds no tensor")
    chosen = next(((k, v) for k, v in entries if k == name), None)
    found = chosen is not None
    if chosen is None:
        chosen = min(entries, key=lambda kv: kv[1]["data_offsets"][0])
    k, v = chosen
    dt = names.get(v["dtype"])
    if dt is None:
        raise BadTensor(f"safetensors dtype {v['dtype']} is not supported")
    start, end = v["data_offsets"]
    data = bytearray(blob[8 + n + start : 8 + n + end])
    t = torch.frombuffer(data, dtype=getattr(torch, dt)) if data else torch.empty(0, dtype=getattr(torch, dt))
    return k, t.reshape(v["shape"]), found
