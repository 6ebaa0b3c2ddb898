"""How the node proves itself to NATS, on every connection it opens: user and password, token,
credentials file (JWT and seed), nkey seed, and TLS (with a client certificate for mutual TLS).

One value, ``NatsAuth``, gives nats-py its connect options and the capture connection (which
speaks the protocol itself) its CONNECT fields and TLS context. Secrets live here and in the
files it names; nothing here is ever logged (``__repr__`` says only which kinds are set).
"""

from __future__ import annotations

import base64
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_CREDS_BLOCK = re.compile(r"-{3,}[^\n]*BEGIN[^\n]*-{3,}\s*\n\s*(\S+)\s*\n\s*-{3,}[^\n]*END[^\n]*-{3,}")


class NatsAuthError(ValueError):
    """Credentials that cannot be used: a missing or malformed file, a bad seed."""


@dataclass(frozen=True)
class NatsAuth:
    user: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    credentials: str = ""  # a .creds file: the user's JWT and nkey seed
    nkey_seed: str = ""  # a file holding a user nkey seed (SU...)
    tls_cert: str = ""  # client certificate and key, for servers that verify clients
    tls_key: str = ""
    tls_ca: str = ""  # the CA that signed the server's certificate; the system's when empty
    tls: bool = False  # TLS even without any of the files above (a server asking for it also gets it)

    def __post_init__(self) -> None:
        kinds = [bool(self.user or self.password), bool(self.token), bool(self.credentials), bool(self.nkey_seed)]
        if sum(kinds) > 1:
            raise NatsAuthError("give NATS one way to authenticate: user/password, token, credentials or nkey")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise NatsAuthError("nats.tls.cert and nats.tls.key go together")

    @property
    def wants_tls(self) -> bool:
        return self.tls or bool(self.tls_ca or self.tls_cert)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: the server verified against ``tls_ca`` (or the system's CAs), and
        this node's certificate offered when one is configured."""
        try:
            context = ssl.create_default_context(cafile=self.tls_ca or None)
            if self.tls_cert:
                context.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise NatsAuthError(f"NATS TLS files: {exc}") from exc
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        options: dict[str, Any] = {}
        if self.user or self.password:
            options.update(user=self.user, password=self.password)
        if self.token:
            options["token"] = self.token
        if self.credentials:
            options["user_credentials"] = self.credentials
        if self.nkey_seed:
            options["nkeys_seed"] = self.nkey_seed
        if self.wants_tls:
            options["tls"] = self.ssl_context()
        return options

    def connect_fields(self, nonce: str | None) -> dict[str, Any]:
        """The CONNECT fields that authenticate, for a server whose INFO gave ``nonce``."""
        if self.user or self.password:
            return {"user": self.user, "pass": self.password}
        if self.token:
            return {"auth_token": self.token}
        if self.credentials:
            jwt, seed = _read_credentials(self.credentials)
            return {"jwt": jwt, **_signed(seed, nonce, with_public_key=False)}
        if self.nkey_seed:
            return _signed(_read_file(self.nkey_seed).strip().encode(), nonce, with_public_key=True)
        return {}

    def __repr__(self) -> str:
        kinds = [name for name, value in (("user", self.user), ("token", self.token),
                                           ("credentials", self.credentials), ("nkey", self.nkey_seed)) if value]
        return f"NatsAuth({'+'.join(kinds) or 'none'}{', tls' if self.wants_tls else ''})"


def _read_file(path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise NatsAuthError(f"cannot read NATS credentials {path}: {exc}") from exc


def _read_credentials(path: str) -> tuple[str, bytes]:
    """(JWT, seed) of a NATS .creds file: the first two BEGIN/END blocks, in that order."""
    blocks = _CREDS_BLOCK.findall(_read_file(path))
    if len(blocks) < 2:
        raise NatsAuthError(f"{path} is not a NATS credentials file (a JWT block and a seed block)")
    return blocks[0], blocks[1].encode()


def _signed(seed: bytes, nonce: str | None, with_public_key: bool) -> dict[str, str]:
    """The nonce signed with the seed's key (and that key, for nkey authentication)."""
    import nkeys  # only for these kinds of authentication

    try:
        key_pair = nkeys.from_seed(seed)
    except Exception as exc:  # nkeys raises its own errors, and binascii's, for a bad seed
        raise NatsAuthError(f"not a usable nkey seed: {type(exc).__name__}") from None
    fields: dict[str, str] = {}
    if nonce is not None:
        fields["sig"] = base64.urlsafe_b64encode(key_pair.sign(nonce.encode())).decode().rstrip("=")
    if with_public_key:
        fields["nkey"] = key_pair.public_key.decode()
    return fields
