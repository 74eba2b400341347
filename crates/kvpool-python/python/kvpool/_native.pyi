"""Type stubs for ``kvpool._native``, the Rust half of the package.

Use :mod:`kvpool`, :mod:`kvpool.mooncake` or :mod:`kvpool.sglang` instead.
Memory arguments (``_Memory``) accept an object with the buffer protocol, a
contiguous CPU tensor (``data_ptr()``), or an ``int`` address with a size.
"""

import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

from .config import ReplicateConfig

_Memory = Any
_Sizes = Optional[Sequence[Union[None, int, Sequence[Optional[int]]]]]

__all__ = [
    "__version__",
    "CODES",
    "Buffer",
    "Client",
    "Engine",
    "address_of",
    "code_name",
    "resolve_settings",
    "host_alloc",
    "host_free",
    "host_alloc_functions",
    "store_about",
]
__version__: str
#: Every error code by its Mooncake name (``"OBJECT_NOT_FOUND"`` → ``-704``).
CODES: Dict[str, int]

def resolve_settings(explicit: Dict[str, Any]) -> Dict[str, Any]:
    """Resolves setup settings from arguments, ``KVPOOL_*``/``MOONCAKE_*``/``MC_*`` env vars and the
    config file: the settings by canonical name, plus ``ignored`` and ``notes``."""

def code_name(code: int) -> str:
    """Mooncake's name for an error code (``-704`` → ``"OBJECT_NOT_FOUND"``)."""

def address_of(obj: Any, writable: bool = False) -> Tuple[int, int]:
    """``(address, size)`` of an object's memory; keep the object alive while using it."""

def host_alloc(size: int) -> int:
    """A zeroed block of ``size`` bytes of host memory; its address, or 0."""

def host_free(ptr: int) -> int:
    """Frees a block ``host_alloc`` handed out: 0, or -1 for any other address."""

def host_alloc_functions() -> Tuple[int, int]:
    """Addresses of the C ``alloc(size, device, stream)`` and ``free(ptr, size, device, stream)``."""

def store_about(endpoint: str, settings: Dict[str, Any], timeout: float = 5.0) -> Dict[str, Any]:
    """What the storage process at ``endpoint`` serves: ``master`` and ``segments``, asked with the
    key and TLS of ``settings`` (as :func:`resolve_settings` returns them)."""

def note_registered(ptr: int, size: int) -> None:
    """Notes memory registered for zero-copy calls (kept mapped until
    :func:`note_unregistered`): raw addresses inside it skip the page probe."""

def note_unregistered(ptr: int, size: int) -> bool:
    """Forgets one :func:`note_registered` of the same region; whether there was one."""

@final
class Buffer:
    """Bytes read from the pool: writable buffer protocol, ``ptr()``, ``size()``, ``len()``."""

    def ptr(self) -> int:
        """Address of the first byte (valid while this object lives)."""
    def size(self) -> int:
        """Number of bytes."""
    def _signed(self) -> "Buffer":
        """This buffer, exported from now on as signed bytes (item format ``'b'``, Mooncake's)."""
    def __len__(self) -> int: ...
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class Client:
    """A connection to a kvpool cluster; single-key calls raise, batch calls return per-key ints."""

    def __new__(cls, settings: Dict[str, Any]) -> "Client":
        """Connects with the settings ``resolve_settings`` returned (values may be changed)."""
    @property
    def master(self) -> str:
        """Master address in use."""
    @property
    def hostname(self) -> str:
        """This client's name (and its lent segment's name)."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    @property
    def lent_bytes(self) -> int:
        """Bytes this process lends through this client (0 in a forked child)."""
    def close(self) -> None:
        """Withdraws the lent segment and disconnects."""
    def put(
        self,
        key: str,
        value: _Memory,
        size: Optional[int] = None,
        config: Optional[ReplicateConfig] = None,
        upsert: bool = False,
    ) -> None:
        """Stores one object (write-once unless ``upsert``)."""
    def put_parts(
        self, key: str, parts: Sequence[_Memory], config: Optional[ReplicateConfig] = None, upsert: bool = False
    ) -> None:
        """Stores the concatenation of ``parts``."""
    def batch_put(
        self,
        keys: Sequence[str],
        values: Sequence[Union[_Memory, Sequence[_Memory]]],
        sizes: _Sizes = None,
        config: Optional[ReplicateConfig] = None,
        upsert: bool = False,
    ) -> List[int]:
        """Stores many objects; per key 0 or a negative code."""
    def get(self, key: str) -> bytes:
        """Reads one object."""
    def get_buffer(self, key: str) -> Buffer:
        """Reads one object into a new Buffer."""
    def get_into(self, key: str, dst: _Memory, size: Optional[int] = None) -> int:
        """Reads one object into caller memory; returns its length."""
    def batch_get(self, keys: Sequence[str]) -> List[Union[bytes, int]]:
        """Per key: the bytes, or a negative code."""
    def batch_get_buffer(self, keys: Sequence[str]) -> List[Union[Buffer, int]]:
        """Per key: a Buffer, or a negative code."""
    def batch_get_into(
        self, keys: Sequence[str], dsts: Sequence[Union[_Memory, Sequence[_Memory]]], sizes: _Sizes = None
    ) -> List[int]:
        """Per key: bytes read, or a negative code."""
    def read_ranges(self, keys: Sequence[str], ranges: Sequence[Sequence[Tuple[int, int, int]]]) -> List[List[int]]:
        """Copies ``(dst_address, src_offset, size)`` ranges of objects; per range bytes or a negative code."""
    def exists(self, key: str, lease: bool = False) -> bool:
        """Whether ``key`` exists (``lease``: take a read lease, as Mooncake's ``is_exist``)."""
    def batch_exists(self, keys: Sequence[str], lease: bool = False) -> List[int]:
        """Per key: 1, 0, or a negative code."""
    def get_size(self, key: str, lease: bool = False) -> int:
        """Value size of ``key``."""
    def replica_descs(self, keys: Sequence[str]) -> List[Union[List[Tuple[str, str, str, int, int]], int]]:
        """Per key: (segment name, segment id, endpoint, value offset, value length) per replica, or a code."""
    def copy_replicas(self, key: str, targets: Sequence[str]) -> None:
        """Copies ``key`` to the segments named ``targets``."""
    def move_replica(self, key: str, source: str, target: str) -> None:
        """Moves ``key``'s replica from segment ``source`` to ``target``."""
    def start_task(self, kind: str, key: str, targets: Sequence[str], source: str = "") -> int:
        """Records a "copy" or "move" task and carries it out in the background; its id."""
    def query_task(self, id: int) -> Dict[str, Any]:
        """A task: id, kind, status, created_ms, updated_ms, assigned_client, message."""
    def clear_replicas(self, keys: Sequence[str], segment: Optional[str] = None) -> List[bool]:
        """Drops replicas on ``segment`` (every replica for None); per key whether any went."""
    def mount_segment(self, size: int, path: Optional[str] = None, offset: int = 0) -> Dict[str, Any]:
        """Lends a new segment (anonymous memory, or a file range); it as a dict."""
    def unmount_segment(self, id: str) -> Dict[str, Any]:
        """Takes back a segment this client lends (id in hex)."""
    def lent_segments(self) -> List[Dict[str, Any]]:
        """The segments this client lends."""
    def remove(self, key: str, force: bool = False) -> None:
        """Removes ``key``."""
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[int]:
        """Per key: 0 or a negative code."""
    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        """Removes matching keys; returns how many."""
    def remove_all(self, force: bool = False) -> int:
        """Removes every object; returns how many."""
    def list_keys(self, prefix: str = "", cursor: bytes = b"", limit: int = 1000) -> Tuple[List[Tuple[str, int]], bytes]:
        """One page of (key, value size) under ``prefix`` and the cursor to pass next (``b""`` once done)."""
    def status(self) -> Dict[str, Any]:
        """The cluster as the master sees it."""
    def get_metrics(self) -> Dict[str, float]:
        """This client's counters by Prometheus series name."""
    def metrics_text(self) -> str:
        """This client's counters as Prometheus text."""
    def master_silent_for(self) -> float:
        """Seconds since the master last answered this client's heartbeats."""
    def ping(self, timeout: float = 2.0) -> bool:
        """Whether the master answers within ``timeout`` seconds."""

@final
class Engine:
    """A transfer engine: registered memory served on a TCP port, and
    pipelined writes and reads of peers' registered memory."""

    def __new__(cls, bind: str, secret: Optional[str] = None, insecure: bool = False, timeout: Optional[float] = None) -> "Engine": ...
    @property
    def port(self) -> int:
        """The port the server listens on."""
    @property
    def bound(self) -> str:
        """The address the server listens on, ``ip:port``."""
    def register(self, addr: int, length: int) -> None:
        """Registers ``length`` bytes at ``addr`` (must stay valid until unregistered)."""
    def unregister(self, addr: int) -> bool:
        """Unregisters the buffer at ``addr`` after transfers in flight; whether there was one."""
    def first_buffer(self) -> Optional[Tuple[int, int]]:
        """Start and length of the earliest registered buffer still in place."""
    def write(self, peer: str, locals: Sequence[int], remotes: Sequence[int], lengths: Sequence[int]) -> List[int]:
        """Writes each item to the peer ``host:port``; per item 0 or a negative code."""
    def read(self, peer: str, locals: Sequence[int], remotes: Sequence[int], lengths: Sequence[int]) -> List[int]:
        """Reads each item from the peer; per item 0 or a negative code."""
    def submit(self, write: bool, peer: str, locals: Sequence[int], remotes: Sequence[int], lengths: Sequence[int]) -> int:
        """Starts a batch on the runtime; its id (never 0)."""
    def poll(self, id: int) -> Optional[int]:
        """The batch's code once it is over (0 or its first failure's; the id is spent), None while it runs."""
    def wait_batches(self, ids: Sequence[int]) -> int:
        """Waits for every batch and spends the ids: 0, or the first failure's code."""
    def notify(self, peer: str, name: str, msg: str) -> int:
        """Queues a notify at the peer: 0 or a negative code."""
    def take_notifies(self) -> List[Tuple[str, str]]:
        """Every notify peers queued here, oldest first, each once."""
    def about(self, peer: str) -> Optional[int]:
        """The peer's earliest registered buffer, asked in a fresh round trip (raises when unreachable)."""
    def copy_in(self, addr: int, data: bytes) -> None:
        """Copies ``data`` into memory registered here."""
    def copy_out(self, addr: int, length: int) -> bytes:
        """``length`` bytes of memory registered here."""
    def link(self, peer: str) -> str:
        """How ``peer`` was last reached: ``copy``, ``socket``, ``tcp`` or ``unknown``."""
    def close(self) -> None:
        """Stops serving."""
