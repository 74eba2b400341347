"""``kvpool.Client``: the Pythonic API (exceptions, ``bytes``, buffers).

Memory arguments (``value``, ``dst``, ...) accept any object with the buffer
protocol (``bytes``, ``bytearray``, ``memoryview``, numpy arrays, ``mmap``),
a contiguous CPU tensor (torch: anything with ``data_ptr()``), or an ``int``
address together with a ``size``. Reads into caller memory need writable
memory. Nothing is copied on the way in or out of caller memory.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _native
from .config import ReplicateConfig
from .errors import BatchError, NotFound, NotSupported, error_for

__all__ = ["Client", "Buffer"]

Buffer = _native.Buffer
"""Bytes read from the pool: buffer protocol (writable), ``ptr()``, ``size()``, ``len()``."""

Memory = Any  # buffer-protocol object, CPU tensor, or int address (with a size)

_NOT_FOUND = NotFound.code

# Native clients that lend memory, closed at interpreter exit so their
# segment leaves the pool at once instead of after the master's client TTL.
_lenders: "weakref.WeakSet[_native.Client]" = weakref.WeakSet()
_lenders_lock = threading.Lock()


def _track(native: "_native.Client") -> None:
    """Remembers a lending client for the exit hook."""
    if native.lent_bytes > 0:
        with _lenders_lock:
            _lenders.add(native)


@atexit.register
def _close_lenders() -> None:
    with _lenders_lock:
        lenders = list(_lenders)
    for c in lenders:
        if c.lent_bytes > 0 or c.lent_segments():  # none in a forked child: the segments are the parent's
            try:
                c.close()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


def _connect(s: Dict[str, Any]) -> "_native.Client":
    """A native client from resolved settings (``_native.resolve_settings``),
    registered for the exit hook if it lends memory."""
    native = _native.Client(s)
    _track(native)
    return native


def _track_lender(native: "_native.Client") -> None:
    """Remembers a client that lends memory mounted after it connected."""
    with _lenders_lock:
        _lenders.add(native)


def _batch_check(results: List[Any], codes: Sequence[int], ok_missing: bool, what: str) -> None:
    """Raises BatchError if any key failed (a miss is not a failure when ``ok_missing``)."""
    failed = [(i, c) for i, c in enumerate(codes) if c < 0 and not (ok_missing and c == _NOT_FOUND)]
    if not failed:
        return
    for i, c in failed:
        results[i] = error_for(c, f"{what}: key #{i} failed")
    first = failed[0][1]
    raise BatchError(f"{what}: {len(failed)} of {len(codes)} keys failed", first, results)


def _batch_values(raw: List[Any], what: str) -> List[Any]:
    """A native batch read's values (an int code per failed key) with ``None``
    for misses; raises :class:`BatchError` if any key failed otherwise."""
    out: List[Any] = [None if isinstance(v, int) else v for v in raw]
    _batch_check(out, [v if isinstance(v, int) else 0 for v in raw], True, what)
    return out


class Client:
    """A connection to a kvpool cluster.

    ``master`` is ``"host:port"`` (default: ``KVPOOL_MASTER``, then
    ``MOONCAKE_MASTER``, then ``127.0.0.1:50051``; ``etcd://...`` follows the
    HA leader). With ``segment_size`` > 0
    (bytes or ``"4GiB"``) this process also lends that much memory to the
    pool until :meth:`close`. ``secret_file`` names a key of a cluster that
    requires one (default: ``KVPOOL_SECRET_FILE``, then ``KVPOOL_SECRET``).
    ``tls_ca`` (default ``KVPOOL_TLS_CA``) turns TLS on, verifying the pool
    against that CA bundle; ``tls_cert``/``tls_key`` (``KVPOOL_TLS_CERT``,
    ``KVPOOL_TLS_KEY``) add a client certificate, which lending memory over
    TLS needs. ``fail_fast_after`` (seconds; default ``KVPOOL_FAIL_FAST_AFTER``,
    else off): once the master has not answered for that long, calls that
    need it fail at once instead of waiting out their retries.
    Safe to share between threads; every call
    releases the GIL while it waits. After ``os.fork()`` the child reconnects
    on first use as a pure client (the segment stays the parent's).
    """

    def __init__(
        self,
        master: Optional[str] = None,
        *,
        hostname: Optional[str] = None,
        segment_size: Union[int, str] = 0,
        segment_address: Optional[str] = None,
        timeout: Optional[float] = None,
        retries: Optional[int] = None,
        fail_fast_after: Optional[float] = None,
        conns_per_store: Optional[int] = None,
        protocol: Optional[str] = None,
        location_cache: Optional[int] = None,
        secret_file: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
    ) -> None:
        s = _native.resolve_settings(
            {
                "master_server_addr": master,
                "local_hostname": hostname,
                "global_segment_size": segment_size,
                "segment_address": segment_address,
                "timeout": timeout,
                "retries": retries,
                "fail_fast_after": fail_fast_after,
                "conns_per_store": conns_per_store,
                "protocol": protocol,
                "location_cache": location_cache,
                "secret_file": secret_file,
                "tls_ca": tls_ca,
                "tls_cert": tls_cert,
                "tls_key": tls_key,
            }
        )
        if any(n.startswith("protocol rdma") for n in s["notes"]):
            # The Mooncake drop-in runs rdma over tcp, as Mooncake does
            # without devices; kvpool's own API says what it lacks.
            raise NotSupported("kvpool has no RDMA transport; use protocol tcp, shm or auto")
        self._native = _connect(s)

    # ------------------------------------------------------------ lifecycle

    @property
    def master(self) -> str:
        """The master address in use."""
        return self._native.master

    @property
    def hostname(self) -> str:
        """This client's name (also the name of the segment it lends)."""
        return self._native.hostname

    @property
    def lent_bytes(self) -> int:
        """Bytes this process lends to the pool through this client."""
        return self._native.lent_bytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    def close(self) -> None:
        """Withdraws the lent segment and disconnects; later calls raise ``Unavailable``."""
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"lending {self.lent_bytes} bytes" if self.lent_bytes else "pure client"
        return f"<kvpool.Client master={self.master!r} hostname={self.hostname!r} {state}>"

    def ping(self, timeout: float = 2.0) -> bool:
        """Whether the master answers within ``timeout`` seconds."""
        return self._native.ping(timeout)

    def status(self) -> Dict[str, Any]:
        """The cluster as the master sees it: segments, capacity, used, keys, ..."""
        return self._native.status()

    def get_metrics(self) -> Dict[str, float]:
        """This client's counters by Prometheus series name, e.g.
        ``kvpool_client_keys_total{op="get",result="ok"}``: keys per operation
        and result, errors by code, value bytes, bytes per transport (``tcp``,
        ``shm``) and call latency (docs/operations.md, Metrics)."""
        return self._native.get_metrics()

    def metrics_text(self) -> str:
        """The same counters as Prometheus text, to serve from an engine's ``/metrics``."""
        return self._native.metrics_text()

    # ------------------------------------------------------------ writes

    def put(self, key: str, value: Memory, *, size: Optional[int] = None, config: Optional[ReplicateConfig] = None) -> None:
        """Stores ``value`` under ``key``; an existing key is kept (write-once, no error)."""
        self._native.put(key, value, size, config, False)

    def upsert(self, key: str, value: Memory, *, size: Optional[int] = None, config: Optional[ReplicateConfig] = None) -> None:
        """Stores ``value`` under ``key``, replacing any existing value."""
        self._native.put(key, value, size, config, True)

    put_from = put
    upsert_from = upsert

    def put_parts(self, key: str, *parts: Memory, config: Optional[ReplicateConfig] = None, upsert: bool = False) -> None:
        """Stores the concatenation of ``parts`` as one object."""
        self._native.put_parts(key, list(parts), config, upsert)

    def batch_put(
        self,
        keys: Sequence[str],
        values: Sequence[Any],
        *,
        sizes: Optional[Sequence[Any]] = None,
        config: Optional[ReplicateConfig] = None,
        upsert: bool = False,
    ) -> None:
        """Stores many objects (``values[i]`` may be a list of parts). Raises
        :class:`BatchError` naming the failed keys; the others are stored."""
        codes = self._native.batch_put(list(keys), list(values), sizes, config, upsert)
        _batch_check([None] * len(codes), codes, False, "batch_put")

    def batch_upsert(
        self,
        keys: Sequence[str],
        values: Sequence[Any],
        *,
        sizes: Optional[Sequence[Any]] = None,
        config: Optional[ReplicateConfig] = None,
    ) -> None:
        """:meth:`batch_put` that replaces existing values."""
        self.batch_put(keys, values, sizes=sizes, config=config, upsert=True)

    # ------------------------------------------------------------ reads

    def get(self, key: str) -> bytes:
        """The value of ``key``; raises :class:`NotFound` if it does not exist."""
        return self._native.get(key)

    def get_buffer(self, key: str) -> Buffer:
        """The value of ``key`` as a :class:`Buffer` (``memoryview(b)``, ``numpy.frombuffer(b)``)."""
        return self._native.get_buffer(key)

    def get_into(self, key: str, dst: Memory, size: Optional[int] = None) -> int:
        """Reads ``key`` into writable memory ``dst``; returns the value's length.
        Raises :class:`InvalidArgument` if ``dst`` is too small."""
        return self._native.get_into(key, dst, size)

    def batch_get(self, keys: Sequence[str]) -> List[Optional[bytes]]:
        """Values of many keys (``None`` where a key does not exist)."""
        return _batch_values(self._native.batch_get(list(keys)), "batch_get")

    def batch_get_buffer(self, keys: Sequence[str]) -> List[Optional[Buffer]]:
        """Values of many keys as :class:`Buffer` (``None`` where missing)."""
        return _batch_values(self._native.batch_get_buffer(list(keys)), "batch_get_buffer")

    def batch_get_into(self, keys: Sequence[str], dsts: Sequence[Any], *, sizes: Optional[Sequence[Any]] = None) -> List[Optional[int]]:
        """Reads many keys into caller memory (``dsts[i]`` may be a list of
        buffers, filled in order); per key the bytes read, or ``None`` if missing."""
        codes = self._native.batch_get_into(list(keys), list(dsts), sizes)
        out: List[Any] = [None if c == _NOT_FOUND else c for c in codes]
        _batch_check(out, codes, True, "batch_get_into")
        return out

    # ------------------------------------------------------------ queries and removal

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (does not keep it alive)."""
        return self._native.exists(key)

    def __contains__(self, key: str) -> bool:
        return self.exists(key)

    def batch_exists(self, keys: Sequence[str]) -> List[bool]:
        """Existence of many keys."""
        codes = self._native.batch_exists(list(keys))
        out: List[Any] = [c == 1 for c in codes]
        _batch_check(out, codes, False, "batch_exists")
        return out

    def get_size(self, key: str) -> int:
        """Size of ``key``'s value in bytes; raises :class:`NotFound`."""
        return self._native.get_size(key)

    def remove(self, key: str, *, force: bool = False) -> None:
        """Removes ``key``. Raises :class:`NotFound`, or :class:`LeaseHeld`
        while a reader's lease is live (``force=True`` removes anyway)."""
        self._native.remove(key, force)

    def batch_remove(self, keys: Sequence[str], *, force: bool = False) -> List[bool]:
        """Removes many keys; per key ``True`` if removed, ``False`` if it did not exist."""
        codes = self._native.batch_remove(list(keys), force)
        out: List[Any] = [c == 0 for c in codes]
        _batch_check(out, codes, True, "batch_remove")
        return out

    def remove_by_regex(self, pattern: str, *, force: bool = False) -> int:
        """Removes keys matching ``pattern`` (Rust regex syntax); returns how many."""
        return self._native.remove_by_regex(pattern, force)

    def remove_all(self, *, force: bool = False) -> int:
        """Removes every object; returns how many."""
        return self._native.remove_all(force)

    def list_keys(self, prefix: str = "", cursor: bytes = b"", limit: int = 1000) -> Tuple[List[Tuple[str, int]], bytes]:
        """One page of ``(key, value size)`` under ``prefix``, and the cursor
        to pass next (``b""`` to start; ``b""`` back once done). A page holds
        at most ``limit`` keys (capped at 10,000), maybe fewer, or none,
        before the end. Keys put or removed meanwhile may be missed or
        listed twice; the others come once each, in no particular order."""
        return self._native.list_keys(prefix, cursor, limit)

