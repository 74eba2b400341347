"""The master's KV event stream as routers read it: pyzmq (libzmq) SUB
sockets and msgpack on real masters started with ``--kv-events-endpoint``,
a DEALER asking ``--kv-events-replay-endpoint`` for missed batches, and
bench/kv_router_sim.py routing by longest cached prefix over two pools."""

from __future__ import annotations

import json
import struct
import time
import urllib.request
from typing import Iterator, List, Tuple

import msgpack
import pytest
import zmq

import kvpool
from conftest import Cluster, free_port, load_bench_script, new_cluster

SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.fixture(scope="module")
def pools() -> Iterator[List[Tuple[Cluster, str]]]:
    """Two pools, each publishing its KV events."""
    out = []
    try:
        for name in ("a", "b"):
            endpoint = f"tcp://127.0.0.1:{free_port()}"
            c = new_cluster(store_size="64MiB", master_args=[
                "--kv-events-endpoint", endpoint, "--kv-events-backend-id", f"pool-{name}"])
            out.append((c, endpoint))
        yield out
    finally:
        for c, _ in out:
            c.stop()


def test_events_decode_with_libzmq_and_msgpack(pools):
    c, endpoint = pools[0]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    client = kvpool.Client(c.master)
    key = f"meta-llama-Llama-3.1-8B-Instruct_{SHA}_3_v"
    try:
        # ZMQ's slow joiner: put probes until the subscription is live.
        for i in range(100):
            client.put(f"probe/{i}", b"p")
            if sub.poll(200):
                break
        else:
            pytest.fail("no KV event within 20 s of subscribing")
        client.put(key, b"x" * 4096)
        client.remove(key)
        got = {}
        seqs = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            if not sub.poll(500):
                continue
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"" and len(seq) == 8
            seqs.append(struct.unpack(">Q", seq)[0])
            ms, events, dp_rank = msgpack.unpackb(payload, raw=False)
            assert ms > 1_700_000_000_000 and dp_rank == 0
            for e in events:
                if e["object_key"] == key:
                    got[e["event_type"]] = e
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        stored, removed = got["stored"], got["removed"]
        assert stored["type"] == "BlockStored" and removed["type"] == "BlockRemoved"
        assert removed["event_id"] > stored["event_id"]
        assert stored["engine"] == "sglang" and stored["rank"] == 3
        assert stored["model_name"] == "meta-llama-Llama-3.1-8B-Instruct"
        assert stored["block_hash"] == SHA
        assert stored["seq_hashes"] == [int(SHA[:16], 16)] == stored["block_hashes"]
        assert stored["backend_id"] == "pool-a" and stored["medium"] == "cpu"
        assert stored["token_ids"] is None and stored["parent_hash"] is None
    finally:
        client.close()
        sub.close(0)
        ctx.term()
    status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/kv_events/status"))
    assert status["status"]["enabled"] and status["status"]["dropped_events"] == 0


def replay_from(dealer: "zmq.Socket", start: int) -> List[Tuple[int, bytes]]:
    """Asks the replay socket for every kept batch from ``start``, as vLLM's
    subscribers do; the batches up to the end marker."""
    dealer.send_multipart([b"", struct.pack(">Q", start)])
    out = []
    while True:
        assert dealer.poll(10_000), "no replay answer within 10 s"
        frames = dealer.recv_multipart()
        assert len(frames) == 4 and frames[0] == b"" and frames[1] == b"", frames
        if frames[2] == (-1).to_bytes(8, "big", signed=True):
            assert frames[3] == b""
            return out
        out.append((struct.unpack(">Q", frames[2])[0], frames[3]))


def test_missed_batches_are_replayed_over_libzmq():
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    c = new_cluster(store_size="64MiB", master_args=[
        "--kv-events-endpoint", endpoint, "--kv-events-replay-endpoint", replay])
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    client = kvpool.Client(c.master)
    try:
        # Published with nobody subscribed: a late subscriber asks for them.
        wanted = {f"replay/{i}" for i in range(8)}
        for k in sorted(wanted):
            client.put(k, b"v")
        dealer.connect(replay)
        deadline = time.monotonic() + 10
        while True:
            batches = replay_from(dealer, 1)
            keys = {e["object_key"] for _, p in batches for e in msgpack.unpackb(p, raw=False)[1]}
            if wanted <= keys or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert wanted <= keys, keys
        seqs = [s for s, _ in batches]
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        # From the middle: the same batches, byte for byte.
        assert replay_from(dealer, seqs[-1]) == batches[-1:]
        assert replay_from(dealer, seqs[-1] + 1) == []
    finally:
        client.close()
        dealer.close(0)
        ctx.term()
        c.stop()


def test_router_by_longest_cached_prefix_beats_random(pools):
    sim = load_bench_script("kv_router_sim")
    specs = [f"{c.master},{endpoint},127.0.0.1:{c.metrics_port}" for c, endpoint in pools]
    r = sim.run(specs, conversations_n=12, turns=6, systems=2, seed=11)
    print(json.dumps(r, indent=1))
    prefix, rand = r["prefix"], r["random"]
    # Every request's view of the pool it picked matched the pool.
    assert prefix["view_agrees"] == 1.0, r
    assert rand["view_agrees"] == 1.0, r
    assert r["events"]["unseen"] == 0 and r["events"]["gaps"] == 0, r
    # Later turns find their earlier turns where the router sent them.
    assert prefix["hit_rate"] > rand["hit_rate"] + 0.1, r
    assert prefix["hit_rate"] > 0.6, r
