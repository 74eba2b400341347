"""``ReplicateConfig`` and ``SoftPinAction``: per-put placement and pinning,
attribute-compatible with Mooncake's classes of the same names."""

from __future__ import annotations

import enum
import operator
from typing import Any, Iterable, List, Optional, Tuple

__all__ = ["ReplicateConfig", "SoftPinAction", "ObjectDataType"]

_U64_MAX = 2**64 - 1


class _Enum(int, enum.Enum):
    """An int enum that prints like Mooncake's pybind11 enums (``SoftPinAction.ENABLE``)."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {int(self)}>"


class SoftPinAction(_Enum):
    """What a put does to the object's soft pin (Mooncake's enum)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(_Enum):
    """What an object holds (``ReplicateConfig.data_type``): a label kvpool accepts and does not use."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


def _index(name: str, value: Any, *, allow_none: bool = False) -> Optional[int]:
    """A non-negative int below 2**64 (or None when allowed), else TypeError."""
    if value is None and allow_none:
        return None
    expected = f"{name} must be a non-negative int{' or None' if allow_none else ''}"
    if isinstance(value, float):
        raise TypeError(f"{expected}, got float")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{expected}, got {type(value).__name__}") from None
    if v < 0 or v > _U64_MAX:
        raise TypeError(f"{expected}, got {v}")
    return v


def _member(name: str, enum_type: Any, value: Any) -> Any:
    """A member of ``enum_type``, or of Mooncake's enum of the same name
    (taken by value); anything else, plain ints included, raises TypeError
    as Mooncake's binding does."""
    if isinstance(value, enum_type):
        return value
    if type(value).__name__ == enum_type.__name__ and hasattr(value, "value"):
        try:
            return enum_type(int(value.value))
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{name} must be a {enum_type.__name__}, got {type(value).__name__} {value!r}")


def _flag(name: str, value: Any) -> bool:
    """A yes/no field converted as Mooncake's binding converts ``bool``:
    ``True``/``False``, ``None`` (no) and numbers (anything whose type
    defines ``__bool__``: ints, floats, numpy bools) are taken; anything else
    (``"no"``, ``"false"``, lists) raises TypeError rather than reading as yes."""
    if value is None:
        return False
    if hasattr(type(value), "__bool__"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _strs(name: str, value: Any, nested: bool = False) -> Optional[List[Any]]:
    """``value`` as a list of str (of lists of str when ``nested``), as
    Mooncake's ``list[str]`` fields take it: None stays None, any iterable
    but a bare str is listed, bytes are decoded (as pybind11 does), and
    anything else raises TypeError."""
    if value is None:
        return None
    what = f"{name} must be a list of {'lists of str' if nested else 'str'} or None"

    def items(v: Any) -> List[Any]:
        if isinstance(v, (str, bytes)):
            raise TypeError(f"{what}, got {type(v).__name__}")
        try:
            return list(v)
        except TypeError:
            raise TypeError(f"{what}, got {type(v).__name__}") from None

    def text(x: Any) -> str:
        if isinstance(x, bytes):
            x = x.decode()
        if not isinstance(x, str):
            raise TypeError(f"{what}, got an item of type {type(x).__name__}")
        return x

    if nested:
        return [[text(x) for x in items(row)] for row in items(value)]
    return [text(x) for x in items(value)]


class ReplicateConfig:
    """Replication and pinning for a put. Fields as in Mooncake:
    ``replica_num`` copies on distinct segments; ``with_soft_pin`` /
    ``soft_pin_action`` (evict last, for ``soft_pin_ttl_ms`` or the master's
    default); ``with_hard_pin`` (never evict); ``preferred_segments`` /
    ``preferred_segment`` (segment names to place on first);
    ``prefer_alloc_in_same_node`` (prefer the segment this process lends).
    ``group_ids`` and Mooncake 0.3.14's ``session_ids``,
    ``residency_affinity_ids``, ``preferred_hca_names`` and
    ``per_key_preferred_hca_names`` are hints kvpool checks and does not use."""

    __slots__ = (
        "_replica_num",
        "_with_soft_pin",
        "_soft_pin_ttl_ms",
        "_with_hard_pin",
        "_preferred_segments",
        "_preferred_segment",
        "_prefer_alloc_in_same_node",
        "_soft_pin_action",
        "_data_type",
        "_nof_replica_num",
        "_dfs_replica_num",
        "_preferred_nof_segments",
        "_group_ids",
        "_session_ids",
        "_residency_affinity_ids",
        "_preferred_hca_names",
        "_per_key_preferred_hca_names",
    )

    def __init__(
        self,
        replica_num: int = 1,
        with_soft_pin: bool = False,
        soft_pin_ttl_ms: Optional[int] = None,
        with_hard_pin: bool = False,
        preferred_segments: Optional[Iterable[str]] = None,
        preferred_segment: str = "",
        prefer_alloc_in_same_node: bool = False,
        soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE,
        data_type: ObjectDataType = ObjectDataType.UNKNOWN,
        nof_replica_num: int = 0,
        dfs_replica_num: int = 0,
        preferred_nof_segments: Optional[Iterable[str]] = None,
        group_ids: Optional[Iterable[str]] = None,
        session_ids: Optional[Iterable[str]] = None,
        residency_affinity_ids: Optional[Iterable[str]] = None,
        preferred_hca_names: Optional[Iterable[str]] = None,
        per_key_preferred_hca_names: Optional[Iterable[Iterable[str]]] = None,
    ) -> None:
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.with_hard_pin = with_hard_pin
        self.preferred_segments = list(preferred_segments or [])
        self.preferred_segment = preferred_segment
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.soft_pin_action = soft_pin_action
        self.data_type = data_type
        self.nof_replica_num = nof_replica_num
        self.dfs_replica_num = dfs_replica_num
        self.preferred_nof_segments = list(preferred_nof_segments or [])
        self.group_ids = group_ids
        self.session_ids = session_ids
        self.residency_affinity_ids = residency_affinity_ids
        self.preferred_hca_names = preferred_hca_names
        self.per_key_preferred_hca_names = per_key_preferred_hca_names

    @property
    def replica_num(self) -> int:
        """Copies on distinct segments (default 1)."""
        return self._replica_num

    @replica_num.setter
    def replica_num(self, v: int) -> None:
        self._replica_num: int = _index("replica_num", v) or 0

    @property
    def with_soft_pin(self) -> bool:
        """Evict this object only after every unpinned one."""
        return self._with_soft_pin

    @with_soft_pin.setter
    def with_soft_pin(self, v: bool) -> None:
        self._with_soft_pin = _flag("with_soft_pin", v)

    @property
    def soft_pin_ttl_ms(self) -> Optional[int]:
        """Soft pin length in ms; ``None`` uses the master's default."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, v: Optional[int]) -> None:
        self._soft_pin_ttl_ms = _index("soft_pin_ttl_ms", v, allow_none=True)

    @property
    def with_hard_pin(self) -> bool:
        """Never evict this object."""
        return self._with_hard_pin

    @with_hard_pin.setter
    def with_hard_pin(self, v: bool) -> None:
        self._with_hard_pin = _flag("with_hard_pin", v)

    @property
    def preferred_segments(self) -> List[str]:
        """Segment names to place replicas on first, in order."""
        return self._preferred_segments

    @preferred_segments.setter
    def preferred_segments(self, v: Iterable[str]) -> None:
        if isinstance(v, (str, bytes)):
            raise TypeError("preferred_segments must be a list of str")
        items = list(v)
        if not all(isinstance(s, str) for s in items):
            raise TypeError("preferred_segments must be a list of str")
        self._preferred_segments = items

    @property
    def preferred_segment(self) -> str:
        """One segment name to place on first (``""`` = none)."""
        return self._preferred_segment

    @preferred_segment.setter
    def preferred_segment(self, v: str) -> None:
        if not isinstance(v, str):
            raise TypeError("preferred_segment must be a str")
        self._preferred_segment = v

    @property
    def prefer_alloc_in_same_node(self) -> bool:
        """Prefer the segment this process lends, if it lends one."""
        return self._prefer_alloc_in_same_node

    @prefer_alloc_in_same_node.setter
    def prefer_alloc_in_same_node(self, v: bool) -> None:
        self._prefer_alloc_in_same_node = _flag("prefer_alloc_in_same_node", v)

    @property
    def soft_pin_action(self) -> SoftPinAction:
        """``ENABLE`` pins, ``DISABLE`` does not, ``PRESERVE`` follows ``with_soft_pin``."""
        return self._soft_pin_action

    @soft_pin_action.setter
    def soft_pin_action(self, v: SoftPinAction) -> None:
        self._soft_pin_action = _member("soft_pin_action", SoftPinAction, v)

    @property
    def data_type(self) -> ObjectDataType:
        """What the object holds (a label; kvpool does not use it)."""
        return self._data_type

    @data_type.setter
    def data_type(self, v: ObjectDataType) -> None:
        self._data_type = _member("data_type", ObjectDataType, v)

    @property
    def nof_replica_num(self) -> int:
        """Replicas on NVMe-oF segments; kvpool has none, so a put asking for any is −1012."""
        return self._nof_replica_num

    @nof_replica_num.setter
    def nof_replica_num(self, v: int) -> None:
        self._nof_replica_num = _index("nof_replica_num", v) or 0

    @property
    def dfs_replica_num(self) -> int:
        """Replicas on a distributed file system; kvpool has none (−1012 if asked for)."""
        return self._dfs_replica_num

    @dfs_replica_num.setter
    def dfs_replica_num(self, v: int) -> None:
        self._dfs_replica_num = _index("dfs_replica_num", v) or 0

    @property
    def preferred_nof_segments(self) -> List[str]:
        """NVMe-oF segments to place on first (kvpool has none)."""
        return self._preferred_nof_segments

    @preferred_nof_segments.setter
    def preferred_nof_segments(self, v: Iterable[str]) -> None:
        if isinstance(v, (str, bytes)):
            raise TypeError("preferred_nof_segments must be a list of str")
        self._preferred_nof_segments = list(v)

    @property
    def group_ids(self) -> Optional[List[str]]:
        """Object groups of Mooncake's group semantics, one per key of a put: a placement hint kvpool accepts and does not use."""
        return self._group_ids

    @group_ids.setter
    def group_ids(self, v: Optional[Iterable[str]]) -> None:
        if v is not None and isinstance(v, (str, bytes)):
            raise TypeError("group_ids must be a list of str or None")
        self._group_ids = None if v is None else list(v)

    # Mooncake 0.3.14's placement hints: kvpool accepts them (a write checks
    # the per-key ones name one entry per key, as Mooncake does) and does
    # not use them; it has no sessions, residency groups or RDMA HCAs.

    @property
    def session_ids(self) -> Optional[List[str]]:
        """One session id per key of a write (Mooncake 0.3.14): a hint kvpool accepts and does not use."""
        return self._session_ids

    @session_ids.setter
    def session_ids(self, v: Optional[Iterable[str]]) -> None:
        self._session_ids = _strs("session_ids", v)

    @property
    def residency_affinity_ids(self) -> Optional[List[str]]:
        """One residency affinity id per key of a write (Mooncake 0.3.14): a hint kvpool accepts and does not use."""
        return self._residency_affinity_ids

    @residency_affinity_ids.setter
    def residency_affinity_ids(self, v: Optional[Iterable[str]]) -> None:
        self._residency_affinity_ids = _strs("residency_affinity_ids", v)

    @property
    def preferred_hca_names(self) -> Optional[List[str]]:
        """RDMA NICs to move a write's bytes through (Mooncake 0.3.14); kvpool has no RDMA and does not use it."""
        return self._preferred_hca_names

    @preferred_hca_names.setter
    def preferred_hca_names(self, v: Optional[Iterable[str]]) -> None:
        self._preferred_hca_names = _strs("preferred_hca_names", v)

    @property
    def per_key_preferred_hca_names(self) -> Optional[List[List[str]]]:
        """``preferred_hca_names`` per key of a write (Mooncake 0.3.14); accepted and not used."""
        return self._per_key_preferred_hca_names

    @per_key_preferred_hca_names.setter
    def per_key_preferred_hca_names(self, v: Optional[Iterable[Iterable[str]]]) -> None:
        self._per_key_preferred_hca_names = _strs("per_key_preferred_hca_names", v, nested=True)

    def _fields(self) -> Tuple[Any, ...]:
        return (
            self.replica_num,
            self.with_soft_pin,
            self.soft_pin_ttl_ms,
            self.with_hard_pin,
            tuple(self.preferred_segments),
            self.preferred_segment,
            self.prefer_alloc_in_same_node,
            self.soft_pin_action,
            self.data_type,
            self.nof_replica_num,
            self.dfs_replica_num,
            tuple(self.preferred_nof_segments),
            None if self.group_ids is None else tuple(self.group_ids),
            None if self.session_ids is None else tuple(self.session_ids),
            None if self.residency_affinity_ids is None else tuple(self.residency_affinity_ids),
            None if self.preferred_hca_names is None else tuple(self.preferred_hca_names),
            None if self.per_key_preferred_hca_names is None else tuple(map(tuple, self.per_key_preferred_hca_names)),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplicateConfig) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ReplicateConfig(replica_num={self.replica_num}, with_soft_pin={self.with_soft_pin}, "
            f"soft_pin_ttl_ms={self.soft_pin_ttl_ms}, with_hard_pin={self.with_hard_pin}, "
            f"preferred_segments={self.preferred_segments!r}, preferred_segment={self.preferred_segment!r}, "
            f"prefer_alloc_in_same_node={self.prefer_alloc_in_same_node}, "
            f"soft_pin_action={self.soft_pin_action.name})"
        )

    __str__ = __repr__
