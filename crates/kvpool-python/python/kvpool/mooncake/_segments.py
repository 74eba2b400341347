"""Segments this process lends beyond setup's: mounting memory or a file
region as a new segment, unmounting (after a grace period), and the SSD
offload calls kvpool answers without an offload tier."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

from ..client import _track_lender
from ..errors import KvpoolError
from ..mooncake_types import segment_id_hex, segment_id_text
from ._codes import INTERNAL_ERROR, INVALID_PARAMS, NOT_SUPPORTED, OK, logger


class _SegmentsMixin:
    """Mounting and unmounting segments (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ segments

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> Dict[str, Any]:
        """Lends ``size`` more bytes of this process's memory as a new
        segment: ``{"ret": 0, "segment_ids": [id], "allocated_size": size}``
        or ``{"ret": code, "segment_ids": [], "allocated_size": 0}``.
        ``location`` (a NUMA hint) is accepted and not used."""
        rc, ids = self._mount(int(size), None, 0, protocol)
        return {"ret": rc, "segment_ids": ids, "allocated_size": int(size) if rc == OK else 0}

    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = "") -> Dict[str, Any]:
        """Lends ``size`` bytes at ``offset`` (page-aligned) of the file at
        ``path`` as a new segment, served by this process over TCP:
        ``{"ret": 0, "segment_ids": [id]}`` or ``{"ret": code, "segment_ids": []}``."""
        rc, ids = self._mount(int(size), str(path), int(offset), protocol)
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
        with no other replica go with them. 0, or −1 for an id it does not
        lend (Mooncake's answer)."""
        c = self._client
        if c is None:
            return INVALID_PARAMS
        mine = {s["id"]: s for s in c.lent_segments()}
        hexes = [segment_id_hex(s) for s in segment_ids]
        if not hexes or any(h is None or h not in mine for h in hexes):
            return INTERNAL_ERROR

        def run() -> None:
            for h in hexes:
                try:
                    c.unmount_segment(h)
                except KvpoolError as e:
                    logger.warning("unmount of segment %s failed: %s", h, e)

        if int(grace_period_seconds) > 0:
            t = threading.Timer(int(grace_period_seconds), run)
            t.daemon = True
            t.start()
        else:
            run()
        return OK

    def unmount_and_free_segment(self, segment_ids: List[str], grace_period_seconds: int = 0) -> int:
        """:meth:`unmount_segment`; the memory is given back as the segment goes."""
        return self.unmount_segment(segment_ids, grace_period_seconds)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """−1012: kvpool has no local-disk (SSD offload) segments."""
        return NOT_SUPPORTED

    def get_offload_rpc_read_count(self) -> int:
        """Reads served by the SSD-offload RPC: 0, as kvpool has no offload tier."""
        return 0
