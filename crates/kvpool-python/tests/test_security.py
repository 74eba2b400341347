"""The Python drop-in against a pool that requires a key of its cluster:
configured by environment only (``KVPOOL_SECRET_FILE``) or a ``setup``
dict key, with no code change; refused with ``UNAUTHORIZED`` (-1100)
without a key, and a client key cannot drop what others stored. The same
with TLS on every plane: the CA in ``KVPOOL_TLS_CA`` is the whole change."""

from __future__ import annotations

import os

import pytest

import kvpool
from kvpool.mooncake import MooncakeDistributedStore

UNAUTHORIZED = -1100


def connect(master: str) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master)
    assert rc == 0, rc
    return s


def test_without_a_key_setup_is_refused(secured_cluster, monkeypatch):
    monkeypatch.delenv("KVPOOL_SECRET_FILE", raising=False)
    monkeypatch.delenv("KVPOOL_SECRET", raising=False)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", secured_cluster.master) == UNAUTHORIZED


def test_a_client_key_from_the_environment_serves_puts_and_gets(secured_cluster, monkeypatch, prefix):
    monkeypatch.setenv("KVPOOL_SECRET_FILE", secured_cluster.keys["client"])
    s = connect(secured_cluster.master)
    try:
        assert s.put(prefix + "a", b"x" * 1000) == 0
        assert s.get(prefix + "a") == b"x" * 1000
        assert s.put_batch([prefix + "b", prefix + "c"], [b"1", b"22"]) == 0
        assert s.get_batch([prefix + "b", prefix + "c"]) == [b"1", b"22"]
        # Dropping everything takes the admin key: refused, nothing lost.
        assert s.remove_all(True) == UNAUTHORIZED
        assert s.is_exist(prefix + "a") == 1
    finally:
        s.close()


def test_lending_memory_takes_the_store_key(secured_cluster, monkeypatch):
    monkeypatch.setenv("KVPOOL_SECRET_FILE", secured_cluster.keys["client"])
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", secured_cluster.master)
    assert rc == UNAUTHORIZED
    monkeypatch.setenv("KVPOOL_SECRET_FILE", secured_cluster.keys["store"])
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", secured_cluster.master) == 0
    s.close()


def test_the_admin_key_in_a_setup_dict_may_drop_everything(secured_cluster, monkeypatch, prefix):
    monkeypatch.delenv("KVPOOL_SECRET_FILE", raising=False)
    s = MooncakeDistributedStore()
    rc = s.setup({
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 0,
        "master_server_address": secured_cluster.master,
        "protocol": "tcp",
        "secret_file": secured_cluster.keys["admin"],
    })
    assert rc == 0
    try:
        assert s.put(prefix + "gone", b"v") == 0
        assert s.remove_all(True) >= 1
        assert s.is_exist(prefix + "gone") == 0
    finally:
        s.close()


def test_a_tls_pool_needs_only_the_environment(tls_cluster, monkeypatch, prefix):
    monkeypatch.setenv("KVPOOL_SECRET_FILE", tls_cluster.keys["client"])
    monkeypatch.delenv("KVPOOL_TLS_CA", raising=False)
    # Plaintext to a TLS-only pool: refused, with the code users branch on.
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", tls_cluster.master) == UNAUTHORIZED
    monkeypatch.setenv("KVPOOL_TLS_CA", os.path.join(tls_cluster.tls_dir, "ca.pem"))
    s = connect(tls_cluster.master)
    try:
        value = os.urandom(300_000)
        assert s.put(prefix + "tls", value) == 0
        assert s.get(prefix + "tls") == value
        keys = [prefix + f"tls-{i}" for i in range(16)]
        values = [os.urandom(4096 + i) for i in range(16)]
        assert s.put_batch(keys, values) == 0
        assert s.get_batch(keys) == values
    finally:
        s.close()


def test_tls_files_in_a_setup_dict_and_the_client(tls_cluster, monkeypatch, prefix):
    for var in ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_SECRET_FILE"):
        monkeypatch.delenv(var, raising=False)
    ca = os.path.join(tls_cluster.tls_dir, "ca.pem")
    s = MooncakeDistributedStore()
    assert s.setup({
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 0,
        "master_server_address": tls_cluster.master,
        "protocol": "tcp",
        "secret_file": tls_cluster.keys["client"],
        "tls_ca": ca,
    }) == 0
    try:
        assert s.put(prefix + "dict", b"d" * 5000) == 0
    finally:
        s.close()
    with kvpool.Client(tls_cluster.master, secret_file=tls_cluster.keys["client"], tls_ca=ca) as c:
        assert c.get(prefix + "dict") == b"d" * 5000
    # A CA file that does not exist is a clear error, not a hang.
    with pytest.raises(kvpool.KvpoolError) as e:
        kvpool.Client(tls_cluster.master, secret_file=tls_cluster.keys["client"], tls_ca=ca + ".missing")
    assert "ca.pem.missing" in str(e.value)


def test_a_tenant_setting_keeps_its_objects_apart(secured_cluster, monkeypatch, prefix):
    """``tenant`` (``KVPOOL_TENANT``) with the store key derives the
    tenant's key: the same key names are then another namespace, which a
    client without the tenant neither sees nor can remove."""
    monkeypatch.setenv("KVPOOL_SECRET_FILE", secured_cluster.keys["store"])
    acme = MooncakeDistributedStore()
    assert acme.setup({"master_server_addr": secured_cluster.master, "global_segment_size": 0,
                       "tenant": "acme"}) == 0
    monkeypatch.setenv("KVPOOL_SECRET_FILE", secured_cluster.keys["client"])
    plain = connect(secured_cluster.master)
    try:
        assert acme.put(prefix + "t", b"tenant bytes") == 0
        assert plain.put(prefix + "t", b"plain bytes") == 0
        assert acme.get(prefix + "t") == b"tenant bytes"
        assert plain.get(prefix + "t") == b"plain bytes"
        assert plain.remove(prefix + "t", True) == 0
        assert acme.is_exist(prefix + "t") == 1
        # Naming the tenant's namespace outright: refused.
        assert plain.remove("\x01acme\x01" + prefix + "t", True) == UNAUTHORIZED
        assert acme.get(prefix + "t") == b"tenant bytes"
        # A tenant needs a key that proves it.
        bad = MooncakeDistributedStore()
        assert bad.setup({"master_server_addr": secured_cluster.master, "global_segment_size": 0,
                          "tenant": "acme"}) != 0
    finally:
        acme.close()
        plain.close()
