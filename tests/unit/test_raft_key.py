"""The metadata Raft's session key (bascule.metadata.raft.raft_encryptor): pysyncobj's, derived once
per data directory instead of at every start."""

from __future__ import annotations

from pysyncobj.encryptor import getEncryptor

from bascule.metadata.raft import EncryptorAtFirstUse, raft_encryptor


def test_the_key_is_pysyncobj_s_both_ways(tmp_path):
    ours, theirs = raft_encryptor(tmp_path / "key", "the cluster's secret"), getEncryptor("the cluster's secret")
    assert theirs.decrypt(ours.encrypt(b"append entries")) == b"append entries"
    assert ours.decrypt(theirs.encrypt(b"request vote")) == b"request vote"


def test_a_restart_reads_the_key_and_a_new_password_derives_another(tmp_path):
    key_file = tmp_path / "key"
    first = raft_encryptor(key_file, "one")
    kept = key_file.read_text()
    assert key_file.stat().st_mode & 0o077 == 0  # as secret as the password
    again = raft_encryptor(key_file, "one")
    assert key_file.read_text() == kept and again.decrypt(first.encrypt(b"x")) == b"x"
    other = raft_encryptor(key_file, "two")
    assert key_file.read_text() != kept
    assert getEncryptor("two").decrypt(other.encrypt(b"y")) == b"y"


def test_a_damaged_key_file_is_derived_again(tmp_path):
    key_file = tmp_path / "key"
    for garbage in (b"", b"\xff\x00 not a key", b"one two three", b"a" * 32 + b" " + b"not-base64!"):
        key_file.write_bytes(garbage)
        encryptor = raft_encryptor(key_file, "secret")
        assert getEncryptor("secret").decrypt(encryptor.encrypt(b"z")) == b"z"
    digest = key_file.read_text().split()[0]
    key_file.write_text(f"{digest} not-a-fernet-key\n")  # this password's digest, a damaged key
    encryptor = raft_encryptor(key_file, "secret")
    assert getEncryptor("secret").decrypt(encryptor.encrypt(b"w")) == b"w"


def test_the_encryptor_is_made_when_a_connection_first_uses_it(tmp_path):
    made = []

    def make():
        made.append(raft_encryptor(tmp_path / "key", "secret"))
        return made[-1]

    encryptor = EncryptorAtFirstUse(make)
    assert encryptor and made == []  # pysyncobj tests an encryptor's truth before using it
    token = encryptor.encrypt_at_time(b"append entries", 1234)
    assert encryptor.extract_timestamp(token) == 1234 and encryptor.decrypt(token) == b"append entries"
    assert len(made) == 1
    assert getEncryptor("secret").decrypt(token) == b"append entries"
