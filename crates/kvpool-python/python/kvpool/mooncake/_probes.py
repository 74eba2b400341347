"""Mooncake 0.3.14's existence probes: ``probe_key`` and
``batch_probe_key``, which (unlike ``is_exist``) take no read lease, or with
the ``"LastHitOnly"`` policy lease one group of keys only."""

from __future__ import annotations

import operator
from typing import List

from ._codes import INVALID_PARAMS

#: ``batch_probe_key``'s policies (case-sensitive, as Mooncake's).
PROBE_POLICIES = ("none", "LastHitOnly")


class _ProbesMixin:
    """Lease-free existence probes (state: see ``MooncakeDistributedStore.__init__``)."""

    def probe_key(self, key: str) -> int:
        """1 if ``key`` exists now, 0 if not, negative on error; takes no
        read lease, so the object may be removed or evicted right after."""
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        return self._exists([key], False)[0]

    def batch_probe_key(self, keys: List[str], policy: str = "none", candidate_size: int = 1) -> List[int]:
        """Per key 1, 0 or a negative code. ``policy="none"`` takes no lease;
        ``"LastHitOnly"`` splits ``keys`` into consecutive groups of
        ``candidate_size`` and leases the last group found whole (all 1), as
        ``is_exist`` would: −600 for every key if ``candidate_size`` is 0 or
        does not divide ``len(keys)``. Another policy raises ValueError."""
        if not isinstance(policy, str):
            raise TypeError(f"policy must be a str, got {type(policy).__name__}")
        size = operator.index(candidate_size)
        if size < 0:
            raise TypeError(f"candidate_size must be a non-negative int, got {size}")
        if policy not in PROBE_POLICIES:
            raise ValueError(f"Unknown batch_probe_key policy: {policy}")
        keys = list(keys)
        if not keys:
            return []
        if policy == "none" or self._client is None:
            return self._exists(keys, False)
        if size == 0 or len(keys) % size:
            return [INVALID_PARAMS] * len(keys)
        found = self._exists(keys, False)
        hit = [g for g in range(0, len(keys), size) if all(rc == 1 for rc in found[g:g + size])]
        if hit:
            # Two calls, so the groups that were not chosen stay unleased;
            # the chosen group's answers are the later (leased) ones.
            g = hit[-1]
            found[g:g + size] = self._exists(keys[g:g + size], True)
        return found
