"""``kvpool.engine``: a drop-in for ``mooncake.engine.TransferEngine`` (the
calls SGLang's and vLLM's prefill/decode disaggregation make), over kvpool's
authenticated TCP transfer engine.

A process registers buffers; peers write into and read from them by
absolute address, naming the process by its session id ``host:rpc_port``.
Every remote write and read is checked against the receiver's registered
buffers before a byte moves; local buffers must be registered too (as in
Mooncake). Return codes are Mooncake 0.3.13's: transfers 0 or -1,
``register_memory`` 0, -1 (bad argument) or -7 (overlaps a registered
buffer), ``unregister_memory`` 0 or -3 (not registered).

Code that does ``from mooncake.engine import TransferEngine`` gets this class
after :func:`install_mooncake_shim`. See ``docs/pd.md``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import types
from typing import List, Optional, Sequence

from . import _native
from .errors import KvpoolError

__all__ = ["TransferEngine", "install_mooncake_shim"]

logger = logging.getLogger(__name__)

P2PHANDSHAKE = "P2PHANDSHAKE"

# Mooncake's return codes (mooncake-transfer-engine/include/error.h).
_ERR_INVALID_ARGUMENT = -1
_ERR_ADDRESS_NOT_REGISTERED = -3
_ERR_ADDRESS_OVERLAPPED = -7
# kvpool's code for an overlapping registration (ObjectAlreadyExists).
_OVERLAP_CODE = _native.CODES["OBJECT_ALREADY_EXISTS"]

_warned_rdma = False


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _split_host_port(hostname: str) -> "tuple[str, Optional[int]]":
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address."""
    h = hostname.strip()
    if h.startswith("["):
        end = h.find("]")
        host, rest = h[1:end], h[end + 1 :]
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if h.count(":") == 1:
        host, port = h.split(":")
        return host, int(port) if port.isdigit() else None
    return h, None


def _lan_ip() -> str:
    """An address of this host that other hosts can reach: the source
    address of a route outwards (a UDP connect sends nothing), else
    127.0.0.1."""
    for probe in (("10.255.255.255", 1), ("8.8.8.8", 80)):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(probe)
                ip = s.getsockname()[0]
                if not ipaddress.ip_address(ip).is_loopback:
                    return ip
        except OSError:
            continue
    return "127.0.0.1"


def _advertised(host: str) -> str:
    """The address peers are told: `host` when it names a reachable
    address, else this host's LAN address. Debian-style ``/etc/hosts`` maps
    the hostname to 127.0.1.1, which no other host can reach, and an empty
    or wildcard host names no one."""
    if host in ("", "0.0.0.0", "::"):
        return _lan_ip()
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return _lan_ip()
        # A name that resolves to loopback is reachable only from here: fine
        # for `localhost`, not for the machine's own name.
        if ip.is_loopback and host != "localhost":
            return _lan_ip()
        return str(ip)
    if ip.is_loopback and str(ip) != "127.0.0.1" and str(ip) != "::1":
        return _lan_ip()
    return str(ip)


class TransferEngine:
    """Mooncake's ``TransferEngine`` over kvpool (see the module docs)."""

    def __init__(self) -> None:
        self._native: Optional[_native.Engine] = None
        self._session_id = ""

    # -------------------------------------------------------------- setup

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Starts the engine: 0, or -1 when it cannot serve.

        ``local_hostname`` is ``host`` or ``host:port``; as in Mooncake the
        port is honoured only with ``MC_LEGACY_RPC_PORT_BINDING`` (else one
        is picked; :meth:`get_rpc_port` says which). ``metadata_server`` may
        be ``P2PHANDSHAKE`` or an ``etcd://``/``http://`` string: no
        metadata service is used either way, peers are named by session id
        ``host:rpc_port``. ``protocol="rdma"`` (or any other) falls back to
        TCP with one warning; ``device_name`` is ignored."""
        if self._native is not None:
            logger.error("TransferEngine.initialize called twice")
            return -1
        if not isinstance(metadata_server, str) or not metadata_server:
            logger.error("initialize: metadata_server must be P2PHANDSHAKE or a connection string")
            return -1
        proto = (protocol or "tcp").lower()
        if proto != "tcp" and not _truthy("MC_FORCE_TCP"):
            global _warned_rdma
            if not _warned_rdma:
                _warned_rdma = True
                logger.warning("kvpool's transfer engine speaks TCP only: protocol %r falls back to TCP", protocol)
        try:
            host, port = _split_host_port(local_hostname or "")
        except ValueError:
            logger.error("initialize: bad local_hostname %r", local_hostname)
            return -1
        if not os.environ.get("MC_LEGACY_RPC_PORT_BINDING") or port is None:
            port = 0
        advertised = _advertised(host)
        bind_ip = advertised
        try:
            self._native = _native.Engine(f"{_wrap(bind_ip)}:{port}")
        except Exception as e:  # noqa: BLE001 - Mooncake answers -1, never raises
            logger.error("initialize: cannot serve on %s:%s: %s", bind_ip, port, e)
            return -1
        self._session_id = f"{_wrap(advertised)}:{self._native.port}"
        logger.info("kvpool transfer engine serving %s (session id %s)", self._native.bound, self._session_id)
        return 0

    def get_rpc_port(self) -> int:
        """The port peers reach this engine on (the ``port`` of its session id)."""
        return self._engine().port

    def get_session_id(self) -> str:
        """``host:rpc_port``: what peers pass as ``target_hostname``."""
        self._engine()
        return self._session_id

    def get_engine(self) -> "TransferEngine":
        """This engine (Mooncake hands out its C++ engine here)."""
        return self

    # ------------------------------------------------------------- memory

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers ``capacity`` bytes at ``buffer_addr``: 0, -1 for a bad
        range (empty, unmapped), -7 when it overlaps a registered buffer.
        The memory must stay valid until :meth:`unregister_memory`."""
        try:
            self._engine().register(int(buffer_addr), int(capacity))
        except KvpoolError as e:
            return _ERR_ADDRESS_OVERLAPPED if e.code == _OVERLAP_CODE else _ERR_INVALID_ARGUMENT
        except (TypeError, ValueError, OverflowError):
            return _ERR_INVALID_ARGUMENT
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        """Unregisters the buffer at ``buffer_addr`` once transfers in flight
        into or out of it are done: 0, or -3 when none is registered there."""
        try:
            return 0 if self._engine().unregister(int(buffer_addr)) else _ERR_ADDRESS_NOT_REGISTERED
        except (TypeError, ValueError, OverflowError):
            return _ERR_INVALID_ARGUMENT

    def batch_register_memory(self, buffer_addresses: Sequence[int], capacities: Sequence[int], location: str = "*") -> int:
        """Registers every buffer, or none: the first failure's code."""
        if len(buffer_addresses) != len(capacities):
            return _ERR_INVALID_ARGUMENT
        done: List[int] = []
        for addr, cap in zip(buffer_addresses, capacities):
            rc = self.register_memory(addr, cap, location)
            if rc != 0:
                for a in done:
                    self.unregister_memory(a)
                return rc
            done.append(addr)
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        """Unregisters every buffer it can: 0, or the first failure's code."""
        first = 0
        for addr in buffer_addresses:
            rc = self.unregister_memory(addr)
            if rc != 0 and first == 0:
                first = rc
        return first

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The earliest registered buffer still in place, for this engine's
        own session id; 0 otherwise (asking a peer is not supported yet)."""
        if self._native is None or segment_name != self._session_id:
            return 0
        first = self._native.first_buffer()
        return first[0] if first else 0

    # ---------------------------------------------------------- transfers

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        """Writes ``length`` bytes at ``buffer`` (registered here) to
        ``peer_buffer_address`` in ``target_hostname``: 0 or -1."""
        return self._batch(True, target_hostname, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        """Reads ``length`` bytes at ``peer_buffer_address`` in
        ``target_hostname`` into ``buffer`` (registered here): 0 or -1."""
        return self._batch(False, target_hostname, [buffer], [peer_buffer_address], [length])

    def batch_transfer_sync_write(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], transport_hint: str = "") -> int:
        """Writes every item, pipelined: 0 when all landed, else -1."""
        return self._batch(True, target_hostname, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], transport_hint: str = "") -> int:
        """Reads every item, pipelined: 0 when all arrived, else -1."""
        return self._batch(False, target_hostname, buffers, peer_buffer_addresses, lengths)

    # ------------------------------------------------------------ helpers

    def _engine(self) -> "_native.Engine":
        if self._native is None:
            raise RuntimeError("TransferEngine is not initialized: call initialize() first")
        return self._native

    def _batch(self, write: bool, target: str, buffers: Sequence[int], peers: Sequence[int], lengths: Sequence[int]) -> int:
        if self._native is None:
            logger.error("transfer on a TransferEngine that is not initialized")
            return -1
        # The native side takes any sequences of integers and refuses
        # lists of different lengths; nothing to convert or check here.
        try:
            codes = (self._native.write if write else self._native.read)(str(target), buffers, peers, lengths)
        except (KvpoolError, TypeError, ValueError, OverflowError) as e:
            logger.error("transfer with %s failed: %s", target, e)
            return -1
        failed = [c for c in codes if c != 0]
        if failed:
            logger.error(
                "%s with %s: %d of %d items failed (first: %s)",
                "write" if write else "read", target, len(failed), len(codes), _native.code_name(failed[0]),
            )
            return -1
        return 0


def _wrap(host: str) -> str:
    """``host`` as the host part of ``host:port`` (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def install_mooncake_shim(store: bool = True) -> None:
    """Makes ``from mooncake.engine import TransferEngine`` (and, with
    ``store``, ``from mooncake.store import MooncakeDistributedStore``)
    resolve to kvpool, in this interpreter only, without installing a
    ``mooncake`` package. Call it before SGLang or vLLM import Mooncake.
    A real ``mooncake`` package already imported keeps its other modules."""
    pkg = sys.modules.get("mooncake")
    if pkg is None:
        pkg = types.ModuleType("mooncake")
        pkg.__path__ = []  # a package, so `mooncake.engine` resolves
        sys.modules["mooncake"] = pkg
    this = sys.modules[__name__]
    sys.modules["mooncake.engine"] = this
    setattr(pkg, "engine", this)
    if store:
        from . import mooncake as km

        sys.modules["mooncake.store"] = km
        setattr(pkg, "store", km)
