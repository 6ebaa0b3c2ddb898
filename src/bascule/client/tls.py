"""TLS settings of the client's connections."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ClientTls:
    """TLS to the server: the CA to check its certificate with (None: the system's), and a client
    certificate and key for servers that require one (mutual TLS). PEM bytes."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str | None = None, cert: str | None = None, key: str | None = None) -> ClientTls:
        if bool(cert) != bool(key):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        return cls(*(Path(path).read_bytes() if path else None for path in (ca, cert, key)))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)
