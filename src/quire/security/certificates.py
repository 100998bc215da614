"""A local certificate authority and its certificates (the secure sandbox's, tests').

:func:`make_ca` writes a self-signed CA (``ca.crt``, ``ca.key``) and
:func:`issue_certificate` certificates it signs, as PEM files; private keys
are written readable by their owner only (0600,
:func:`~quire.security.secrets.write_secret`).  With the ``cryptography``
library.

Decisions, from what the official Pravega client accepts
(``../shared/notes/pravega-client-tls-auth.md``; rustls/webpki are strict):

* Keys are ECDSA P-256 with SHA-256 signatures: small, fast to make and to
  handshake, and accepted by OpenSSL, gRPC and webpki.
* Every leaf has a DNS SAN ``localhost`` (the client cannot use an IP
  literal under TLS) plus the names and IP addresses asked for (Python
  clients may connect to ``127.0.0.1`` and check its IP SAN).
* A leaf is not a CA (basic constraints), has digital-signature key usage
  and the extended usages asked for (server, client, or both); its role is
  the subject's ``OU`` (what :func:`quire.security.tls.certificate_role`
  reads by default).
* The CA is a CA with path length 0 (it signs leaves only).
* Validity starts an hour back (clocks of a host's processes may differ).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from quire.security.secrets import write_secret

DEFAULT_VALIDITY_DAYS = 825
"""What browsers accept for a leaf; for the CA, ten years."""


@dataclass(frozen=True)
class CertificateFiles:
    """A certificate and its private key, as PEM files."""

    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA that can sign certificates (its files, and the loaded key)."""

    files: CertificateFiles
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_file(self) -> Path:
        return self.files.cert_file

    @classmethod
    def load(cls, cert_file: Path, key_file: Path) -> CertificateAuthority:
        """A CA of files :func:`make_ca` wrote."""
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_file} is not an EC private key")
        return cls(CertificateFiles(cert_file, key_file), certificate, key)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey, cert_file: Path,
           key_file: Path) -> CertificateFiles:
    cert_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    write_secret(key_file, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return CertificateFiles(cert_file, key_file)


def make_ca(directory: Path, name: str = "Quire local CA", *, days: int = 3650,
            stem: str = "ca") -> CertificateAuthority:
    """A new self-signed CA in ``directory/<stem>.crt`` and ``<stem>.key``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256()))
    files = _write(certificate, key, directory / f"{stem}.crt", directory / f"{stem}.key")
    return CertificateAuthority(files, certificate, key)


def issue_certificate(ca: CertificateAuthority, directory: Path, name: str, *,
                      dns_names: Sequence[str] = (), ip_addresses: Sequence[str] = (),
                      role: str | None = None, server: bool = True, client: bool = True,
                      days: int = DEFAULT_VALIDITY_DAYS) -> CertificateFiles:
    """A certificate signed by ``ca`` for ``name`` (its CN) in
    ``directory/<name>.crt`` and ``<name>.key``: SANs ``localhost``,
    ``dns_names`` and ``ip_addresses``; ``role`` in the subject's OU; usable
    by a server and/or a client."""
    if not (server or client):
        raise ValueError("a certificate is for a server, a client, or both")
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if role:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    dns = list(dict.fromkeys(["localhost", *dns_names]))
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes)).issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256()))
    return _write(certificate, key, directory / f"{name}.crt", directory / f"{name}.key")
