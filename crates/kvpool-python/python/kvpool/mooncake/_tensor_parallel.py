"""Tensors sharded for tensor parallelism: the ``_with_tp`` calls (every
rank's shard stored under ``{key}_tp_{rank}``) and the ``_with_parallelism``
calls (a layout of one TP axis, writer partitions, read targets that put a
tensor back together or cut a shard)."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, List, Optional, Tuple

from .. import _tensor
from ..config import ReplicateConfig
from ..errors import KvpoolError
from ._codes import INVALID_PARAMS


class _TensorParallelMixin:
    """Tensor-parallel shards (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ tensor parallelism

    @staticmethod
    def _tp_key(key: str, rank: int) -> str:
        return f"{key}_tp_{rank}"

    @staticmethod
    def _writer_key(key: str, rank: int, size: int, split: int) -> str:
        """Where Mooncake keeps writer partition ``rank`` of ``size`` along ``split``."""
        return f"{key}__writer_{rank}of{size}_sd{split}"

    @staticmethod
    def _manifest_key(key: str) -> str:
        return f"{key}__writer_manifest"

    def _tp_shards(self, tp_size: int, split_dim: int) -> Callable[[Any], List[Tuple[str, bytes, Any]]]:
        def shard(kt: Any) -> List[Tuple[str, bytes, Any]]:
            key, t = kt
            full = tuple(t.shape)
            return [(self._tp_key(key, ax[0]), _tensor.header(s, full, ax), s) for s, ax in _tensor.split(t, tp_size, split_dim)]

        return shard

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """Splits the tensor into ``tp_size`` shards along ``split_dim``
        (evenly, else −600) and stores every rank's shard under
        ``{key}_tp_{rank}``; ``tp_size`` 1 stores it whole under ``key``."""
        return self._put_with_tp([key], [tensor], None, tp_size, split_dim, False)[0]

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Optional[ReplicateConfig] = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        """:meth:`put_tensor_with_tp` with a ReplicateConfig."""
        return self._put_with_tp([key], [tensor], config, tp_size, split_dim, False)[0]

    def batch_put_tensor_with_tp(self, base_keys: List[str], tensors_list: List[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> List[int]:
        """:meth:`put_tensor_with_tp` for many keys."""
        return self._put_with_tp(base_keys, tensors_list, None, tp_size, split_dim, False)

    def batch_pub_tensor_with_tp(self, base_keys: List[str], tensors_list: List[Any], config: Optional[ReplicateConfig] = None,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        """:meth:`pub_tensor_with_tp` for many keys."""
        return self._put_with_tp(base_keys, tensors_list, config, tp_size, split_dim, False)

    def _put_with_tp(self, keys: List[str], tensors: List[Any], config: Any, tp_size: int, split_dim: int, upsert: bool) -> List[int]:
        if int(tp_size) <= 1:
            return self._put_tensors(keys, tensors, config, upsert)
        return self._put_tensors(keys, tensors, config, upsert, self._tp_shards(int(tp_size), int(split_dim)))

    def _tensor_at(self, ptr: int, size: int) -> Any:
        """The tensor a header + data buffer holds (viewing it), or None."""
        if not self._check_tensor_buffer(ptr, size):
            return None
        arr = (ctypes.c_ubyte * int(size)).from_address(int(ptr))
        return _tensor.from_buffer(arr, _tensor.parse(arr, int(size)))

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        """:meth:`put_tensor_with_tp` of the whole tensor a header + data buffer holds."""
        t = self._tensor_at(buffer_ptr, size)
        if t is None or self._client is None:
            return INVALID_PARAMS
        return self._put_with_tp([key], [t], None, tp_size, split_dim, False)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0,
                                      tp_size: int = 1, split_dim: int = 0) -> List[int]:
        """:meth:`put_tensor_with_tp_from` for many keys."""
        if len(base_keys) != len(buffer_ptrs) or len(base_keys) != len(sizes):
            return [INVALID_PARAMS] * len(base_keys)
        return [self.put_tensor_with_tp_from(k, p, s, tp_rank, tp_size, split_dim) for k, p, s in zip(base_keys, buffer_ptrs, sizes)]

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """The shard ``{key}_tp_{tp_rank}`` (``tp_size`` 1: the tensor under
        ``key``), or None. As in Mooncake, the shard is read as stored:
        ``tp_size`` and ``split_dim`` only choose between whole and shard."""
        return self._get_tensor(key if int(tp_size) <= 1 else self._tp_key(key, int(tp_rank)))

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> Any:
        """:meth:`get_tensor_with_tp` read into a buffer (see :meth:`get_tensor_into`)."""
        return self._tensor_into(key if int(tp_size) <= 1 else self._tp_key(key, int(tp_rank)), buffer_ptr, size)

    def batch_get_tensor_with_tp(self, base_keys: List[str], tp_rank: int = 0, tp_size: int = 1) -> List[Any]:
        """:meth:`get_tensor_with_tp` for many keys."""
        return [self.get_tensor_with_tp(k, tp_rank, tp_size) for k in base_keys]

    def batch_get_tensor_with_tp_into(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0,
                                      tp_size: int = 1) -> List[Any]:
        """:meth:`get_tensor_with_tp_into` for many keys."""
        if len(base_keys) != len(buffer_ptrs) or len(base_keys) != len(sizes):
            return [None] * len(base_keys)
        return [self.get_tensor_with_tp_into(k, p, s, tp_rank, tp_size) for k, p, s in zip(base_keys, buffer_ptrs, sizes)]

    @staticmethod
    def _tp_axis(parallelism: Any) -> Tuple[int, int, int]:
        """(rank, size, split_dim) of a layout of one tensor-parallel axis."""
        axes = list(getattr(parallelism, "axes", None) or [])
        if len(axes) != 1:
            raise _tensor.BadTensor("kvpool stores layouts of exactly one tensor-parallel axis")
        a = axes[0]
        if str(getattr(a, "kind", "")).lower() != "tp":
            raise _tensor.BadTensor(f"unsupported axis kind {getattr(a, 'kind', '')!r} (kvpool stores 'tp' axes)")
        rank, size = int(getattr(a, "rank", 0)), int(getattr(a, "size", 1))
        split = getattr(a, "split_dim", None)
        split = 0 if split is None else int(split)
        if size <= 0 or not 0 <= rank < size:
            raise _tensor.BadTensor(f"rank {rank} of {size}")
        return rank, size, split

    @staticmethod
    def _partition(p: Any) -> Tuple[int, int, int]:
        """(rank, size, split_dim) of a writer partition: any object with
        those attributes (a ``ParallelAxis`` does); a dict is not one, as
        in Mooncake."""
        rank, size, split = (getattr(p, n, None) for n in ("rank", "size", "split_dim"))
        if rank is None or size is None or split is None:
            raise _tensor.BadTensor("writer_partition must provide rank, size, and split_dim")
        return int(rank), int(size), int(split)

    def _parallel_shard(self, parallelism: Any, writer_partition: Any) -> Callable[[Any], List[Tuple[str, bytes, Any]]]:
        if parallelism is not None and writer_partition is not None:
            raise _tensor.BadTensor("writer_partition cannot be combined with parallelism")

        def shard(kt: Any) -> List[Tuple[str, bytes, Any]]:
            key, t = kt
            if parallelism is None and writer_partition is None:
                # No layout: the tensor is stored whole under its key (Mooncake's answer).
                t = _tensor.contiguous(t)
                return [(key, _tensor.header(t), t)]
            if parallelism is not None:
                # The tensor is this rank's shard of a bigger one.
                rank, size, split = self._tp_axis(parallelism)
                t = _tensor.contiguous(t)
                if not 0 <= split < max(1, t.dim()):
                    raise _tensor.BadTensor(f"no dimension {split} to split along")
                full = list(t.shape)
                full[split] *= size
                ax = (rank, size, split, rank * t.shape[split])
                return [(self._tp_key(key, rank), _tensor.header(t, tuple(full), ax), t)]
            # The tensor is whole: this writer stores its partition, and
            # the manifest readers put the whole back together from, where
            # Mooncake keeps them.
            rank, size, split = self._partition(writer_partition)
            if not 0 <= rank < size:
                raise _tensor.BadTensor(f"rank {rank} of {size}")
            s, ax = _tensor.split(t, size, split)[rank]
            manifest = _tensor.writer_manifest(t, size, split)
            return [(self._writer_key(key, rank, size, split), _tensor.header(s, tuple(t.shape), ax), s),
                    (self._manifest_key(key), manifest, t.new_empty(0))]

        return shard

    def _put_parallel(self, keys: List[str], tensors: List[Any], parallelisms: Any, config: Any, writer_partitions: Any,
                      upsert: bool) -> List[int]:
        n = len(keys)
        pars = list(parallelisms) if isinstance(parallelisms, (list, tuple)) else [parallelisms] * n
        parts = list(writer_partitions) if isinstance(writer_partitions, (list, tuple)) else [writer_partitions] * n
        if len(pars) != n or len(parts) != n or len(tensors) != n:
            return [INVALID_PARAMS] * n
        out = []
        for k, t, p, w in zip(keys, tensors, pars, parts):
            try:
                shard = self._parallel_shard(p, w)
            except _tensor.BadTensor:
                out.append(INVALID_PARAMS)
                continue
            out.append(self._put_tensors([k], [t], config, upsert, shard)[0])
        return out

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Optional[ReplicateConfig] = None,
                                    writer_partition: Any = None) -> int:
        """Stores ``tensor`` as the shard ``rank`` of a tensor-parallel
        layout (``parallelism``: one ``"tp"`` axis) under ``{key}_tp_{rank}``;
        or, with ``writer_partition`` (rank, size, split_dim), cuts that
        shard from the whole ``tensor``. Other axis kinds are −600."""
        return self._put_parallel([key], [tensor], parallelism, config, writer_partition, False)[0]

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None,
                                       config: Optional[ReplicateConfig] = None, writer_partition: Any = None) -> int:
        """:meth:`put_tensor_with_parallelism` that replaces existing shards."""
        return self._put_parallel([key], [tensor], parallelism, config, writer_partition, True)[0]

    def batch_put_tensor_with_parallelism(self, keys: List[str], tensors_list: List[Any], parallelisms: Any = None,
                                          config: Optional[ReplicateConfig] = None, writer_partitions: Any = None) -> List[int]:
        """:meth:`put_tensor_with_parallelism` for many keys (one layout per key, or one for all)."""
        return self._put_parallel(keys, tensors_list, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism(self, keys: List[str], tensors_list: List[Any], parallelisms: Any = None,
                                             config: Optional[ReplicateConfig] = None, writer_partitions: Any = None) -> List[int]:
        """:meth:`upsert_tensor_with_parallelism` for many keys."""
        return self._put_parallel(keys, tensors_list, parallelisms, config, writer_partitions, True)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                         config: Optional[ReplicateConfig] = None, writer_partition: Any = None) -> int:
        """:meth:`put_tensor_with_parallelism` of the tensor a header + data buffer holds."""
        t = self._tensor_at(buffer_ptr, size)
        if t is None or self._client is None:
            return INVALID_PARAMS
        return self._put_parallel([key], [t], parallelism, config, writer_partition, False)[0]

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                            config: Optional[ReplicateConfig] = None, writer_partition: Any = None) -> int:
        """:meth:`upsert_tensor_with_parallelism` of the tensor a buffer holds."""
        t = self._tensor_at(buffer_ptr, size)
        if t is None or self._client is None:
            return INVALID_PARAMS
        return self._put_parallel([key], [t], parallelism, config, writer_partition, True)[0]

    def batch_put_tensor_with_parallelism_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                               parallelisms: Any = None, config: Optional[ReplicateConfig] = None,
                                               writer_partitions: Any = None) -> List[int]:
        """:meth:`put_tensor_with_parallelism_from` for many keys."""
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                                  parallelisms: Any = None, config: Optional[ReplicateConfig] = None,
                                                  writer_partitions: Any = None) -> List[int]:
        """:meth:`upsert_tensor_with_parallelism_from` for many keys."""
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True)

    def _batch_parallel_from(self, keys: List[str], ptrs: List[int], sizes: List[int], parallelisms: Any, config: Any,
                             writer_partitions: Any, upsert: bool) -> List[int]:
        n = len(keys)
        if self._client is None or len(ptrs) != n or len(sizes) != n:
            return [INVALID_PARAMS] * n
        tensors = [self._tensor_at(p, s) for p, s in zip(ptrs, sizes)]
        ok = [i for i, t in enumerate(tensors) if t is not None]
        out = [INVALID_PARAMS] * n
        pars = list(parallelisms) if isinstance(parallelisms, (list, tuple)) else [parallelisms] * n
        parts = list(writer_partitions) if isinstance(writer_partitions, (list, tuple)) else [writer_partitions] * n
        if len(pars) != n or len(parts) != n:
            return out
        for i in ok:
            out[i] = self._put_parallel([keys[i]], [tensors[i]], pars[i], config, parts[i], upsert)[0]
        return out

    def _read_parallel(self, key: str, target: Any) -> Any:
        """The tensor a :class:`ReadTarget` asks for, or None, as Mooncake
        answers: ``full`` without a layout puts writer partitions back
        together (or reads a tensor stored whole); ``full`` with one puts
        ``{key}_tp_{r}`` shards together; ``shard`` reads the stored shard
        of exactly that layout (a writer partition or a TP shard, whichever
        others are missing), else cuts it from the whole TP shards make,
        else (one rank) the tensor stored whole."""
        mode = str(getattr(target, "mode", "as_stored") if target is not None else "as_stored").lower()
        par = getattr(target, "parallelism", None) if target is not None else None
        if mode == "as_stored":
            return self._get_tensor(key)
        if mode not in ("full", "shard"):
            return None
        if mode == "full" and par is None:
            whole = self._gather_writers(key)
            return whole if whole is not None else self._get_tensor(key)
        try:
            rank, size, split = self._tp_axis(par)
        except _tensor.BadTensor:
            return None
        if mode == "full":
            return self._gather(key)
        direct = self._get_tensor(self._writer_key(key, rank, size, split))
        if direct is None:
            direct = self._stored_shard(key, rank, size, split)
        if direct is not None:
            return direct
        whole = self._gather(key)
        if whole is None:
            return self._get_tensor(key) if size == 1 else None
        if not 0 <= split < whole.dim() or whole.shape[split] % size:
            return None
        return whole.split(whole.shape[split] // size, dim=split)[rank].contiguous()

    def _gather(self, key: str) -> Any:
        """The whole tensor put together from its stored TP shards, or None."""
        torch = _tensor.torch_module()
        first = self._read_tensor(self._tp_key(key, 0))
        if first is None or first[1].axis is None:
            return None
        meta = first[1]
        _, size, split, _ = meta.axis
        shards = [first[0]]
        for r in range(1, size):
            got = self._read_tensor(self._tp_key(key, r))
            if got is None:
                return None
            t, m = got
            if m.axis is None or m.axis[1:3] != (size, split) or m.dtype != meta.dtype or m.full != meta.full:
                return None
            shards.append(t)
        whole = torch.cat(shards, dim=split) if shards[0].dim() else shards[0]
        return whole if tuple(whole.shape) == tuple(meta.full) else None

    def _stored_shard(self, key: str, rank: int, size: int, split: int) -> Any:
        """The TP shard ``{key}_tp_{rank}`` if it was stored for exactly
        this layout (its peers need not be there), else None."""
        got = self._read_tensor(self._tp_key(key, rank))
        if got is None or got[1].axis is None or got[1].axis[:3] != (rank, size, split):
            return None
        return got[0]

    def _gather_writers(self, key: str) -> Any:
        """The whole tensor put together from its writer partitions (as its
        manifest records them), or None while any is missing."""
        torch = _tensor.torch_module()
        c = self._client
        if c is None:
            return None
        try:
            dtype, full, split, size = _tensor.parse_writer_manifest(c.get(self._manifest_key(key)))
        except (KvpoolError, _tensor.BadTensor):
            return None
        parts = []
        for r in range(size):
            p = self._get_tensor(self._writer_key(key, r, size, split))
            if p is None or _tensor.dtype_code(p) != dtype:
                return None
            parts.append(p)
        whole = torch.cat(parts, dim=split)
        return whole if tuple(whole.shape) == full else None

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor ``target`` asks for: ``as_stored`` (default) the object
        under ``key``; ``full`` the whole tensor put together from its
        ``{key}_tp_{r}`` shards (with ``target.parallelism`` naming a TP
        axis; the object under ``key`` if there are no shards); ``shard``
        the ``parallelism``'s rank cut from the whole tensor. None when it
        cannot be had."""
        try:
            return self._read_parallel(key, target)
        except _tensor.BadTensor:
            return None

    def batch_get_tensor_with_parallelism(self, keys: List[str], targets: Any = None) -> List[Any]:
        """:meth:`get_tensor_with_parallelism` for many keys (one target per key, or one for all)."""
        ts = list(targets) if isinstance(targets, (list, tuple)) else [targets] * len(keys)
        if len(ts) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, ts)]

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        """:meth:`get_tensor_with_parallelism` written into a buffer as
        header + data; a tensor viewing the data there, or None."""
        t = self.get_tensor_with_parallelism(key, target)
        if t is None:
            return None
        try:
            t = _tensor.contiguous(t)
            head = _tensor.header(t)
        except _tensor.BadTensor:
            return None
        data = _tensor.data_view(t)
        total = len(head) + len(data)
        if int(buffer_ptr) <= 0 or int(size) < total:
            return None
        ctypes.memmove(int(buffer_ptr), head, len(head))
        if len(data):
            ctypes.memmove(int(buffer_ptr) + len(head), (ctypes.c_ubyte * len(data)).from_buffer_copy(data), len(data))
        arr = (ctypes.c_ubyte * total).from_address(int(buffer_ptr))
        return _tensor.from_buffer(arr, _tensor.parse(arr, total))

    def batch_get_tensor_with_parallelism_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                               targets: Any = None) -> List[Any]:
        """:meth:`get_tensor_with_parallelism_into` for many keys."""
        ts = list(targets) if isinstance(targets, (list, tuple)) else [targets] * len(keys)
        if not (len(keys) == len(buffer_ptrs) == len(sizes) == len(ts)):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, s, t) for k, p, s, t in zip(keys, buffer_ptrs, sizes, ts)]
