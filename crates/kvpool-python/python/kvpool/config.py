"""``ReplicateConfig`` and ``SoftPinAction``: per-put placement and pinning,
attribute-compatible with Mooncake's classes of the same names."""

from __future__ import annotations

import enum
import operator
from typing import Any, Iterable, List, Optional, Tuple

__all__ = ["ReplicateConfig", "SoftPinAction"]

_U64_MAX = 2**64 - 1


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin (Mooncake's enum)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


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


class ReplicateConfig:
    """Replication and pinning for a put. Fields as in Mooncake:
    ``replica_num`` copies on distinct segments; ``with_soft_pin`` /
    ``soft_pin_action`` (evict last, for ``soft_pin_ttl_ms`` or the master's
    default); ``with_hard_pin`` (never evict); ``preferred_segments`` /
    ``preferred_segment`` (segment names to place on first);
    ``prefer_alloc_in_same_node`` (prefer the segment this process lends)."""

    __slots__ = (
        "_replica_num",
        "_with_soft_pin",
        "_soft_pin_ttl_ms",
        "_with_hard_pin",
        "_preferred_segments",
        "_preferred_segment",
        "_prefer_alloc_in_same_node",
        "_soft_pin_action",
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
    ) -> None:
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.with_hard_pin = with_hard_pin
        self.preferred_segments = list(preferred_segments or [])
        self.preferred_segment = preferred_segment
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.soft_pin_action = soft_pin_action

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
        self._with_soft_pin = bool(v)

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
        self._with_hard_pin = bool(v)

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
        self._prefer_alloc_in_same_node = bool(v)

    @property
    def soft_pin_action(self) -> SoftPinAction:
        """``ENABLE`` pins, ``DISABLE`` does not, ``PRESERVE`` follows ``with_soft_pin``."""
        return self._soft_pin_action

    @soft_pin_action.setter
    def soft_pin_action(self, v: SoftPinAction) -> None:
        try:
            self._soft_pin_action = SoftPinAction(int(v))
        except (TypeError, ValueError):
            raise TypeError(f"soft_pin_action must be a SoftPinAction, got {v!r}") from None

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
