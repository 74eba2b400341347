"""Peer processes that speak JSON lines, for tests that run an engine's own
code in processes of its own (test_pd_sglang.py, test_pd_vllm.py): commands
go in on stdin, one reply per line comes out on stdout, and the engine's
logs go to a file.

The test side is :class:`PeerProcess`; the peer side calls
:func:`reply_channel` first thing, so that nothing the engine prints can
mix with the replies.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Callable, List, Optional

# How long one step may wait inside a peer unless the test says otherwise.
STEP_S = 20


class PeerProcess:
    """One peer: ``argv`` run with ``env``, its stderr in ``log``."""

    def __init__(self, role: str, argv: List[str], env: dict, log: Path) -> None:
        self.role = role
        self.log_path = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env
            )
        self._replies: "queue.Queue[Optional[dict]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        #: The first reply (what the peer runs, what it registered).
        self.hello: dict = {}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(json.loads(line))
        self._replies.put(None)  # the process is gone

    def reply(self, timeout: float) -> dict:
        """The peer's next reply, within ``timeout`` seconds."""
        try:
            r = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.role}: no answer within {timeout} s\n{self.log()}") from None
        if r is None:
            raise AssertionError(f"{self.role} exited with {self.proc.wait()}\n{self.log()}")
        return r

    def ask(self, op: str, timeout: float = STEP_S, **args) -> dict:
        """Runs one command in the peer; its reply. Steps that wait inside
        the peer wait at most ``timeout``; the answer may take a little
        longer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "timeout": timeout, **args}) + "\n")
        self.proc.stdin.flush()
        return self.reply(timeout + 5)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def request_exit(self) -> None:
        """Tells the peer to exit (it also does at the end of its stdin)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
        except OSError:  # it is gone already
            pass

    def close(self) -> None:
        """Waits for the peer to exit after :meth:`request_exit`; kills it
        if it has not within 10 s."""
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        """The end of the peer's log, for failure messages."""
        return f"--- {self.role} log ({self.log_path}):\n" + self.log_path.read_bytes()[-4000:].decode(errors="replace")


def close_all(peers: List[PeerProcess]) -> None:
    """Stops every peer, all at once: each may take seconds to shut its
    engine down."""
    for p in peers:
        p.request_exit()
    for p in peers:
        p.close()


def reply_channel() -> Callable[..., None]:
    """In a peer: takes stdout for replies alone (what the engine prints
    goes to stderr, the log) and returns the function that sends one."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(**fields) -> None:
        out.write(json.dumps(fields) + "\n")
        out.flush()

    return reply
