"""Put and get sessions: objects reserved, filled by ranges and published
(``batch_put_session_*``, ``batch_put_from_multi_buffer_ranges``), and keys
located once for ranged reads (``batch_get_session_*``,
``batch_get_into_multi_buffer_ranges``)."""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Tuple

from ..config import ReplicateConfig
from ..errors import KvpoolError
from ._codes import INVALID_PARAMS, OBJECT_ALREADY_EXISTS, OBJECT_NOT_FOUND, OK


#: Bytes of objects all get sessions of a store keep after their first
#: ranged read. Further ranges of a kept object (SGLang's Mooncake linker
#: reads one layer of every object per call) are copied from memory: kvpool
#: checks checksums over whole objects, so each ranged read of the pool
#: moves the whole object. Objects past this bound are read per call.
SESSION_KEEP_BYTES = 1 << 30


class _PutSession:
    """An object reserved by ``batch_put_session_start``, filled by ranges."""

    def __init__(self, size: int, config: Any) -> None:
        self.data = bytearray(size)
        self.config = config
        self.addr = ctypes.addressof((ctypes.c_char * size).from_buffer(self.data)) if size else 0


class _SessionsMixin:
    """Put and get sessions (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ sessions

    def batch_put_session_start(self, keys: List[str], sizes: List[int], config: Optional[ReplicateConfig] = None) -> List[int]:
        """Reserves objects of ``sizes`` bytes to fill with
        :meth:`batch_put_from_multi_buffer_ranges` and publish with
        :meth:`batch_put_session_end`. Per key: 0, −705 if the key exists,
        −600 for an empty key, a size ≤ 0 or a session already open."""
        c = self._client
        if c is None or len(keys) != len(sizes):
            return [INVALID_PARAMS] * len(keys)
        bad, cfg = self._config(config, len(keys))
        if bad is not None:
            return [bad] * len(keys)
        ask = [k for k in keys if k]
        try:
            exists = dict(zip(ask, c.batch_exists(ask))) if ask else {}
        except KvpoolError as e:
            return [e.code] * len(keys)
        out = []
        with self._lock:
            for k, n in zip(keys, sizes):
                if not k or int(n) <= 0 or k in self._put_sessions:
                    out.append(INVALID_PARAMS)
                elif exists.get(k) == 1:
                    out.append(OBJECT_ALREADY_EXISTS)
                elif exists.get(k, 0) < 0:
                    out.append(exists[k])
                else:
                    self._put_sessions[k] = _PutSession(int(n), cfg)
                    out.append(OK)
        return out

    def batch_put_from_multi_buffer_ranges(
        self, keys: List[str], all_buffer_ptrs: List[List[int]], all_sizes: List[List[int]], all_dst_offsets: List[List[int]]
    ) -> List[int]:
        """Copies each buffer ``all_buffer_ptrs[i][k]`` (``all_sizes[i][k]``
        bytes) into session object ``keys[i]`` at ``all_dst_offsets[i][k]``.
        Per key: bytes copied, or −600 (no session, lists that disagree, a
        range past the object's reserved size)."""
        n = len(keys)
        if self._client is None or not (len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets) == n):
            return [INVALID_PARAMS] * n
        out = []
        with self._lock:
            for k, ptrs, lens, offs in zip(keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
                sess = self._put_sessions.get(k)
                if sess is None or not (len(ptrs) == len(lens) == len(offs)):
                    out.append(INVALID_PARAMS)
                    continue
                if any(int(o) < 0 or int(m) < 0 or int(o) + int(m) > len(sess.data) for o, m in zip(offs, lens)):
                    out.append(INVALID_PARAMS)
                    continue
                copied = 0
                for p, m, o in zip(ptrs, lens, offs):
                    if int(m):
                        ctypes.memmove(sess.addr + int(o), int(p), int(m))
                        copied += int(m)
                out.append(copied)
        return out

    def batch_put_session_end(self, keys: List[str]) -> List[int]:
        """Publishes session objects (bytes never written are zero); per key 0
        or negative (−600 without a session)."""
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        with self._lock:
            sessions = {k: self._put_sessions.pop(k) for k in dict.fromkeys(keys) if k in self._put_sessions}
        out = {k: INVALID_PARAMS for k in keys}
        by_cfg: Dict[int, List[str]] = {}
        for k, s in sessions.items():
            by_cfg.setdefault(id(s.config), []).append(k)
        for ks in by_cfg.values():
            cfg = sessions[ks[0]].config
            try:
                codes = c.batch_put(ks, [sessions[k].data for k in ks], None, cfg, False)
            except KvpoolError as e:
                codes = [e.code] * len(ks)
            out.update(zip(ks, codes))
        return [out[k] for k in keys]

    def batch_put_session_revoke(self, keys: List[str]) -> List[int]:
        """Abandons session objects; per key 0, or −600 without a session."""
        if self._client is None:
            return [INVALID_PARAMS] * len(keys)
        with self._lock:
            return [OK if self._put_sessions.pop(k, None) is not None else INVALID_PARAMS for k in keys]

    def batch_get_session_start(self, keys: List[str]) -> List[int]:
        """Locates objects once (taking their read leases) for ranged reads
        with :meth:`batch_get_into_multi_buffer_ranges`; per key 0 or −704."""
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        codes = self._ints(len(keys), lambda c: c.batch_exists(list(keys), True))
        out = []
        with self._lock:
            for k, rc in zip(keys, codes):
                if rc == 1:
                    self._get_sessions.setdefault(k, None)
                    out.append(OK)
                else:
                    out.append(OBJECT_NOT_FOUND if rc == 0 else rc)
        return out

    def batch_get_session_end(self, keys: List[str]) -> int:
        """Ends get sessions; 0."""
        if self._client is None:
            return INVALID_PARAMS
        with self._lock:
            for k in keys:
                self._get_sessions.pop(k, None)
        return OK

    def batch_get_into_multi_buffer_ranges(
        self, keys: List[str], all_buffer_ptrs: List[List[int]], all_sizes: List[List[int]], all_src_offsets: List[List[int]]
    ) -> List[int]:
        """For each key in a get session, copies ``all_sizes[i][k]`` bytes at
        ``all_src_offsets[i][k]`` of the object into ``all_buffer_ptrs[i][k]``.
        Per key: bytes copied, or negative (−600 without a session, for lists
        that disagree or a range past the object's end)."""
        c = self._client
        n = len(keys)
        if c is None or not (len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets) == n):
            return [INVALID_PARAMS] * n
        out = [INVALID_PARAMS] * n
        ask: List[int] = []
        ranges: List[List[Tuple[int, int, int]]] = []
        with self._lock:
            open_ = set(self._get_sessions)
        for i, (k, ptrs, lens, srcs) in enumerate(zip(keys, all_buffer_ptrs, all_sizes, all_src_offsets)):
            if k not in open_ or not (len(ptrs) == len(lens) == len(srcs)):
                continue
            rs = [(int(p), int(s), int(m)) for p, m, s in zip(ptrs, lens, srcs) if int(m) > 0]
            if not rs:
                out[i] = 0
                continue
            ask.append(i)
            ranges.append(rs)
        if not ask:
            return out
        values = self._session_values(c, [keys[i] for i in ask])
        read: List[Tuple[int, List[Tuple[int, int, int]]]] = []
        for i, rs in zip(ask, ranges):
            value = values.get(keys[i])
            if value is None:
                read.append((i, rs))
            else:
                out[i] = _total([_copy_range(value, *r) for r in rs])
        if read:
            try:
                got = c.read_ranges([keys[i] for i, _ in read], [rs for _, rs in read])
            except KvpoolError as e:
                got = [[e.code] * len(rs) for _, rs in read]
            for (i, _), codes in zip(read, got):
                out[i] = _total(codes)
        return out

    def _session_values(self, c: Any, keys: List[str]) -> Dict[str, Any]:
        """The values of ``keys`` (of open get sessions) for one ranged
        call: those kept, and the others read whole now, which the sessions
        keep while their bound allows. With the bound reached nothing is read
        here, and a key missing from the answer is read per call."""
        with self._lock:
            held = {k: self._get_sessions.get(k) for k in keys}
            room = SESSION_KEEP_BYTES - sum(v.size() for v in self._get_sessions.values() if v is not None)
        want = sorted({k for k, v in held.items() if v is None})
        if want and room > 0:
            try:
                got = c.batch_get_buffer(want)
            except KvpoolError:
                got = []
            with self._lock:
                for k, v in zip(want, got):
                    if isinstance(v, int):
                        continue  # read per call, which answers its code
                    held[k] = v
                    # Kept only while the session is open and within the bound.
                    if k in self._get_sessions and v.size() <= room:
                        room -= v.size()
                        self._get_sessions[k] = v
        return {k: v for k, v in held.items() if v is not None}


def _total(codes: List[int]) -> int:
    """A key's answer from its ranges' answers: the bytes copied, or the first error."""
    bad = [cd for cd in codes if cd < 0]
    return bad[0] if bad else sum(codes)


def _copy_range(value: Any, dst: int, off: int, size: int) -> int:
    """Copies ``size`` bytes at ``off`` of a kept value to ``dst``: ``size``,
    or −600 past the value's end."""
    if off < 0 or off + size > value.size():
        return INVALID_PARAMS
    ctypes.memmove(dst, value.ptr() + off, size)
    return size
