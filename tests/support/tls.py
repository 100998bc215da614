"""A test CA and TLS (mutual TLS) for real bookie processes.

``secure_bookies(cluster, pki)`` gives every bookie of a
:class:`~tests.support.cluster.Cluster` a certificate (role ``bookie``, SAN
``127.0.0.1``), the CA and the allowed roles, and gives the cluster the
client settings its tests connect with (:attr:`Cluster.client_settings`,
:attr:`Cluster.client_tls` for raw connections): a ``client`` certificate.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.security import client_context
from quire.security.certificates import (
    CertificateAuthority,
    CertificateFiles,
    issue_certificate,
    make_ca,
)
from tests.support.cluster import Cluster

BOOKIE_ROLES = ("bookie", "client")
"""What the test bookies allow: each other, and clients."""


@dataclass
class Pki:
    """A CA under ``root`` and the certificates issued from it."""

    root: Path
    ca: CertificateAuthority = field(init=False)

    def __post_init__(self) -> None:
        self.ca = make_ca(self.root / "ca")

    def issue(self, name: str, role: str | None, **kwargs: Any) -> CertificateFiles:
        """A certificate for ``name`` (its CN) with ``role`` in its OU, for a
        server on 127.0.0.1 and a client."""
        return issue_certificate(self.ca, self.root / name, name, role=role,
                                 ip_addresses=("127.0.0.1",), **kwargs)

    def client_settings(self, files: CertificateFiles | None) -> dict[str, str]:
        """The ClientConfig keys of a client trusting this CA and showing ``files``."""
        settings = {"tls_ca": str(self.ca.cert_file)}
        if files is not None:
            settings.update(tls_cert=str(files.cert_file), tls_key=str(files.key_file))
        return settings

    def context(self, files: CertificateFiles | None) -> ssl.SSLContext:
        """A client context trusting this CA and showing ``files``."""
        return client_context(self.ca.cert_file, files.cert_file if files else None,
                              files.key_file if files else None)


def secure_bookies(cluster: Cluster, pki: Pki, roles: tuple[str, ...] = BOOKIE_ROLES) -> None:
    """Turn TLS and mutual TLS on for every bookie of ``cluster`` (before it
    starts); its tests' clients show a ``client`` certificate."""
    for bookie in cluster.bookies:
        files = pki.issue(bookie.bookie_id, "bookie")
        bookie.settings.update(tls_cert_file=str(files.cert_file),
                               tls_key_file=str(files.key_file),
                               tls_ca_file=str(pki.ca.cert_file), tls_allowed_roles=list(roles))
    client = pki.issue("client", "client")
    cluster.client_settings = pki.client_settings(client)
    cluster.client_tls = pki.context(client)
