"""Torch tensors stored in Mooncake's layout (header + bytes): put, get,
their buffer (``_from``/``_into``) and CUDA forms, and safetensors files."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .. import _tensor
from ..config import ReplicateConfig
from ..errors import KvpoolError
from ._codes import FILE_NOT_FOUND, INVALID_PARAMS, NOT_SUPPORTED, OBJECT_NOT_FOUND, OK, logger


class _TensorsMixin:
    """Tensors and safetensors (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ tensors

    def _put_tensors(self, keys: Sequence[str], tensors: Sequence[Any], config: Any, upsert: bool,
                     shard: Optional[Callable[[Any], List[Tuple[str, bytes, Any]]]] = None) -> List[int]:
        """Stores tensors as header + bytes, one batch; ``shard`` turns one
        (key, tensor) into the (key, header, data) objects to store."""
        c = self._client
        n = len(keys)
        if c is None or len(tensors) != n:
            return [INVALID_PARAMS] * n
        bad, cfg = self._config(config, n)
        if bad is not None:
            return [bad] * n
        objects: List[Tuple[int, str, bytes, Any]] = []
        out = [OK] * n
        for i, (k, t) in enumerate(zip(keys, tensors)):
            try:
                if not k or not _tensor.is_tensor(t):
                    raise _tensor.BadTensor("a key and a torch tensor are needed")
                if shard is None:
                    t = _tensor.contiguous(t)
                    parts = [(k, _tensor.header(t), t)]
                else:
                    parts = shard((k, t))
                objects.extend((i, pk, h, d) for pk, h, d in parts)
            except _tensor.BadTensor as e:
                logger.debug("tensor %r refused: %s", k, e)
                out[i] = INVALID_PARAMS
        if objects:
            values = [[h, _tensor.data_view(d)] if d.numel() else [h] for _, _, h, d in objects]
            try:
                codes = c.batch_put([pk for _, pk, _, _ in objects], values, None, cfg, upsert)
            except KvpoolError as e:
                codes = [e.code] * len(objects)
            for (i, _, _, _), rc in zip(objects, codes):
                if rc != OK and out[i] == OK:
                    out[i] = rc
        return out

    def _get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (read straight into a buffer the
        tensor then views), or None."""
        got = self._read_tensor(key)
        return None if got is None else got[0]

    def _read_tensor(self, key: str) -> Optional[Tuple[Any, _tensor.Meta]]:
        """:meth:`_get_tensor` with the header it was read with, or None."""
        c = self._client
        if c is None or not key:
            return None
        try:
            buf = c.get_buffer(key)
            meta = _tensor.parse(buf, len(buf))
            return _tensor.from_buffer(buf, meta), meta
        except (KvpoolError, _tensor.BadTensor):
            return None

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Stores a torch tensor (any dtype Mooncake's layout numbers, up to 8
        dimensions; non-contiguous tensors are stored in C order); write-once."""
        return self._put_tensors([key], [tensor], None, False)[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """:meth:`put_tensor` that replaces an existing value."""
        return self._put_tensors([key], [tensor], None, True)[0]

    def pub_tensor(self, key: str, tensor: Any, config: Optional[ReplicateConfig] = None) -> int:
        """:meth:`put_tensor` with a ReplicateConfig."""
        return self._put_tensors([key], [tensor], config, False)[0]

    def upsert_pub_tensor(self, key: str, tensor: Any, config: Optional[ReplicateConfig] = None) -> int:
        """:meth:`upsert_tensor` with a ReplicateConfig."""
        return self._put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys: List[str], tensors_list: List[Any]) -> List[int]:
        """:meth:`put_tensor` for many keys; per key 0 or negative."""
        return self._put_tensors(keys, tensors_list, None, False)

    def batch_upsert_tensor(self, keys: List[str], tensors_list: List[Any]) -> List[int]:
        """:meth:`upsert_tensor` for many keys."""
        return self._put_tensors(keys, tensors_list, None, True)

    def batch_pub_tensor(self, keys: List[str], tensors_list: List[Any], config: Optional[ReplicateConfig] = None) -> List[int]:
        """:meth:`pub_tensor` for many keys."""
        return self._put_tensors(keys, tensors_list, config, False)

    def batch_upsert_pub_tensor(self, keys: List[str], tensors_list: List[Any], config: Optional[ReplicateConfig] = None) -> List[int]:
        """:meth:`upsert_pub_tensor` for many keys."""
        return self._put_tensors(keys, tensors_list, config, True)

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (same dtype and shape), or None."""
        return self._get_tensor(key)

    def batch_get_tensor(self, keys: List[str]) -> List[Any]:
        """:meth:`get_tensor` for many keys (None where missing)."""
        return [self._get_tensor(k) for k in keys]

    def _check_tensor_buffer(self, ptr: int, size: int) -> bool:
        """Whether ``size`` bytes at ``ptr`` hold one tensor object exactly."""
        if int(ptr) <= 0 or int(size) < _tensor.HEADER:
            return False
        try:
            _tensor.parse((ctypes.c_ubyte * _tensor.HEADER).from_address(int(ptr)), int(size))
            return True
        except _tensor.BadTensor:
            return False

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores a tensor from a buffer holding header + data (the layout
        :meth:`get_tensor_into` leaves); −600 if the buffer is not exactly that."""
        if self._client is None or not self._check_tensor_buffer(buffer_ptr, size):
            return INVALID_PARAMS
        return self._put_from(key, buffer_ptr, size, None, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """:meth:`put_tensor_from` that replaces an existing value."""
        if self._client is None or not self._check_tensor_buffer(buffer_ptr, size):
            return INVALID_PARAMS
        return self._put_from(key, buffer_ptr, size, None, True)

    def batch_put_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """:meth:`put_tensor_from` for many keys."""
        return self._batch_tensor_from(keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """:meth:`upsert_tensor_from` for many keys."""
        return self._batch_tensor_from(keys, buffer_ptrs, sizes, True)

    def _batch_tensor_from(self, keys: List[str], ptrs: List[int], sizes: List[int], upsert: bool) -> List[int]:
        if self._client is None or not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        ok = [self._check_tensor_buffer(p, s) for p, s in zip(ptrs, sizes)]
        # Like Mooncake, one bad buffer fails the whole batch (nothing stored).
        idx = list(range(len(keys))) if all(ok) else []
        out = [INVALID_PARAMS] * len(keys)
        if idx:
            got = self._batch_put_from([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx], None, upsert, True)
            for i, rc in zip(idx, got):
                out[i] = rc
        return out

    def _tensor_into(self, key: str, ptr: int, size: int) -> Any:
        """Reads tensor object ``key`` into ``size`` bytes at ``ptr``; a
        tensor viewing the data there, or None."""
        c = self._client
        if c is None or not key or int(ptr) <= 0 or int(size) < _tensor.HEADER:
            return None
        try:
            n = c.get_into(key, int(ptr), int(size))
            arr = (ctypes.c_ubyte * n).from_address(int(ptr))
            return _tensor.from_buffer(arr, _tensor.parse(arr, n))
        except (KvpoolError, _tensor.BadTensor):
            return None

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads the tensor object (header + data) into the buffer and returns
        a tensor viewing its data there (no copy), or None (missing, or the
        buffer too small)."""
        return self._tensor_into(key, buffer_ptr, size)

    def batch_get_tensor_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[Any]:
        """:meth:`get_tensor_into` for many keys."""
        if len(keys) != len(buffer_ptrs) or len(keys) != len(sizes):
            return [None] * len(keys)
        return [self._tensor_into(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Reads the tensor stored under ``key`` into CUDA tensor ``tensor``
        (same number of bytes): 0 or negative. Raises
        :class:`kvpool.errors.NotSupported` where torch has no CUDA."""
        return self.batch_get_tensor_into_cuda([key], [tensor])[0]

    def batch_get_tensor_into_cuda(self, keys: List[str], tensors_list: List[Any]) -> List[int]:
        """:meth:`get_tensor_into_cuda` for many keys."""
        from ..errors import NotSupported

        torch = _tensor.torch_module()
        if not torch.cuda.is_available():
            raise NotSupported("the _into_cuda reads need torch with CUDA; this torch has no CUDA device", NOT_SUPPORTED)
        if self._client is None or len(keys) != len(tensors_list):
            return [INVALID_PARAMS] * len(keys)
        out = []
        for k, dst in zip(keys, tensors_list):
            if not _tensor.is_tensor(dst) or dst.device.type != "cuda" or not dst.is_contiguous():
                out.append(INVALID_PARAMS)
                continue
            src = self._get_tensor(k)
            if src is None:
                out.append(OBJECT_NOT_FOUND)
                continue
            if src.numel() * src.element_size() != dst.numel() * dst.element_size():
                out.append(INVALID_PARAMS)
                continue
            dst.view(torch.uint8).reshape(-1).copy_(src.reshape(-1).view(torch.uint8), non_blocking=False)
            out.append(OK)
        return out

    # ------------------------------------------------------------ safetensors

    def save_tensor_to_safetensor(self, key: str, file_name: Any = None) -> int:
        """Writes the tensor under ``key`` to a safetensors file
        (``file_name``, default the key) as tensor ``key``: 0; −1100
        (Mooncake's ``FILE_NOT_FOUND``) when there is no tensor to save (a
        missing key, an empty key, an object that is not a tensor); −600 if
        the file cannot be written or before setup. A ``file_name`` that is
        not a str (or bytes) raises RuntimeError once the tensor is found,
        as Mooncake's cast does."""
        if self._client is None:
            return INVALID_PARAMS
        t = self._get_tensor(key)
        if t is None:
            return FILE_NOT_FOUND
        if file_name is not None and not isinstance(file_name, (str, bytes)):
            raise RuntimeError(
                f"Unable to cast Python instance of type {type(file_name)} to C++ type 'std::string'"
            )
        path = os.fsdecode(file_name) if file_name else key
        try:
            blob = _tensor.safetensors_bytes(key, t)
            with open(path, "wb") as f:
                f.write(blob)
        except (OSError, _tensor.BadTensor) as e:
            logger.error("cannot save %r to %s: %s", key, path, e)
            return INVALID_PARAMS
        return OK

    def load_tensor_from_safetensor(self, key: Any = None, file_name: Optional[str] = None) -> Any:
        """Reads a tensor from safetensors file ``file_name`` (the one named
        ``key``, else the file's first, with a warning) and stores it under
        ``key`` (default: the file name); returns the tensor, or None."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing required argument: 'file_name'")
        try:
            with open(file_name, "rb") as f:
                blob = f.read()
            name, t, found = _tensor.safetensors_load(blob, key)
        except (OSError, ValueError) as e:
            logger.error("cannot load %s: %s", file_name, e)
            return None
        if key is not None and not found:
            logger.warning("%s holds no tensor named %r; storing its first tensor %r", file_name, key, name)
        store_key = str(key) if key is not None else str(file_name)
        rc = self.upsert_tensor(store_key, t)
        return t if rc == OK else None
