"""The log source's options that reach its ledger client, without Spark or servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.spark.options import QuireOptions


def test_zookeeper_options_reach_the_ledger_client(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    digest = tmp_path / "zk.digest"
    opts = QuireOptions.parse({"metadata": "zk://zk1:2181/q", "log": "events",
                               "zookeeper_digest_file": str(digest)})
    assert opts.client_config.zookeeper.zookeeper_digest_file == str(digest)
    monkeypatch.setenv("QUIRE_ZOOKEEPER_TLS_CA_FILE", "/etc/zk-ca.pem")
    from_env = QuireOptions.parse({"metadata": "zk://zk1:2181/q", "log": "events"})
    assert from_env.client_config.zookeeper.zookeeper_tls_ca_file == "/etc/zk-ca.pem"
    with pytest.raises(ValueError, match="zookeeper_tls_cert_file"):
        QuireOptions.parse({"metadata": "zk://zk1:2181/q", "log": "events",
                            "zookeeper_tls_cert_file": "/c.pem"})  # without its key
