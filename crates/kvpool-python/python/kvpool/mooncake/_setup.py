"""Setup and teardown of :class:`~kvpool.mooncake.MooncakeDistributedStore`:
``setup``'s argument forms, the client port picked as Mooncake picks it when
``local_hostname`` names none, ``init_all``, ``setup_dummy`` (attaching to a
storage process), ``close``, ``health_check`` and the hostname."""

from __future__ import annotations

import os
import random
import socket
from typing import Any, Dict, List, Optional, Tuple

from .. import _native
from ..client import _connect
from ..errors import KvpoolError
from ..config import _flag
from ._buffers import _forget
from ._codes import _CODES, INVALID_PARAMS, NO_AVAILABLE_HANDLE, NOT_SUPPORTED, OK, logger

#: Ports Mooncake picks its own from when ``local_hostname`` has none.
CLIENT_PORTS = (12300, 14300)

_SETUP_NAMES = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "device_name",
    "master_server_addr",
)
_SETUP_EXTRA = (
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
    "enable_embedded_master",
)


def _has_port(host: str) -> bool:
    """Whether ``host`` ends in ``:port`` (``[v6]:port`` included)."""
    h = host.strip()
    if h.startswith("["):
        return "]:" in h
    head, sep, port = h.rpartition(":")
    return bool(sep) and ":" not in head and port.isdigit()


def _port_range() -> Tuple[int, int]:
    """``MC_STORE_CLIENT_MIN_PORT`` .. ``MC_STORE_CLIENT_MAX_PORT`` (Mooncake's 12300..14300)."""
    lo, hi = CLIENT_PORTS
    try:
        lo = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", lo))
        hi = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", hi))
    except ValueError:
        pass
    if not 0 < lo <= hi < 65536:
        lo, hi = CLIENT_PORTS
    return lo, hi


def _free_ports(address: str, n: int) -> List[int]:
    """Up to ``n`` ports of the client range nobody listens on at ``address``
    now (random ones where the address is not this machine's)."""
    lo, hi = _port_range()
    candidates = random.sample(range(lo, hi + 1), min(hi - lo + 1, 200))
    out: List[int] = []
    for p in candidates:
        try:
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
                s.bind((address, p))
        except OSError as e:
            if e.errno in (99, 22):  # address not local / invalid: cannot probe
                return candidates[:n]
            continue
        out.append(p)
        if len(out) == n:
            break
    return out or candidates[:n]


class _SetupMixin:
    """Setup, teardown and health (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ setup

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, device_name, master_server_addr, engine=None,
        ...)`` or ``setup(config: dict)`` (sizes may be ``"16MB"``/``"4gb"``).
        Missing values come from ``KVPOOL_*``, then ``MOONCAKE_*``/``MC_*`` env
        vars, then the file in ``KVPOOL_CONFIG_PATH``/``MOONCAKE_CONFIG_PATH``.
        Mooncake 0.3.14's ``enable_embedded_master=True`` is −1012: kvpool
        starts no master inside a client (one that dies with whichever
        process set it up first is not one a pool should depend on); run
        ``kvpool master``. Returns 0 or a negative code."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            explicit = dict(args[0])
            embedded = explicit.get("enable_embedded_master")
            if isinstance(embedded, str):
                # As config files write yes/no values.
                explicit["enable_embedded_master"] = embedded.strip().lower() in ("1", "true", "yes", "on")
        else:
            if "rdma_devices" in kwargs:
                kwargs.setdefault("device_name", kwargs.pop("rdma_devices"))
            names = _SETUP_NAMES + _SETUP_EXTRA
            if len(args) > len(names):
                raise TypeError(f"setup() takes at most {len(names)} positional arguments ({len(args)} given)")
            explicit = dict(zip(names, args))
            for k, v in kwargs.items():
                if k not in names:
                    raise TypeError(f"setup() got an unexpected keyword argument {k!r}")
                if k in explicit:
                    raise TypeError(f"setup() got multiple values for argument {k!r}")
                explicit[k] = v
            missing = [n for n in _SETUP_NAMES if n not in explicit]
            if missing:
                raise TypeError(f"setup() missing required arguments: {', '.join(missing)} (or pass one dict)")
        if explicit.get("engine") is not None:
            logger.info("kvpool ignores the transfer engine passed to setup(); it uses its own transport")
        explicit.pop("engine", None)
        if _flag("enable_embedded_master", explicit.pop("enable_embedded_master", False)):
            logger.error(
                "kvpool setup: enable_embedded_master is not supported: kvpool starts no master inside the "
                "client. Start one with `kvpool master` (it comes with the kvpool wheel) and pass its address "
                "as master_server_addr"
            )
            return NOT_SUPPORTED
        return self._setup(explicit)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake's ``init_all``: ``setup`` with the other values from the
        environment. −600 on a store already set up (Mooncake's answer)."""
        if self._client is not None:
            return INVALID_PARAMS
        return self._setup({"protocol": protocol, "device_name": device_name, "global_segment_size": mount_segment_size})

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attaches to the storage process (``kvpool store``) whose data
        plane is at ``server_address``, as SGLang's standalone-storage mode
        does: the store owns the memory and survives engine restarts, this
        process lends none, objects go to that store's segments first, and
        bytes move through shared memory where the store's segment file maps
        here. ``mem_pool_size`` bytes of host memory back
        :meth:`alloc_from_mem_pool`. 0 or a negative code."""
        if int(mem_pool_size) < 0 or int(local_buffer_size) < 0 or not server_address:
            return INVALID_PARAMS
        try:
            base = _native.resolve_settings({})
        except KvpoolError as e:
            return e.code
        try:
            about = _native.store_about(str(server_address), base)
        except KvpoolError as e:
            logger.error("kvpool setup_dummy: no storage process answers at %s: %s", server_address, e)
            return e.code
        if not about["master"] or not about["segments"]:
            logger.error("kvpool setup_dummy: %s serves no mounted segment", server_address)
            return INVALID_PARAMS
        pool = 0
        if int(mem_pool_size) > 0:
            pool = _native.host_alloc(int(mem_pool_size))
            if not pool:
                return NO_AVAILABLE_HANDLE
        rc = self._setup(
            {
                "master_server_addr": about["master"],
                "global_segment_size": 0,
                "local_buffer_size": int(local_buffer_size),
                "protocol": "auto",
            }
        )
        if rc != OK:
            if pool:
                _native.host_free(pool)
            return rc
        with self._lock:
            self._prefer = [s["name"] for s in about["segments"]]
            self._pool = (pool, int(mem_pool_size), 0)
        return OK

    def _setup(self, explicit: Dict[str, Any]) -> int:
        try:
            s = _native.resolve_settings(explicit)
        except KvpoolError as e:
            logger.error("kvpool setup refused: %s", e)
            return e.code
        if s["ignored"]:
            logger.debug("kvpool setup: accepted but not used: %s", ", ".join(s["ignored"]))
        for note in s["notes"]:
            logger.warning("kvpool setup: %s", note)
        host = s["local_hostname"]
        ports = [0]
        if not _has_port(host):
            # Mooncake names a client host:port with a port it picks itself;
            # the name is also the lent segment's, so it must be unique.
            ports = _free_ports(s["segment_address"], 4)
        client = None
        err: Optional[KvpoolError] = None
        for port in ports:
            if port:
                s = dict(s, local_hostname=f"{host}:{port}", segment_port=port if s["global_segment_size"] else 0)
            try:
                client = _connect(s)
                break
            except KvpoolError as e:
                err = e
                if e.code != _CODES["SEGMENT_ALREADY_EXISTS"]:  # the port was taken meanwhile: try another
                    break
        if client is None:
            assert err is not None
            logger.error("kvpool setup: cannot connect to %s: %s", s["master_server_addr"], err)
            return err.code
        with self._lock:
            old, self._client, self._settings = self._client, client, s
            self._hostname = s["local_hostname"]
            self._prefer = []
            self._put_sessions.clear()
            self._get_sessions.clear()
        if old is not None:
            try:
                old.close()
            except KvpoolError:
                pass
        return OK

    def close(self) -> int:
        """Withdraws the lent segments and disconnects. Returns 0."""
        with self._lock:
            c, self._client = self._client, None
            self._put_sessions.clear()
            self._get_sessions.clear()
            _forget(self._registered)
        if c is not None:
            try:
                c.close()
            except KvpoolError as e:
                return e.code
        return OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up (or closed), 2 master unreachable."""
        c = self._client
        if c is None or c.closed:
            return 1
        return 0 if c.ping(2.0) else 2

    def get_hostname(self) -> str:
        """This client's ``host:port`` name (the lent segment's name), with
        the port picked from 12300–14300 when setup gave none; ``""`` before
        setup."""
        return self._hostname if self._client is not None else ""

    def _native_client(self) -> "_native.Client":
        """The native client (for kvpool's own helpers); raises before setup."""
        c = self._client
        if c is None:
            raise KvpoolError("the store is not set up", INVALID_PARAMS)
        return c
