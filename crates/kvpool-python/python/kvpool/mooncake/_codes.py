"""Mooncake's return codes, the longest soft pin a write may ask for, and
the logger every part of :mod:`kvpool.mooncake` writes to (named
``kvpool.mooncake``, whichever module logs)."""

from __future__ import annotations

import logging

from .. import _native

logger = logging.getLogger("kvpool.mooncake")

# The numbers come from the native module, the one table of codes.
_CODES = _native.CODES
OK = _CODES["OK"]
INTERNAL_ERROR = _CODES["INTERNAL_ERROR"]
NO_AVAILABLE_HANDLE = _CODES["NO_AVAILABLE_HANDLE"]
INVALID_PARAMS = _CODES["INVALID_PARAMS"]
OBJECT_NOT_FOUND = _CODES["OBJECT_NOT_FOUND"]
OBJECT_ALREADY_EXISTS = _CODES["OBJECT_ALREADY_EXISTS"]
TRANSFER_FAIL = _CODES["TRANSFER_FAIL"]
NOT_SUPPORTED = _CODES["NOT_SUPPORTED"]
# Mooncake's name for -1100 in its file calls (`save_tensor`, local disk
# segments); kvpool's name for the number is UNAUTHORIZED.
FILE_NOT_FOUND = _CODES["UNAUTHORIZED"]

#: Longest soft pin a write may ask for (Mooncake's limit: one day).
MAX_SOFT_PIN_MS = 86_400_000
