"""SGLang's own Mooncake PD transfer code, run on kvpool's transfer engine
with no Mooncake in the loop.

A prefill and, for each test, a decode, each its own process set up as
SGLang 0.5.23's scheduler sets itself up (see pd_sglang_peer.py), with
kvpool's Mooncake shim installed before SGLang imports ``mooncake.engine``.
Everything past that is SGLang's: ``MooncakeTransferEngine`` over the
engine, ``MooncakeKVManager``, ``MooncakeKVSender`` / ``MooncakeKVReceiver``,
the bootstrap server, and the ZMQ control messages between the two sides.
The peers make the calls the scheduler's prefill and decode queues make
(create, init, send or send_metadata, poll), without a model or the
scheduler's loop. The KV buffers are a real ``MHATokenToKVPool`` in host
memory (3 layers, a K and a V buffer each), the request's metadata SGLang's
``MetadataBuffers``. It proves:

- every process runs kvpool's engine, though the real Mooncake wheel may be
  installed;
- a request's pages land where decode asked for them: prefill pages
  [3, 7, 8, 9] into decode pages [1, 5, 6, 16] in every K and V buffer, byte
  for byte, every other decode page still holding its guard pattern; its
  metadata (first token, room) lands in decode's slot; sender and receiver
  both see ``KVPoll.Success``;
- a transfer that cannot land is a failure, promptly, not a hang or wrong
  bytes: into a decode whose KV memory is unregistered (kvpool's engine
  refuses the writes; sender and receiver both see ``KVPoll.Failed``,
  nothing lands) and into a decode process that died;
- prefill's failed-session probe (``send_probe``) tells the two apart: once
  the first decode registers its memory again, the probe clears its session
  and the next request transfers; the dead decode's session stays failed.

Stubbed: the scheduler's torch.distributed process groups are not built
(SGLang's ``initialize_model_parallel`` imports ``openai``, which the test
set does not install); ``pp_group`` is set to None, which the PD code reads
only to build pipeline-parallel consensus when pp_size > 1.

Runs when SGLang is installed; KVPOOL_TEST_SGLANG=1 makes a missing SGLang
a failure, =0 skips. No kvpool cluster is needed.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest

from conftest import free_port
from peers import PeerProcess, close_all
from pd_sglang_peer import FIRST_TOKEN, GUARD, ITEM_LEN, LAYERS, prefill_bytes

if os.environ.get("KVPOOL_TEST_SGLANG") == "0":
    pytest.skip("KVPOOL_TEST_SGLANG=0", allow_module_level=True)
# Only the peers import SGLang (~10 s of CPU each); this process just looks.
if importlib.util.find_spec("sglang") is None and os.environ.get("KVPOOL_TEST_SGLANG") != "1":
    pytest.skip("SGLang is not installed", allow_module_level=True)

PEER = Path(__file__).with_name("pd_sglang_peer.py")

# Decode page 0 is SGLang's padding page, never handed to a request; 16 is
# the pool's last page, so a write there ends where each registered buffer
# ends. 7-8 -> 5-6 is contiguous on both sides: SGLang makes it one item.
SRC_PAGES = [3, 7, 8, 9]
DST_PAGES = [1, 5, 6, 16]
SRC_AUX, DST_AUX = 1, 2  # metadata slots

STARTUP_S = 180  # four processes importing SGLang on a small machine
# A transfer that cannot land fails within this: refused, not timed out
# (each peer's engine gives up on a call after MC_TRANSFER_TIMEOUT=10 s).
FAIL_WITHIN_S = 5


class Peer(PeerProcess):
    """A pd_sglang_peer.py process (its stderr, SGLang's logs, in a file)."""

    def __init__(self, role: str, bootstrap_port: int, log: Path) -> None:
        env = dict(
            os.environ,
            # SGLang advertises this host's NIC address otherwise; kvpool's
            # engine serves beyond loopback only with a cluster secret.
            SGLANG_HOST_IP="127.0.0.1",
            MC_TRANSFER_TIMEOUT="10",  # the engine's bound on one call (default 30 s)
            # Prefill probes a failed decode session every 30 s by default.
            SGLANG_FAILED_SESSION_PROBE_INTERVAL_S="0.2",
        )
        super().__init__(role, [sys.executable, str(PEER), role, str(bootstrap_port)], env, log)


class Deployment:
    """A prefill (with SGLang's bootstrap server) and decodes for the tests
    to take, one each. They all start at once: each spends ~10 s of CPU
    importing SGLang."""

    DECODES = 3  # one per test below

    def __init__(self) -> None:
        self.bootstrap_port = free_port()
        self.bootstrap_addr = f"127.0.0.1:{self.bootstrap_port}"
        self.peers: List[Peer] = []
        self._spare: List[Peer] = []

    def start(self, workdir: Path) -> None:
        self.peers.append(Peer("prefill", self.bootstrap_port, workdir / "prefill.log"))
        for i in range(self.DECODES):
            self.peers.append(Peer("decode", self.bootstrap_port, workdir / f"decode-{i}.log"))
        for p in self.peers:
            p.hello = p.reply(STARTUP_S)
            if "import_error" in p.hello:
                why = f"SGLang's PD code does not import: {p.hello['import_error']}"
                if os.environ.get("KVPOOL_TEST_SGLANG") == "1":
                    raise AssertionError(why)
                pytest.skip(why)
            assert p.hello["engine_class"] == "kvpool.engine.TransferEngine", p.hello
            assert p.hello["mooncake_engine_module"] == "kvpool.engine", p.hello
        self._spare = self.peers[1:]

    @property
    def prefill(self) -> Peer:
        return self.peers[0]

    def decode(self) -> Peer:
        """A started decode no test has used."""
        return self._spare.pop()

    def close(self) -> None:
        close_all(self.peers)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    d = Deployment()
    try:
        d.start(tmp_path_factory.mktemp("pd-sglang"))
        yield d
    finally:
        d.close()


def bootstrap(pd: Deployment, decode: Peer, room: int) -> None:
    """A request for ``room`` reaches both sides, as the router sends it:
    prefill opens a sender; decode a receiver, which asks the bootstrap
    server for prefill's address and sends it decode's page list; prefill's
    sender has the list."""
    assert pd.prefill.ask("sender", room=room)["state"] == "Bootstrapping"
    r = decode.ask("receive", room=room, bootstrap_addr=pd.bootstrap_addr, pages=DST_PAGES, aux=DST_AUX)
    assert r["state"] == "WaitingForInput", r
    assert pd.prefill.ask("bootstrapped", room=room)["state"] == "WaitingForInput"


def transfer(pd: Deployment, decode: Peer, room: int) -> tuple[str, str]:
    """Prefill sends the request's pages; the sender's and then the
    receiver's final state."""
    start = time.monotonic()
    sent = pd.prefill.ask("send", room=room, pages=SRC_PAGES, aux=SRC_AUX)["state"]
    if sent == "Failed":
        assert time.monotonic() - start < FAIL_WITHIN_S, "the failure took a timeout to show"
    return sent, decode.ask("wait", room=room)["state"]


def decode_memory(decode: Peer) -> dict:
    """Decode's KV buffers (pages of bytes, K of each layer then V) and its
    metadata slot."""
    m = decode.ask("memory", aux=DST_AUX)
    m["kv"] = [np.frombuffer(base64.b64decode(b), dtype=np.uint8).reshape(-1, ITEM_LEN) for b in m["kv"]]
    assert len(m["kv"]) == 2 * LAYERS
    return m


def buffer_name(i: int) -> str:
    return f"{('K', 'V')[i // LAYERS]} of layer {i % LAYERS}"


def assert_pages_landed(decode: Peer, room: int) -> None:
    """Decode holds prefill's pages where it asked for them, its guard
    everywhere else, and the request's metadata."""
    memory = decode_memory(decode)
    for i, got in enumerate(memory["kv"]):
        want = np.full_like(got, GUARD)
        want[DST_PAGES] = prefill_bytes(i, got.size).reshape(-1, ITEM_LEN)[SRC_PAGES]
        wrong = [page for page in range(len(got)) if not np.array_equal(got[page], want[page])]
        assert not wrong, f"{buffer_name(i)}: decode pages {wrong} do not hold what they should"
    assert (memory["first_token"], memory["room"]) == (FIRST_TOKEN, room)


def assert_nothing_landed(decode: Peer) -> None:
    """Decode's KV and metadata hold what they held before any transfer."""
    memory = decode_memory(decode)
    for i, got in enumerate(memory["kv"]):
        assert (got == GUARD).all(), f"{buffer_name(i)}: bytes landed in decode's unregistered memory"
    assert (memory["first_token"], memory["room"]) == (0, 0), "metadata landed in decode's unregistered memory"


def test_a_requests_pages_land_in_decodes_pages(pd):
    decode = pd.decode()
    bootstrap(pd, decode, 1001)
    assert transfer(pd, decode, 1001) == ("Success", "Success"), pd.prefill.log() + decode.log()
    assert_pages_landed(decode, 1001)


def test_into_unregistered_memory_both_sides_fail_then_recover(pd):
    decode = pd.decode()
    bootstrap(pd, decode, 2001)
    assert decode.ask("unregister")["ok"]
    assert transfer(pd, decode, 2001) == ("Failed", "Failed"), pd.prefill.log() + decode.log()
    assert_nothing_landed(decode)

    # Prefill now fails every request to this decode's session at once,
    # until its probe (the engine's send_probe) reaches the decode again.
    assert decode.ask("register")["ok"]
    assert not pd.prefill.ask("probed", session=decode.hello["session"])["failed"], pd.prefill.log()
    bootstrap(pd, decode, 2002)
    assert transfer(pd, decode, 2002) == ("Success", "Success"), pd.prefill.log() + decode.log()
    assert_pages_landed(decode, 2002)


def test_to_a_dead_decode_the_transfer_fails(pd):
    decode = pd.decode()
    bootstrap(pd, decode, 3001)
    decode.kill()
    start = time.monotonic()
    assert pd.prefill.ask("send", room=3001, pages=SRC_PAGES, aux=SRC_AUX)["state"] == "Failed", pd.prefill.log()
    assert time.monotonic() - start < FAIL_WITHIN_S, "the failure took a timeout to show"
    # Prefill's probes of the session find no one: it stays failed.
    assert pd.prefill.ask("probed", session=decode.hello["session"], timeout=1)["failed"]
