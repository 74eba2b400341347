"""vLLM 0.33's own Mooncake PD connector (``MooncakeConnector``,
``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py``)
moving a request's KV from a prefill to a decode on kvpool's transfer
engine, with no Mooncake in the loop.

A prefill (``kv_producer``) and a decode (``kv_consumer``), each its own
process set up as a one-rank vLLM engine's worker (see pd_vllm_peer.py),
with kvpool's Mooncake shim installed before vLLM imports
``mooncake.engine``. Everything past that is vLLM's: the KV cache its
planner and allocator make (one host buffer, a view per layer), the
connector's worker, which registers it with the engine
(``batch_register_memory``), vLLM's bootstrap server (FastAPI on uvicorn,
in the prefill) that the decode queries over HTTP for the prefill's ZMQ
side channel, the pull request and its answer over ZMQ, and the prefill's
``batch_transfer_sync_write`` into the decode's blocks. The requests reach
the workers as the ``MooncakeConnectorMetadata`` the scheduler side builds
(``add_new_req`` with the request's ``kv_transfer_params``: the prefill's
when it is admitted and again when it finishes with its blocks, the
decode's with the blocks it allocated), and the test reads back what the
model runner reads after each step (``get_transfer_results``,
``get_block_ids_with_load_errors``). It proves:

- both processes run kvpool's engine, though the real Mooncake wheel may be
  installed;
- a request's blocks land where decode asked for them: prefill blocks
  [2, 5, 6] into decode blocks [1, 14, 15] of both layers (5-6 -> 14-15 is
  contiguous on both sides, so vLLM sends it as one item; 15 ends the
  registered buffer), byte for byte, every other decode block still holding
  its guard bytes; the decode reports the request received with no load
  errors, the prefill reports it sent;
- a transfer that cannot land is a failure, promptly, not a hang or wrong
  bytes: into a decode whose KV memory is unregistered (vLLM's sleep mode,
  ``unregister_kv_caches``) kvpool's engine refuses the writes
  (``batch_transfer_sync_write`` returns -1); vLLM's prefill answers the
  pull with the request in ``err_reqs``, and the decode reports the
  request finished with every one of its blocks in
  ``get_block_ids_with_load_errors()``, which is how vLLM's scheduler learns
  to recompute them. Nothing lands, the prefill does not report the
  request sent (it keeps the blocks until VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT)
  and counts a failed transfer; once the decode registers its memory again
  (``restore_kv_caches``) the next request transfers.

Stubbed, nothing else: ``torch.accelerator.current_device_index`` (the
worker binds its sender threads to the current accelerator; the test
venv's torch is a CUDA build on a machine without a GPU, where that call
raises: a CPU engine is device 0). Not stubbed but worth knowing: the
distributed groups are vLLM's own gloo CPU setup on one rank; no model is
loaded, so vLLM resolves the attention backend by its own fallback (the
CPU platform's default, CPU_ATTN, whose only layout is the connector's
LBHNC); the scheduler's ``Request`` objects are not built, only the
metadata the scheduler connector makes from them.

vLLM comes from the add-on directory test_vllm.py uses (``KVPOOL_VLLM_SITE``,
default ``~/.cache/kvpool/vllm-site``); without it, or without the uvicorn
the bootstrap server needs, the module fails, unless ``KVPOOL_TEST_VLLM=0``
(then it is skipped). No kvpool cluster is needed.
"""

from __future__ import annotations

import base64
import os
import sys
import time
import uuid
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest

from conftest import free_port
from peers import PeerProcess, close_all
from pd_vllm_peer import BLOCK_BYTES, BLOCKS, GUARD, LAYERS, prefill_bytes

VLLM_VERSION = "0.33.0"
SITE = os.environ.get("KVPOOL_VLLM_SITE") or str(Path.home() / ".cache" / "kvpool" / "vllm-site")
PEER = Path(__file__).with_name("pd_vllm_peer.py")


def _vllm_missing() -> Optional[str]:
    """Why the peers cannot import vLLM's PD connector from the add-on
    directory, or None."""
    if not (Path(SITE) / "vllm").is_dir():
        return f"vLLM not installed in {SITE}"
    if not (Path(SITE) / f"vllm-{VLLM_VERSION}.dist-info").is_dir():
        return f"{SITE} holds a vLLM other than {VLLM_VERSION}"
    # The bootstrap server runs on uvicorn (vLLM's fastapi[standard]); the
    # store connector test does not need it.
    if not (Path(SITE) / "uvicorn").is_dir():
        return f"uvicorn (for vLLM's Mooncake bootstrap server) not installed in {SITE}"
    return None


_WHY = _vllm_missing()
if _WHY is not None and os.environ.get("KVPOOL_TEST_VLLM") == "0":
    pytest.skip(f"{_WHY} (KVPOOL_TEST_VLLM=0)", allow_module_level=True)

# Prefill blocks -> decode blocks of one request. Block 0 is vLLM's null
# block, never a request's.
SRC_BLOCKS = [2, 5, 6]
DST_BLOCKS = [1, 14, 15]
STARTUP_S = 120  # two processes importing vLLM on a small machine
# A transfer that cannot land is reported within this: refused, not timed
# out (the engine's own bound on one call is MC_TRANSFER_TIMEOUT=10 s).
FAIL_WITHIN_S = 5


class Peer(PeerProcess):
    """A pd_vllm_peer.py process (its stderr, vLLM's logs, in a file)."""

    def __init__(self, role: str, engine_id: str, env: dict, log: Path) -> None:
        self.engine_id = engine_id
        super().__init__(role, [sys.executable, str(PEER), role, engine_id, SITE], env, log)


class Deployment:
    """A prefill with vLLM's bootstrap server and a decode, started at once
    (each spends seconds of CPU importing vLLM)."""

    def __init__(self) -> None:
        self.bootstrap_port = free_port()
        #: What the router puts in the decode's kv_transfer_params.
        self.bootstrap_addr = f"http://127.0.0.1:{self.bootstrap_port}"
        self.peers: List[Peer] = []

    def start(self, workdir: Path) -> None:
        env = dict(
            os.environ,
            VLLM_TARGET_DEVICE="cpu",
            # vLLM advertises this host's NIC address otherwise (get_ip), and
            # kvpool's engine serves beyond loopback only with a cluster secret.
            VLLM_HOST_IP="127.0.0.1",
            VLLM_MOONCAKE_BOOTSTRAP_PORT=str(self.bootstrap_port),
            MC_TRANSFER_TIMEOUT="10",  # the engine's bound on one call (default 30 s)
        )
        for role in ("prefill", "decode"):
            self.peers.append(Peer(role, f"{role}-{uuid.uuid4().hex[:8]}", env, workdir / f"{role}.log"))
        for p in self.peers:
            p.hello = p.reply(STARTUP_S)
            assert p.hello["engine_class"] == "kvpool.engine.TransferEngine", p.hello
            assert p.hello["mooncake_engine_module"] == "kvpool.engine", p.hello

    @property
    def prefill(self) -> Peer:
        return self.peers[0]

    @property
    def decode(self) -> Peer:
        return self.peers[1]

    def close(self) -> None:
        close_all(self.peers)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    if _WHY is not None:
        pytest.fail(
            f"{_WHY}: pip install --no-deps --target {SITE} vllm=={VLLM_VERSION} uvicorn "
            "-r crates/kvpool-python/tests/requirements-vllm.txt (or KVPOOL_TEST_VLLM=0 to skip)",
            pytrace=False,
        )
    d = Deployment()
    try:
        d.start(tmp_path_factory.mktemp("pd-vllm"))
        yield d
    finally:
        d.close()


def transfer(pd: Deployment, n: int, src: List[int], dst: List[int]) -> dict:
    """Request ``n`` from the router's point of view: the prefill admits it,
    prefills it into ``src`` and finishes (length capped: the one token of a
    prefill-only request); the decode then asks for it in ``dst`` and waits
    until its worker reports the receive finished. The decode's last
    report (``done``, ``load_errors``) and how long it took."""
    transfer_id = f"xfer-{n}-{uuid.uuid4().hex[:8]}"
    p_req, d_req = f"p-{n}", f"d-{n}"
    assert pd.prefill.ask("admit", req=p_req, transfer_id=transfer_id)["ok"]
    assert pd.prefill.ask("finish", req=p_req, transfer_id=transfer_id, blocks=src)["ok"]
    start = time.monotonic()
    assert pd.decode.ask("load", req=d_req, transfer_id=transfer_id, blocks=dst,
                         remote_engine_id=pd.prefill.engine_id, remote_bootstrap_addr=pd.bootstrap_addr)["ok"]
    r = pd.decode.ask("wait", req=d_req, side="recv")
    r["seconds"] = time.monotonic() - start
    assert r["done"], f"decode never reported {d_req} received\n{pd.decode.log()}\n{pd.prefill.log()}"
    return r


def decode_blocks(pd: Deployment) -> List[np.ndarray]:
    """Decode's KV cache, one array of ``BLOCKS`` rows of bytes a layer."""
    kv = pd.decode.ask("memory")["kv"]
    assert len(kv) == len(LAYERS)
    return [np.frombuffer(base64.b64decode(b), dtype=np.uint8).reshape(BLOCKS, BLOCK_BYTES) for b in kv]


def assert_decode_holds(pd: Deployment, landed: dict) -> None:
    """Decode block ``d`` of every layer holds prefill block ``landed[d]``;
    every other decode block its guard bytes."""
    for layer, got in enumerate(decode_blocks(pd)):
        want = np.full_like(got, GUARD)
        src = prefill_bytes(layer)
        for d, s in landed.items():
            want[d] = src[s]
        wrong = [b for b in range(BLOCKS) if not np.array_equal(got[b], want[b])]
        assert not wrong, f"{LAYERS[layer]}: decode blocks {wrong} do not hold what they should"


def test_layout_is_what_vllm_registers(pd):
    """Each side registered its one KV buffer with the engine, two layer
    regions of BLOCKS blocks inside it: the layout the transfer relies on."""
    for p in pd.peers:
        h = p.hello
        assert h["layout"] == "LBHNC"
        (base, size), = h["registered"]
        assert size == len(LAYERS) * BLOCKS * BLOCK_BYTES
        assert h["regions"] == [[base + i * BLOCKS * BLOCK_BYTES, BLOCK_BYTES] for i in range(len(LAYERS))]
        assert h["caches"] == [r[0] for r in h["regions"]]


def test_a_requests_blocks_land_in_decodes_blocks(pd):
    r = transfer(pd, 1, SRC_BLOCKS, DST_BLOCKS)
    assert r["load_errors"] == [], pd.decode.log()
    assert_decode_holds(pd, dict(zip(DST_BLOCKS, SRC_BLOCKS)))
    # The prefill's worker releases the request's blocks once it is sent.
    assert pd.prefill.ask("wait", req="p-1", side="send")["done"], pd.prefill.log()
    stats = pd.prefill.ask("stats")["stats"]
    # Per layer, block 2 alone and blocks 5-6 as one item: 4 items.
    assert stats["num_descriptors"] == [2 * len(LAYERS)], stats
    assert stats["bytes_transferred"] == [len(SRC_BLOCKS) * len(LAYERS) * BLOCK_BYTES], stats


def test_into_unregistered_memory_load_errors_then_recover(pd):
    before = decode_blocks(pd)
    assert pd.decode.ask("unregister")["ok"]
    dst = [3, 4, 8]
    r = transfer(pd, 2, SRC_BLOCKS, dst)
    assert r["seconds"] < FAIL_WITHIN_S, f"the failure took {r['seconds']:.1f} s to show"
    # vLLM's defined failure report: the request is finished, every block it
    # was to receive is a load error (the scheduler recomputes them).
    assert r["load_errors"] == dst, pd.decode.log()
    after = decode_blocks(pd)
    for layer in range(len(LAYERS)):
        assert np.array_equal(after[layer], before[layer]), f"{LAYERS[layer]}: bytes landed in unregistered memory"
    assert not pd.prefill.ask("wait", req="p-2", side="send", timeout=0.5)["done"]
    assert pd.prefill.ask("stats")["stats"].get("num_failed_transfers") == [1]

    # Registered again: the next request lands, the earlier ones untouched.
    assert pd.decode.ask("restore")["ok"]
    r = transfer(pd, 3, [7], [10])
    assert r["load_errors"] == [], pd.decode.log()
    assert_decode_holds(pd, {**dict(zip(DST_BLOCKS, SRC_BLOCKS)), 10: 7})
