"""Helpers shared by the fault-latency bench (bench/faults_latency.sh)."""
import base64
import hashlib
import json
import re
import urllib.request

import numpy as np

# Mooncake / kvpool result codes the bench names.
OK = 0
OBJECT_NOT_FOUND = -704  # a miss
TRANSFER_FAIL = -800


def value_for(key: str, size: int) -> bytes:
    """The value stored under ``key``: ``size`` pseudo-random bytes seeded by
    the key, so any reader can check what it got without a table."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).bytes(size)


def etcd_range(endpoint: str, key: bytes, prefix: bool = False, timeout: float = 2.0):
    """(key, value) pairs from etcd's v3 JSON gateway at ``endpoint``."""
    body = {"key": base64.b64encode(key).decode()}
    if prefix:
        end = bytearray(key)
        end[-1] += 1
        body["range_end"] = base64.b64encode(bytes(end)).decode()
    req = urllib.request.Request(f"http://{endpoint}/v3/kv/range", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.load(r)
    return [(base64.b64decode(kv["key"]), base64.b64decode(kv.get("value", ""))) for kv in out.get("kvs", [])]


def etcd_leader_port(endpoint: str, key: bytes):
    """The RPC port named by the leader key (kvpool: /kvpool/<cluster>/master,
    Mooncake: mooncake-store/<cluster>/master_view), or None."""
    try:
        kvs = etcd_range(endpoint, key)
    except Exception:  # noqa: BLE001
        return None
    for _, v in kvs:
        m = re.search(rb":(\d+)", v)
        if m:
            return int(m.group(1))
    return None


def set_config(cfg, **kw):
    """Sets the attributes a ReplicateConfig has (Mooncake's pybind object
    and kvpool's class differ in which optional ones exist)."""
    for k, v in kw.items():
        try:
            setattr(cfg, k, v)
        except (AttributeError, TypeError):
            pass
    return cfg
