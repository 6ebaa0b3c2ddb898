"""NatsAuth: the CONNECT fields each kind of NATS authentication gives, and garbage files refused."""

import base64
import os

import nkeys
import pytest

from bascule.natsio.auth import NatsAuth, NatsAuthError

JWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVQSJ9.c2ln"


def user_seed() -> bytes:
    return nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)


def creds_file(path, jwt: str, seed: bytes) -> str:
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n" + jwt + "\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        "-----BEGIN USER NKEY SEED-----\n" + seed.decode() + "\n------END USER NKEY SEED------\n"
    )
    return str(path)


def verifies(seed: bytes, nonce: str, signature: str) -> bool:
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    return nkeys.from_seed(seed).verify(nonce.encode(), raw)


def test_a_credentials_file_gives_its_jwt_and_signs_the_nonce(tmp_path):
    seed = user_seed()
    fields = NatsAuth(credentials=creds_file(tmp_path / "u.creds", JWT, seed)).connect_fields("n0nce")
    assert fields["jwt"] == JWT and "nkey" not in fields
    assert verifies(seed, "n0nce", fields["sig"])


def test_an_nkey_seed_gives_its_public_key_and_signs_the_nonce(tmp_path):
    seed = user_seed()
    (tmp_path / "u.nk").write_bytes(seed + b"\n")
    fields = NatsAuth(nkey_seed=str(tmp_path / "u.nk")).connect_fields("abc")
    assert fields["nkey"] == nkeys.from_seed(seed).public_key.decode()
    assert verifies(seed, "abc", fields["sig"])


@pytest.mark.parametrize("content", ["", "garbage", "-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n",
                                     "\x00\xff" * 20])
def test_a_garbage_credentials_file_is_refused_clearly(tmp_path, content):
    path = tmp_path / "bad.creds"
    path.write_text(content, errors="surrogateescape")
    with pytest.raises(NatsAuthError):
        NatsAuth(credentials=str(path)).connect_fields("n")


def test_a_bad_seed_or_a_missing_file_is_refused_clearly(tmp_path):
    (tmp_path / "bad.nk").write_text("SUNOTASEED\n")
    with pytest.raises(NatsAuthError, match="not a usable nkey seed"):
        NatsAuth(nkey_seed=str(tmp_path / "bad.nk")).connect_fields("n")
    with pytest.raises(NatsAuthError, match="cannot read"):
        NatsAuth(nkey_seed=str(tmp_path / "missing.nk")).connect_fields("n")
    with pytest.raises(NatsAuthError, match="NATS TLS files"):
        NatsAuth(tls_ca=str(tmp_path / "missing-ca.pem")).ssl_context()


def test_user_token_and_no_auth_fields_and_a_repr_without_secrets():
    assert NatsAuth(user="u", password="p").connect_fields(None) == {"user": "u", "pass": "p"}
    assert NatsAuth(token="t").connect_fields(None) == {"auth_token": "t"}
    assert NatsAuth().connect_fields("n") == {} and NatsAuth().client_options() == {}
    assert repr(NatsAuth(user="u", password="secret", tls=True)) == "NatsAuth(user, tls)"
    assert NatsAuth(token="t").client_options() == {"token": "t"}
    with pytest.raises(NatsAuthError):
        NatsAuth(user="u", token="t")
