"""Zero-copy puts and gets between the pool and caller memory given by
address: ``put_from``, ``get_into``, their batch and multi-buffer forms, the
metadata-prefixed put, and the ranged read ``get_into_ranges``."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ..config import ReplicateConfig
from ..errors import KvpoolError
from ._codes import INVALID_PARAMS, OBJECT_NOT_FOUND, OK, TRANSFER_FAIL


class _ZeroCopyMixin:
    """Zero-copy and ranged reads (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ zero-copy

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """Stores ``size`` bytes at address ``buffer_ptr``; a size of 0
        stores nothing and returns 0, as Mooncake."""
        return self._put_from(key, buffer_ptr, size, config, False)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """``put_from`` that replaces an existing value."""
        return self._put_from(key, buffer_ptr, size, config, True)

    def _put_from(self, key: str, ptr: int, size: int, config: Any, upsert: bool) -> int:
        c = self._client
        if c is None or not key or int(size) < 0:
            return INVALID_PARAMS
        bad, cfg = self._config(config)
        if bad is not None:
            return bad
        if int(size) == 0:
            return OK
        return self._rc(c.put, key, ptr, size, cfg, upsert)

    def put_from_with_metadata(
        self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int, metadata_size: int,
        config: Optional[ReplicateConfig] = None,
    ) -> int:
        """Stores ``metadata_size`` bytes at ``metadata_buffer_ptr`` followed
        by ``size`` bytes at ``buffer_ptr`` as one object (Mooncake's layout)."""
        c = self._client
        if c is None or not key or int(size) < 0 or int(metadata_size) < 0:
            return INVALID_PARAMS
        bad, cfg = self._config(config)
        if bad is not None:
            return bad
        ptrs, sizes = [], []
        for p, n in ((metadata_buffer_ptr, metadata_size), (buffer_ptr, size)):
            if int(n) > 0:
                ptrs.append(p)
                sizes.append(int(n))
        if not ptrs:
            return OK
        try:
            return c.batch_put([key], [ptrs], [sizes], cfg, False)[0]
        except KvpoolError as e:
            return e.code

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads into ``size`` bytes at ``buffer_ptr``: bytes read, or negative
        (−600 if the buffer is too small, −704 if missing)."""
        if not key:
            return OBJECT_NOT_FOUND if self._client is not None else INVALID_PARAMS
        return self._int(lambda c: c.get_into(key, buffer_ptr, size))

    def batch_put_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        """Per key: 0 or a negative code (−200 when the pool is full). A key
        given twice keeps its last value, as in Mooncake."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, False, keep_last=True)

    def batch_upsert_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        """``batch_put_from`` that replaces existing values."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, True, keep_last=True)

    def batch_put_from_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        config: Optional[ReplicateConfig] = None,
    ) -> List[int]:
        """Each object is the concatenation of its buffers; per key 0 or
        negative (a repeated key keeps its first value, as in Mooncake)."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._batch_put_from(
            keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes], config, False, keep_last=False,
            same_node=True,
        )

    def _batch_put_from(
        self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any], config: Any, upsert: bool, keep_last: bool,
        same_node: bool = False,
    ) -> List[int]:
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        bad, cfg = self._config(config, len(keys), same_node)
        if bad is not None:
            return [bad] * len(keys)
        out = [INVALID_PARAMS] * len(keys)
        send, source = self._dedupe(keys, keep_last)

        def total(s: Any) -> int:
            return sum(s) if isinstance(s, (list, tuple)) else int(s)

        send = [i for i in send if keys[i] and total(sizes[i]) > 0]
        if send:
            try:
                codes = c.batch_put([keys[i] for i in send], [ptrs[i] for i in send], [sizes[i] for i in send], cfg, upsert)
            except KvpoolError as e:
                codes = [e.code] * len(send)
            got = dict(zip(send, codes))
            out = [got.get(source[i], INVALID_PARAMS) if keys[i] else INVALID_PARAMS for i in range(len(keys))]
            # A repeated key whose own size was bad keeps its own answer.
            out = [out[i] if total(sizes[i]) > 0 else INVALID_PARAMS for i in range(len(keys))]
        return out

    def batch_get_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """Per key: bytes read, or negative (≤ 0 is a miss for LMCache).
        Destinations that share bytes are all filled, one after another in
        batch order (where they overlap, the later key's bytes stay)."""
        return self._batch_get_into(keys, buffer_ptrs, sizes)

    def batch_get_into_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> List[int]:
        """Each object fills its buffers in order; per key bytes read or
        negative. The buffers must add up to the object's size exactly, as in
        Mooncake: buffers too small are −600, an object shorter than its
        buffers is −800 (TRANSFER_FAIL), never a short count that reads as
        success (vLLM's Mooncake store connector takes any count ≥ 0 as a
        loaded block; the buffers' bytes are then not the object's)."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        sizes = [list(s) for s in all_sizes]
        got = self._batch_get_into(keys, [list(p) for p in all_buffer_ptrs], sizes)
        # Checked on the count the read returns (the object's size at read
        # time), not on a size asked for earlier, which a replacement could
        # change in between; a buffer touched by a failed read is not valid.
        return [TRANSFER_FAIL if 0 <= rc != sum(int(n) for n in want) else rc for rc, want in zip(got, sizes)]

    def _batch_get_into(self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any]) -> List[int]:
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n:
            return self._ints(n, lambda c: [INVALID_PARAMS] * n)
        if self._client is not None and any(not k for k in keys):
            idx = [i for i, k in enumerate(keys) if k]
            got = self._ints(len(idx), lambda c: c.batch_get_into([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx]))
            out = [OBJECT_NOT_FOUND] * n
            for i, rc in zip(idx, got):
                out[i] = rc
            return out
        return self._ints(n, lambda c: c.batch_get_into(list(keys), list(ptrs), list(sizes)))

    def get_into_ranges(
        self,
        buffer_ptrs: List[int],
        all_keys: List[List[str]],
        all_dst_offsets: List[List[List[int]]],
        all_src_offsets: List[List[List[int]]],
        all_sizes: List[List[List[int]]],
    ) -> List[List[List[int]]]:
        """For buffer ``i`` and its key ``j``, copies each range
        ``all_src_offsets[i][j][k]`` (length ``all_sizes[i][j][k]``) of the
        object to ``buffer_ptrs[i] + all_dst_offsets[i][j][k]``. Results per
        buffer, per key, per range: bytes copied or a negative code. A key
        whose lists disagree in length, a range past the object's end or past
        the end of the registered buffer it writes to (``register_buffer``),
        and any range of an unregistered buffer get −600 and write nothing; a
        missing key gets −704; the other keys and ranges are still served."""
        c = self._client
        nb = len(buffer_ptrs)

        def fail(i: int, code: int) -> List[List[int]]:
            keys = all_keys[i] if i < len(all_keys) else [None]
            dsts = all_dst_offsets[i] if i < len(all_dst_offsets) else []
            return [[code] * max(1, len(dsts[j]) if j < len(dsts) else 1) for j in range(len(keys))]

        if c is None:
            return [fail(i, INVALID_PARAMS) for i in range(nb)]
        if not (len(all_keys) == nb == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes)):
            return [fail(i, INVALID_PARAMS) for i in range(nb)]
        out: List[List[List[int]]] = []
        flat_keys: List[str] = []
        flat_ranges: List[List[Tuple[int, int, int]]] = []
        slots: List[Tuple[int, int, List[int]]] = []  # (buffer, key, range positions sent)
        for i, base in enumerate(buffer_ptrs):
            keys, dsts, srcs, lens = all_keys[i], all_dst_offsets[i], all_src_offsets[i], all_sizes[i]
            if not (len(keys) == len(dsts) == len(srcs) == len(lens)):
                out.append(fail(i, INVALID_PARAMS))
                continue
            end = self._registered_end(int(base))
            per_buffer: List[List[int]] = []
            for j, key in enumerate(keys):
                d, s, n = dsts[j], srcs[j], lens[j]
                if not (len(d) == len(s) == len(n)):
                    per_buffer.append([INVALID_PARAMS] * max(1, len(d)))
                    continue
                res = [INVALID_PARAMS] * len(d)
                sent_ranges: List[Tuple[int, int, int]] = []
                sent_pos: List[int] = []
                for k, (dd, ss, nn) in enumerate(zip(d, s, n)):
                    dd, ss, nn = int(dd), int(ss), int(nn)
                    if min(dd, ss, nn) < 0:
                        raise TypeError("offsets and sizes must be non-negative ints")
                    if end is None or int(base) + dd + nn > end:
                        continue
                    if nn == 0:
                        res[k] = 0
                        continue
                    sent_ranges.append((int(base) + dd, ss, nn))
                    sent_pos.append(k)
                per_buffer.append(res)
                if sent_ranges:
                    flat_keys.append(key)
                    flat_ranges.append(sent_ranges)
                    slots.append((len(out), j, sent_pos))
            out.append(per_buffer)
        if flat_keys:
            try:
                got = c.read_ranges(flat_keys, flat_ranges)
            except KvpoolError as e:
                got = [[e.code] * len(r) for r in flat_ranges]
            for (i, j, pos), codes in zip(slots, got):
                if any(cd == OBJECT_NOT_FOUND for cd in codes):
                    out[i][j] = [OBJECT_NOT_FOUND] * len(out[i][j])
                    continue
                for k, cd in zip(pos, codes):
                    out[i][j][k] = cd
        return out
