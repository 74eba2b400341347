"""``kvpool.engine``: a drop-in for ``mooncake.engine.TransferEngine`` (the
calls SGLang's and vLLM's prefill/decode disaggregation make), over kvpool's
authenticated TCP transfer engine.

A process registers buffers; peers write into and read from them by
absolute address, naming the process by its session id ``host:rpc_port``.
Every remote write and read is checked against the receiver's registered
buffers before a byte moves; local buffers must be registered too (as in
Mooncake). Return codes are Mooncake 0.3.13's: transfers 0 or -1,
``register_memory`` 0, -1 (bad argument) or -7 (overlaps a registered
buffer), ``unregister_memory`` 0 or -3 (not registered); asynchronous
batches a batch id (0 when it could not start) whose status is read once;
``transfer_check_status`` 1 (done), 0 (running), -1 (failed), -2 (timed
out).

Code that does ``from mooncake.engine import TransferEngine`` gets this class
after :func:`install_mooncake_shim`. See ``docs/pd.md``.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import logging
import os
import socket
import sys
import types
from typing import Any, Dict, List, Optional, Sequence

from . import _native
from .errors import KvpoolError

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "install_mooncake_shim"]

logger = logging.getLogger(__name__)

P2PHANDSHAKE = "P2PHANDSHAKE"

# Mooncake's return codes (mooncake-transfer-engine/include/error.h).
_ERR_INVALID_ARGUMENT = -1
_ERR_ADDRESS_NOT_REGISTERED = -3
_ERR_ADDRESS_OVERLAPPED = -7
# kvpool's code for an overlapping registration (ObjectAlreadyExists).
_OVERLAP_CODE = _native.CODES["OBJECT_ALREADY_EXISTS"]
# kvpool's code for a transfer that ran out of time.
_TIMEOUT_CODE = _native.CODES["RPC_TIMEOUT"]

# What this engine moves (Mooncake's module flags): host memory, and CUDA
# device memory through host buffers with the driver's copies (in a process
# that has the CUDA driver loaded); over TCP and on one host, no RDMA.
SUPPORT_CUDA = True
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False


class TransferOpcode(enum.IntEnum):
    """Which way a transfer moves bytes (Mooncake's values)."""

    Read = 0
    Write = 1


# Mooncake exports the values at module level too.
Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification queued at the peer after a batch lands; the peer
    reads it with :meth:`TransferEngine.get_notifies`."""

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)

    __hash__ = None  # type: ignore[assignment]  # mutable, as Mooncake's

_warned_rdma = False

# Where Debian and Ubuntu map the machine's own name; SGLang has been seen
# passing it as the engine's address.
_DEBIAN_HOSTNAME_IP = "127.0.1.1"


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
    or wildcard host names no one. Other loopback addresses given as such
    are meant (``rbg``'s local runtime gives each instance one)."""
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
    if str(ip) == _DEBIAN_HOSTNAME_IP:
        return _lan_ip()
    return str(ip)


class TransferEngine:
    """Mooncake's ``TransferEngine`` over kvpool (see the module docs)."""

    def __init__(self) -> None:
        self._native: Optional[_native.Engine] = None
        self._session_id = ""
        # allocate_managed_buffer's blocks: address -> length.
        self._managed: Dict[int, int] = {}

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

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str) -> int:
        """:meth:`initialize` with the metadata type given apart (ignored:
        no metadata service is used)."""
        return self.initialize(local_hostname, metadata_server, protocol, device_name)

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

    def get_engine_ptr(self) -> int:
        """A non-zero handle naming this engine (Mooncake's C++ pointer)."""
        return id(self)

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """Mooncake's topology JSON for a host without RDMA devices: one
        CPU entry with no NICs."""
        return json.dumps({"cpu:0": [[], []]})

    def warmup_efa_segment(self, segment_name: str) -> int:
        """0: there is no EFA transport to warm up."""
        return 0

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer answers a fresh round trip (and accepts this
        engine's key), else -1."""
        if self._native is None:
            return -1
        try:
            self._native.about(str(peer_server_name))
        except (KvpoolError, TypeError, ValueError) as e:
            logger.warning("probe of %s failed: %s", peer_server_name, e)
            return -1
        return 0

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
        """The start of the earliest registered buffer still in place in
        the engine named ``segment_name`` (this one's session id or a
        peer's); 0 when it has none or cannot be asked."""
        if self._native is None:
            return 0
        if segment_name == self._session_id:
            first = self._native.first_buffer()
            return first[0] if first else 0
        try:
            return self._native.about(str(segment_name)) or 0
        except (KvpoolError, TypeError, ValueError) as e:
            logger.error("cannot ask %s for its buffers: %s", segment_name, e)
            return 0

    def allocate_managed_buffer(self, length: int) -> int:
        """A zeroed block of ``length`` bytes of host memory, registered
        with this engine; its address, or 0 when it cannot be had."""
        if self._native is None or int(length) <= 0:
            return 0
        addr = _native.host_alloc(int(length))
        if addr == 0:
            return 0
        if self.register_memory(addr, int(length)) != 0:
            _native.host_free(addr)
            return 0
        self._managed[addr] = int(length)
        return addr

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Unregisters and frees a block :meth:`allocate_managed_buffer`
        handed out: 0, or -1 for an address it did not hand out."""
        if self._managed.pop(int(buffer_addr), None) is None:
            return _ERR_INVALID_ARGUMENT
        self.unregister_memory(buffer_addr)
        _native.host_free(int(buffer_addr))
        return 0

    def write_bytes_to_buffer(self, buffer_addr: int, src: bytes, length: int) -> int:
        """Copies the first ``length`` bytes of ``src`` to ``buffer_addr``,
        which must lie in memory registered here: 0 or -1."""
        data = src.encode() if isinstance(src, str) else bytes(src)
        if self._native is None or not 0 <= int(length) <= len(data):
            return _ERR_INVALID_ARGUMENT
        try:
            self._native.copy_in(int(buffer_addr), data[: int(length)])
        except (KvpoolError, OverflowError) as e:
            logger.error("write_bytes_to_buffer: %s", e)
            return _ERR_INVALID_ARGUMENT
        return 0

    def read_bytes_from_buffer(self, buffer_addr: int, length: int) -> bytes:
        """The ``length`` bytes at ``buffer_addr``, which must lie in memory
        registered here (else ``kvpool.errors`` raises: Mooncake would read
        any address)."""
        return self._engine().copy_out(int(buffer_addr), int(length))

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

    # Mooncake's CUDA builds run these from a host function queued on the
    # stream (``cudaLaunchHostFunc``), so the call returns at once. A host
    # function may not call CUDA, and kvpool copies GPU memory with the
    # driver, so here the caller waits for the stream's work first, then
    # transfers: the same order (after the stream's earlier work, done
    # before its later work), without the overlap. 0 or -1 (Mooncake returns
    # nothing and exits the process on a failure).

    def transfer_write_on_cuda(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, stream_ptr: int = 0, transport_hint: str = "") -> int:
        """Writes ``length`` bytes at ``buffer`` once CUDA stream
        ``stream_ptr`` has done its queued work: 0 or -1."""
        return self._on_stream(True, target_hostname, [buffer], [peer_buffer_address], [length], stream_ptr)

    def transfer_read_on_cuda(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, stream_ptr: int = 0, transport_hint: str = "") -> int:
        """Reads into ``buffer`` once CUDA stream ``stream_ptr`` has done
        its queued work: 0 or -1."""
        return self._on_stream(False, target_hostname, [buffer], [peer_buffer_address], [length], stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], stream_ptr: int = 0, transport_hint: str = "") -> int:
        """A batch of writes after the stream's queued work: 0 or -1."""
        return self._on_stream(True, target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], stream_ptr: int = 0, transport_hint: str = "") -> int:
        """A batch of reads after the stream's queued work: 0 or -1."""
        return self._on_stream(False, target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, opcode: Any, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        """One transfer the way ``opcode`` says; with ``notify``, queued at
        the peer once the bytes are there. 0 or -1."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address], [length], opcode, notify, transport_hint)

    def batch_transfer_sync(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], opcode: Any, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        """A batch the way ``opcode`` says; with ``notify``, queued at the
        peer once every item succeeded (a failed batch sends none). 0 or -1."""
        write = _is_write(opcode)
        if write is None:
            return -1
        rc = self._batch(write, target_hostname, buffers, peer_buffer_addresses, lengths)
        if rc != 0 or notify is None:
            return rc
        code = self._native.notify(str(target_hostname), str(notify.name), str(notify.msg))  # type: ignore[union-attr]
        if code != 0:
            logger.error("notify to %s failed: %s", target_hostname, _native.code_name(code))
            return -1
        return 0

    def batch_transfer_async_write(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], transport_hint: str = "") -> int:
        """Starts writing every item; its batch id, or 0 when it cannot start."""
        return self._submit(True, target_hostname, buffers, peer_buffer_addresses, lengths) or 0

    def batch_transfer_async_read(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], transport_hint: str = "") -> int:
        """Starts reading every item; its batch id, or 0 when it cannot start."""
        return self._submit(False, target_hostname, buffers, peer_buffer_addresses, lengths) or 0

    def batch_transfer_async(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int], lengths: Sequence[int], opcode: Any, transport_hint: str = "") -> int:
        """Starts a batch the way ``opcode`` says; its id, or 0."""
        write = _is_write(opcode)
        if write is None:
            return 0
        return self._submit(write, target_hostname, buffers, peer_buffer_addresses, lengths) or 0

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Waits until every batch is over: 0 when all succeeded, else -1.
        The ids are spent either way."""
        if self._native is None:
            return -1
        try:
            code = self._native.wait_batches([int(b) for b in batch_ids])
        except (TypeError, ValueError, OverflowError) as e:
            logger.error("get_batch_transfer_status: %s", e)
            return -1
        if code != 0:
            logger.error("a batch failed: %s", _native.code_name(code))
            return -1
        return 0

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        """Starts one write; its batch id, or -1 when it cannot start."""
        batch = self._submit(True, target_hostname, [buffer], [peer_buffer_address], [length])
        return batch if batch is not None else -1

    def transfer_check_status(self, batch_id: int) -> int:
        """1 when the batch succeeded, 0 while it runs, -1 when it failed,
        -2 when it timed out; the id is spent once it is over."""
        if self._native is None:
            return -1
        try:
            code = self._native.poll(int(batch_id))
        except (KvpoolError, TypeError, ValueError, OverflowError) as e:
            logger.error("transfer_check_status: %s", e)
            return -1
        if code is None:
            return 0
        if code == 0:
            return 1
        return -2 if code == _TIMEOUT_CODE else -1

    def get_notifies(self) -> List[TransferNotify]:
        """The notifies peers queued here since the last call, oldest first."""
        if self._native is None:
            return []
        return [TransferNotify(name, msg) for name, msg in self._native.take_notifies()]

    # ------------------------------------------------------------ helpers

    def _engine(self) -> "_native.Engine":
        if self._native is None:
            raise RuntimeError("TransferEngine is not initialized: call initialize() first")
        return self._native

    def _submit(self, write: bool, target: str, buffers: Sequence[int], peers: Sequence[int], lengths: Sequence[int]) -> Optional[int]:
        """Starts a batch on the runtime; its id, or None when it cannot start."""
        if self._native is None:
            logger.error("transfer on a TransferEngine that is not initialized")
            return None
        try:
            return self._native.submit(write, str(target), buffers, peers, lengths)
        except (KvpoolError, TypeError, ValueError, OverflowError) as e:
            logger.error("cannot start a batch with %s: %s", target, e)
            return None

    def _on_stream(self, write: bool, target: str, buffers: Sequence[int], peers: Sequence[int], lengths: Sequence[int], stream: int) -> int:
        if self._native is None:
            logger.error("transfer on a TransferEngine that is not initialized")
            return -1
        try:
            first = int(buffers[0]) if len(buffers) else 0
            self._native.wait_for_stream(first, int(stream))
        except (KvpoolError, TypeError, ValueError, OverflowError) as e:
            logger.error("transfer with %s: the CUDA stream failed: %s", target, e)
            return -1
        return self._batch(write, target, buffers, peers, lengths)

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


def _is_write(opcode: Any) -> Optional[bool]:
    """Whether ``opcode`` (kvpool's or Mooncake's ``TransferOpcode``, or
    its integer) is a write; None, logged, for anything else."""
    try:
        value = int(opcode)
    except (TypeError, ValueError):
        value = -1
    if value not in (TransferOpcode.Read, TransferOpcode.Write):
        logger.error("unknown transfer opcode %r", opcode)
        return None
    return value == TransferOpcode.Write


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
