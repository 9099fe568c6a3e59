"""TLS certificates and SuperNode keys for a Flower deployment, made with the ``cryptography`` package.

Flower 1.41 encrypts SuperLink <-> SuperNode (and ``flwr`` CLI) traffic with TLS when the SuperLink gets a server
certificate, key and CA (``--ssl-certfile/--ssl-keyfile/--ssl-ca-certfile``) and every SuperNode the CA
(``--root-certificates``). With ``--enable-supernode-auth`` the SuperLink admits only SuperNodes whose public key
was registered (``flwr supernode register``), each proving it holds the private key
(``--auth-supernode-private-key``; an EC key on a NIST curve, OpenSSH format, as ``ssh-keygen -t ecdsa -b 384``
makes). ``make_certificates`` and ``make_node_key`` write those files; Flower's own docs make them with openssl and
ssh-keygen, which need not be installed here.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certificates:
    """The CA certificate (for SuperNodes and the ``flwr`` CLI) and the SuperLink's certificate and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's authentication key pair: private (OpenSSH PEM) and public (OpenSSH line)."""

    private: Path
    public: Path


def make_certificates(out: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                      days: int = 365) -> Certificates:
    """A self-signed CA and a SuperLink certificate signed by it, valid for ``hosts`` (IPs or DNS names)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedpeft federation CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h) for h in hosts]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = Certificates(out / "ca.crt", out / "server.pem", out / "server.key")
    paths.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths.server_key, key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                                       serialization.NoEncryption()))
    return paths


def make_node_key(out: str | Path, name: str) -> NodeKey:
    """An EC (SECP384R1) key pair for SuperNode ``name``: ``<name>`` (private) and ``<name>.pub`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = NodeKey(out / name, out / f"{name}.pub")
    _write_private(paths.private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                    serialization.NoEncryption()))
    paths.public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                           serialization.PublicFormat.OpenSSH) + b"\n")
    return paths


def _write_private(path: Path, data: bytes) -> None:
    """A private key readable by its owner only."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
