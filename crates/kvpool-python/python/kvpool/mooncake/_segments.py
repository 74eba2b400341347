"""Segments this process lends beyond setup's: mounting memory or a file
region as a new segment, unmounting (after a grace period), and the SSD
offload calls kvpool answers without an offload tier, as Mooncake answers
them with none mounted."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from ..client import _track_lender
from ..config import _index
from ..errors import KvpoolError
from ..mooncake_types import segment_id_hex, segment_id_text
from ._codes import INTERNAL_ERROR, INVALID_PARAMS, OK, logger

#: ``allocate_and_mount_segment`` rounds sizes up to a multiple of this (Mooncake's unit).
_ALLOC_UNIT = 16 << 20
_PAGE = 4096


def _openable(path: str, offset: int) -> bool:
    """Whether ``path`` is a file Mooncake would mount (opens for reading and
    writing) at ``offset`` (page-aligned)."""
    if offset % _PAGE:
        return False
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


class _SegmentsMixin:
    """Mounting and unmounting segments (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ segments

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> Dict[str, Any]:
        """Lends ``size`` more bytes of this process's memory, rounded up to
        a multiple of 16 MiB as Mooncake rounds it, as a new segment:
        ``{"ret": 0, "segment_ids": [id], "allocated_size": rounded}`` or
        ``{"ret": code, "segment_ids": [], "allocated_size": 0}`` (−1 for a
        size of 0, Mooncake's answer). A negative size raises TypeError.
        ``location`` (a NUMA hint) is accepted and not used."""
        size = _index("allocate_and_mount_segment() size", size)
        if self._client is not None and size == 0:
            return {"ret": INTERNAL_ERROR, "segment_ids": [], "allocated_size": 0}
        size = -(-size // _ALLOC_UNIT) * _ALLOC_UNIT
        rc, ids = self._mount(size, None, 0, protocol)
        return {"ret": rc, "segment_ids": ids, "allocated_size": size if rc == OK else 0}

    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = "") -> Dict[str, Any]:
        """Lends ``size`` bytes at ``offset`` (page-aligned) of the file at
        ``path`` as a new segment, served by this process over TCP:
        ``{"ret": 0, "segment_ids": [id]}`` or ``{"ret": code, "segment_ids": []}``.
        A ``size`` of 0 mounts nothing and answers
        ``{"ret": 0, "segment_ids": []}`` when ``path`` is a file this
        process can open for writing at a page-aligned ``offset``, else −1
        (Mooncake's answers). Negative sizes or offsets raise TypeError."""
        size = _index("mount_segment() size", size)
        offset = _index("mount_segment() offset", offset)
        if size == 0 and self._client is not None:
            return {"ret": OK if _openable(str(path), offset) else INTERNAL_ERROR, "segment_ids": []}
        rc, ids = self._mount(size, str(path), offset, protocol)
        return {"ret": rc, "segment_ids": ids}

    def _mount(self, size: int, path: Optional[str], offset: int, protocol: str) -> Tuple[int, List[str]]:
        c = self._client
        if c is None or size <= 0 or offset < 0:
            return INVALID_PARAMS, []
        if str(protocol).lower() not in ("tcp", "rdma", "shm", "auto", ""):
            return INVALID_PARAMS, []
        try:
            info = c.mount_segment(size, path, offset)
        except KvpoolError as e:
            return e.code, []
        _track_lender(c)
        return OK, [segment_id_text(info["id"])]

    def unmount_segment(self, segment_ids: List[str], grace_period_seconds: int = 0) -> int:
        """Takes back segments this process lends (ids as mount calls gave
        them), after ``grace_period_seconds`` (in the background); objects
        with no other replica go with them. 0 (also for no ids), or −1 for
        an id it does not lend (Mooncake's answers). A ``segment_ids`` that
        is not a list of ids, or a negative grace period, raises TypeError."""
        if isinstance(segment_ids, (str, bytes)):
            raise TypeError("unmount_segment(): incompatible function arguments: segment_ids must be a list of str")
        segment_ids = list(segment_ids)
        grace = _index("unmount_segment() grace_period_seconds", grace_period_seconds)
        c = self._client
        if c is None:
            return INVALID_PARAMS
        if not segment_ids:
            return OK
        mine = {s["id"]: s for s in c.lent_segments()}
        hexes = [segment_id_hex(s) for s in segment_ids]
        if any(h is None or h not in mine for h in hexes):
            return INTERNAL_ERROR

        def run() -> None:
            for h in hexes:
                try:
                    c.unmount_segment(h)
                except KvpoolError as e:
                    logger.warning("unmount of segment %s failed: %s", h, e)

        if grace > 0:
            t = threading.Timer(grace, run)
            t.daemon = True
            t.start()
        else:
            run()
        return OK

    def unmount_and_free_segment(self, segment_ids: List[str], grace_period_seconds: int = 0) -> int:
        """:meth:`unmount_segment`; the memory is given back as the segment goes."""
        return self.unmount_segment(segment_ids, grace_period_seconds)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """0: there is no local-disk (SSD offload) segment to unmount (kvpool
        has none), and Mooncake answers 0 when none is mounted. A negative
        grace period raises TypeError."""
        _index("unmount_local_disk_segment() grace_period_seconds", grace_period_seconds)
        return OK

    def get_offload_rpc_read_count(self) -> int:
        """Reads served by the SSD-offload RPC: 0, as kvpool has no offload tier."""
        return 0
