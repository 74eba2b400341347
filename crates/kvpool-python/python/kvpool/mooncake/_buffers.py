"""Memory the store is told about or hands out: the registered-buffer
bookkeeping (``register_buffer``, ``unregister_buffer``; ranged reads write
only inside registered regions) and the bump allocator over the memory pool
``setup_dummy`` makes (``alloc_from_mem_pool``)."""

from __future__ import annotations

from typing import List, Optional, Tuple

from .. import _native
from ..config import _index
from ..errors import KvpoolError
from ._codes import INVALID_PARAMS, OK


def _forget(registered: List[Tuple[int, int]]) -> None:
    """Ends the page-probe exemption of every region in ``registered``."""
    while registered:
        _native.note_unregistered(*registered.pop())


class _BuffersMixin:
    """Registered regions and the memory pool (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ registered memory

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers memory for zero-copy calls: 0, or −600 for a null or
        empty region or one that overlaps a registered region (Mooncake's
        rule). Ranged reads (``get_into_ranges``) write only inside
        registered regions; the other zero-copy calls take any memory.
        Registered memory must stay mapped until it is unregistered (as
        Mooncake requires): raw addresses inside it are used without the
        page probe that answers an unmapped address with −800.
        ``buffer_ptr`` and ``size`` are unsigned 64-bit ints: a negative,
        float or str raises TypeError, as Mooncake's binding does."""
        ptr = _index("register_buffer() buffer_ptr", buffer_ptr)
        size = _index("register_buffer() size", size)
        if self._client is None:
            return INVALID_PARAMS
        if ptr <= 0 or size <= 0:
            return INVALID_PARAMS
        with self._lock:
            if any(p < ptr + size and ptr < p + n for p, n in self._registered):
                return INVALID_PARAMS
            try:
                _native.note_registered(ptr, size)
            except KvpoolError:  # wraps around the address space
                return INVALID_PARAMS
            self._registered.append((ptr, size))
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """0, or −600 if ``buffer_ptr`` does not start a registered region;
        TypeError for an address that is not an unsigned 64-bit int."""
        ptr = _index("unregister_buffer() buffer_ptr", buffer_ptr)
        if self._client is None:
            return INVALID_PARAMS
        with self._lock:
            for i, (p, n) in enumerate(self._registered):
                if p == ptr:
                    del self._registered[i]
                    _native.note_unregistered(p, n)
                    return OK
        return INVALID_PARAMS

    def _registered_end(self, ptr: int) -> Optional[int]:
        """The end of the registered region holding address ``ptr``, if any."""
        with self._lock:
            for p, n in self._registered:
                if p <= ptr < p + n:
                    return p + n
        return None

    # ------------------------------------------------------------ memory pool (made by setup_dummy)

    def alloc_from_mem_pool(self, size: int) -> int:
        """``size`` bytes (64-byte aligned) of the memory pool
        :meth:`setup_dummy` made; their address, or 0 when the pool is
        exhausted or there is none."""
        size = int(size)
        with self._lock:
            base, total, used = self._pool
            start = (used + 63) & ~63
            if not base or size <= 0 or start + size > total:
                return 0
            self._pool = (base, total, start + size)
            return base + start
