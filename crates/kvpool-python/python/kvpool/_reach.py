"""Whether a client's master answers, for the engines' adapters.

An unreachable cache must cost a miss, not a wait: every call to a master
that does not answer (dead, paused or cut off) waits out the client's
retries, about 10 s, on whichever engine thread made it. The adapters check
:class:`Reachability` first and answer a miss or a failure at once."""

from __future__ import annotations

import logging
import threading
from typing import Any

#: Seconds without an answer to the client's heartbeats (a master asks for
#: one a second at most) after which the pool is taken as unreachable.
SILENCE = 3.0


class Reachability:
    """Whether a native client's master answered its heartbeats within
    :data:`SILENCE`, logging each change once to ``log``."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._was = True

    def check(self, client: Any) -> bool:
        """Whether ``client`` (a ``kvpool._native.Client``, or ``None`` before
        set-up) heard from its master lately."""
        now = client is not None and client.master_silent_for() < SILENCE
        with self._lock:
            changed, self._was = now != self._was, now
        if changed and now:
            self._log.info("kvpool answers again: lookups, reads and writes go to the pool")
        elif changed:
            self._log.warning("kvpool does not answer: lookups miss and reads and writes fail at once")
        return now
