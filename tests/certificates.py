"""Certificates for the TLS tests, made by `openssl`: a CA, a server certificate for
127.0.0.1 and a client certificate the CA signs."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from needs import require

__all__ = ["Certificates", "make_certificates"]


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path, ca_name: str = "emq test CA") -> Certificates:
    """Make, in `directory`, a CA named `ca_name`, a server certificate for 127.0.0.1 and a
    client certificate (for `tls-auth-clients yes`), valid two days."""
    openssl = shutil.which("openssl")
    require(openssl, "openssl is not on PATH")
    assert openssl is not None
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        f"/CN={ca_name}",
        # Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a CA
        # without key usage is refused.
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=emq test app")):
        run("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", subject)
        run(
            "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{who}.crt", "-days", "2", "-extfile", f"{who}.ext",
        )  # fmt: skip
    return Certificates(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )
