"""The master's KV event stream as routers read it: pyzmq (libzmq) SUB
sockets and msgpack on real masters started with ``--kv-events-endpoint``,
and bench/kv_router_sim.py routing by longest cached prefix over two
pools."""

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
