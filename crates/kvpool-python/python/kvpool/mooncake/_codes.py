"""Mooncake's return codes, the longest soft pin a write may ask for, and
the logger every part of :mod:`kvpool.mooncake` writes to (named
``kvpool.mooncake``, whichever module logs)."""

from __future__ import annotations

import logging

logger = logging.getLogger("kvpool.mooncake")

OK = 0
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
TRANSFER_FAIL = -800
NOT_SUPPORTED = -1012
FILE_NOT_FOUND = -1100

#: Longest soft pin a write may ask for (Mooncake's limit: one day).
MAX_SOFT_PIN_MS = 86_400_000
