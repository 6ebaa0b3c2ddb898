"""Encryption at rest: the value codec, the master key from the environment, the reading walk over
an encrypted log, and the replica sealing as it appends. No network."""

import asyncio
import time

import pytest
from cryptography.hazmat.primitives.keywrap import aes_key_unwrap_with_padding
from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.config import load_config
from bascule.h2grpc.messages import MessageReader
from bascule.partition import encryption, value_cipher
from bascule.partition.encryption import (
    DecryptionFailed,
    EncryptionUnavailable,
    InvalidMasterKey,
    Keyless,
    MasterKey,
    opening,
    stream_encrypted,
)
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.partition.value_cipher import ValueCipher
from bascule.wire.entry import CorruptEntry, Record, decode_entries, encode_entries, stored_prefix
from bascule.wire.messages import MessageEncoder
from bascule.wire.names import RESERVED_STREAMS
from bascule.wire.pb import api_pb2

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


@given(st.binary(max_size=2000))
def test_a_sealed_value_opens_to_itself_under_any_cipher_of_the_same_master_key(value):
    sealed = ValueCipher(KEY).seal(value)
    assert len(sealed) == 1 + 40 + 12 + len(value) + 16
    assert ValueCipher(KEY).open(sealed) == value


def test_a_sealed_value_is_laid_out_as_liftbridge_lays_it_out():
    value = b"hello, encrypted world"
    sealed = ValueCipher(KEY).seal(value)
    wrapped_length = sealed[0]
    assert wrapped_length == 40  # RFC 5649 of a 32-byte data key
    data_key = aes_key_unwrap_with_padding(KEY, sealed[1:1 + wrapped_length])
    assert len(data_key) == 32
    nonce, ciphertext = sealed[41:53], sealed[53:]
    assert len(ciphertext) == len(value) + 16
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    assert AESGCM(data_key).decrypt(nonce, ciphertext, None) == value


def test_one_replica_seals_under_one_data_key_with_a_fresh_nonce_each_time():
    cipher = ValueCipher(KEY)
    first, second = cipher.seal(b"same"), cipher.seal(b"same")
    assert first[:41] == second[:41]  # the wrapped data key
    assert first[41:53] != second[41:53]  # the nonce
    assert ValueCipher(KEY).seal(b"same")[:41] != first[:41]  # another replica, another data key


def test_a_replica_takes_a_new_data_key_after_its_uses_and_old_values_still_open(monkeypatch):
    monkeypatch.setattr(value_cipher, "DATA_KEY_USES", 3)
    cipher = ValueCipher(KEY)
    sealed = [cipher.seal(b"v%d" % i) for i in range(7)]
    assert len({value[:41] for value in sealed}) == 3
    reader = ValueCipher(KEY)
    assert [reader.open(value) for value in sealed] == [b"v%d" % i for i in range(7)]


def test_a_value_sealed_under_another_master_key_does_not_open():
    sealed = ValueCipher(OTHER_KEY).seal(b"secret")
    with pytest.raises(DecryptionFailed, match="does not unwrap under this node's master key"):
        ValueCipher(KEY).open(sealed)


def test_every_truncation_of_a_sealed_value_fails_to_open():
    sealed = ValueCipher(KEY).seal(b"a value long enough to cut in many places")
    cipher = ValueCipher(KEY)
    for length in range(len(sealed)):
        with pytest.raises(DecryptionFailed):
            cipher.open(sealed[:length])


def test_every_flipped_bit_of_a_sealed_value_fails_to_open():
    sealed = ValueCipher(KEY).seal(b"tamper with me")
    cipher = ValueCipher(KEY)
    for position in range(len(sealed)):
        for bit in (0x01, 0x80):
            damaged = bytearray(sealed)
            damaged[position] ^= bit
            with pytest.raises(DecryptionFailed):
                cipher.open(bytes(damaged))


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_garbage_never_opens_and_fails_only_with_decryption_failed(garbage):
    with pytest.raises(DecryptionFailed):
        ValueCipher(KEY).open(garbage)


@given(st.binary(min_size=1, max_size=100), st.binary(max_size=200))
def test_garbage_behind_a_real_wrapped_key_fails_only_with_decryption_failed(head, garbage):
    wrapped_key = ValueCipher(KEY).seal(b"")[:41]
    with pytest.raises(DecryptionFailed):
        ValueCipher(KEY).open(wrapped_key + garbage)
    with pytest.raises(DecryptionFailed):
        ValueCipher(KEY).open(head + garbage)


@pytest.mark.parametrize("length", [0, 1, 15, 17, 23, 25, 31, 33, 64])
def test_master_keys_of_other_lengths_than_aes_are_refused(length):
    with pytest.raises(InvalidMasterKey, match=f"must be 16, 24 or 32 bytes, got {length}"):
        ValueCipher(b"k" * length)


@pytest.mark.parametrize("length", [16, 24, 32])
def test_master_keys_of_aes_lengths_seal_and_open(length):
    cipher = ValueCipher(b"k" * length)
    assert cipher.open(cipher.seal(b"x")) == b"x"


def test_the_master_key_comes_from_the_environment_bascules_variable_first():
    liftbridge, bascule = b"L" * 32, b"B" * 16
    assert MasterKey.from_environment({b"LIFTBRIDGE_ENCRYPTION_KEY": liftbridge}).problem is None
    both = MasterKey.from_environment({b"LIFTBRIDGE_ENCRYPTION_KEY": liftbridge, b"BASCULE_ENCRYPTION_KEY": bascule})
    sealed = both.values().seal(b"v")
    assert ValueCipher(bascule).open(sealed) == b"v"
    with pytest.raises(DecryptionFailed):
        ValueCipher(liftbridge).open(sealed)
    empty_bascule = MasterKey.from_environment(
        {b"LIFTBRIDGE_ENCRYPTION_KEY": liftbridge, b"BASCULE_ENCRYPTION_KEY": b""}
    )
    assert ValueCipher(liftbridge).open(empty_bascule.values().seal(b"v")) == b"v"


def test_a_missing_or_invalid_master_key_says_why_and_never_shows_the_key():
    missing = MasterKey.from_environment({})
    assert missing.problem == "LIFTBRIDGE_ENCRYPTION_KEY is not set"
    short = MasterKey.from_environment({b"BASCULE_ENCRYPTION_KEY": b"tooshort", b"LIFTBRIDGE_ENCRYPTION_KEY": KEY})
    assert short.problem == "BASCULE_ENCRYPTION_KEY: the master key must be 16, 24 or 32 bytes, got 8"
    assert "tooshort" not in repr(short)
    valid = MasterKey.from_environment({b"LIFTBRIDGE_ENCRYPTION_KEY": b"s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr"})
    assert repr(valid) == "MasterKey(set)"
    values = missing.values()
    assert isinstance(values, Keyless) and values.problem == missing.problem
    for use in (values.seal, values.open):
        with pytest.raises(EncryptionUnavailable, match="no valid encryption key: LIFTBRIDGE_ENCRYPTION_KEY is not"):
            use(b"x")


def test_the_precondition_failure_uses_liftbridges_words():
    assert encryption.precondition_failure("why") == "Failed on preconditions for stream's encryption handler: why"


def test_streams_encryption_is_the_servers_default_off_unless_set():
    assert load_config(None, {}).streams.encryption is False
    config = load_config(None, {"streams.encryption": True})
    assert config.streams.encryption is True and "streams.encryption" not in config.ignored_settings


def test_only_a_stream_created_encrypted_is_and_never_an_internal_one():
    assert stream_encrypted("s", {"encryption": True})
    assert not stream_encrypted("s", {"encryption": False})
    assert not stream_encrypted("s", {})
    for name in RESERVED_STREAMS:
        assert not stream_encrypted(name, {"encryption": True})


# ---- reading an encrypted log -------------------------------------------------------------------

HEADERS = {"subject": b"s.in", "reply": b"", "h": b"1"}


def stored(values, runs):
    """Entries as a log holds them: each run (first offset, leader epoch, records), gaps between runs."""
    return b"".join(
        encode_entries(first, epoch, [Record(values(r.value), r.key, r.headers, r.timestamp) for r in records],
                       time.time_ns())[0]
        for first, epoch, records in runs
    )


def runs_of(values):
    return [
        (0, 1, [Record(v, key=b"k", headers=HEADERS, timestamp=100 + i) for i, v in enumerate(values[:2])]),
        (5, 2, [Record(v, headers={}, timestamp=200 + i) for i, v in enumerate(values[2:])]),  # a compaction gap
    ]


def test_the_opening_walk_gives_the_entries_with_their_values_open_offsets_epochs_and_gaps_kept():
    values = [b"zero", b"one", b"five", b"six"]
    cipher = ValueCipher(KEY)
    sealed_log, plain_log = stored(cipher.seal, runs_of(values)), stored(lambda v: v, runs_of(values))
    length, reach, error, made = opening(ValueCipher(KEY), stored_prefix)(sealed_log, 0, 100, True)
    assert (length, error) == (len(sealed_log), None)
    assert reach == stored_prefix(plain_log, 0, 100, True)[1]
    assert decode_entries(made) == decode_entries(plain_log)
    assert b"five" not in sealed_log and b"zero" not in sealed_log


def test_the_opening_walk_feeds_subscribes_encoder_the_same_messages_as_a_plain_log():
    values = [b"zero", b"one", b"five", b"six"]
    sealed_log = stored(ValueCipher(KEY).seal, runs_of(values))
    plain_log = stored(lambda v: v, runs_of(values))
    framed = opening(ValueCipher(KEY), MessageEncoder("s", 0).walk)(sealed_log, 0, 100, True)[3]
    assert framed == MessageEncoder("s", 0).walk(plain_log, 0, 100, True)[3]
    messages = [api_pb2.Message.FromString(m) for m in MessageReader(1 << 30).feed(framed)]
    assert [(m.offset, m.value) for m in messages] == [(0, b"zero"), (1, b"one"), (5, b"five"), (6, b"six")]


def test_the_opening_walk_stops_before_a_value_that_does_not_open_and_a_read_from_it_fails():
    good, bad = ValueCipher(KEY).seal, ValueCipher(OTHER_KEY).seal
    log = stored(good, [(0, 1, [Record(b"a"), Record(b"b")])]) + stored(bad, [(2, 1, [Record(b"c")])]) \
        + stored(good, [(3, 1, [Record(b"d")])])
    walk = opening(ValueCipher(KEY), stored_prefix)
    length, reach, error, made = walk(log, 0, 100, True)
    assert (reach, error) == (2, None) and [e.value for e in decode_entries(made)] == [b"a", b"b"]
    with pytest.raises(DecryptionFailed, match="^offset 2: its data key does not unwrap"):
        walk(log[length:], 2, 100, True)


def test_the_opening_walk_passes_damage_on_as_the_stored_walk_does():
    log = bytearray(stored(ValueCipher(KEY).seal, [(0, 1, [Record(b"a"), Record(b"b")])]))
    log[-1] ^= 0xFF  # the second entry's CRC no longer holds
    length, reach, error, made = opening(ValueCipher(KEY), stored_prefix)(bytes(log), 0, 100, True)
    assert reach == 1 and isinstance(error, CorruptEntry)
    assert [e.value for e in decode_entries(made)] == [b"a"]


@given(st.lists(st.binary(max_size=120), min_size=1, max_size=5), st.integers(1, 5))
def test_an_entry_of_garbage_among_sealed_ones_stops_the_walk_before_it_and_fails_a_read_from_it(garbage, at):
    cipher = ValueCipher(KEY)
    values = [cipher.seal(b"good-%d" % i) for i in range(5)]
    values[at:at] = garbage
    log = stored(lambda v: v, [(0, 1, [Record(v) for v in values])])
    walk = opening(ValueCipher(KEY), stored_prefix)
    length, reach, error, made = walk(log, 0, 100, True)
    assert reach == at and error is None and [e.value for e in decode_entries(made)] == [b"good-%d" % i for i in
                                                                                         range(at)]
    with pytest.raises(DecryptionFailed, match=f"^offset {at}: "):
        walk(log[length:], at, 100, True)


def test_reading_without_the_key_fails_with_encryption_unavailable():
    log = stored(ValueCipher(KEY).seal, [(0, 1, [Record(b"a")])])
    with pytest.raises(EncryptionUnavailable):
        opening(Keyless("no key"), stored_prefix)(log, 0, 100, True)


# ---- the replica ---------------------------------------------------------------------------------


def leader(tmp_path, values) -> PartitionReplica:
    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), SyncPolicy(), time.monotonic, values=values)
    replica.become_leader("me", 0, 0, ["me"], ["me"], min_isr=1, max_lag_time=10.0, leader_timeout=10.0)
    return replica


async def written(replica, records):
    outcome = asyncio.get_running_loop().create_future()
    replica.submit(records, lambda offset, error: outcome.set_result((offset, error)))
    return await asyncio.wait_for(outcome, 5)


@pytest.mark.anyio
async def test_a_leader_stores_sealed_values_and_reads_them_back_open(tmp_path):
    replica = leader(tmp_path, ValueCipher(KEY))
    try:
        records = [Record(b"plain-%d" % i, key=b"key-%d" % i) for i in range(3)]
        assert await written(replica, records) == (0, None)
        assert [r.value for r in records] == [b"plain-0", b"plain-1", b"plain-2"]  # the callers' records untouched
        on_disk = b"".join(path.read_bytes() for path in (tmp_path / "p").glob("*.log"))
        assert b"plain-" not in on_disk and b"key-1" in on_disk  # keys stay readable, as Liftbridge's
        stored_entries = decode_entries(replica.log.read_raw(0, 1 << 20))
        assert [ValueCipher(KEY).open(e.value) for e in stored_entries] == [b"plain-0", b"plain-1", b"plain-2"]
        assert [e.value for e in replica.read_committed(0, 10)] == [b"plain-0", b"plain-1", b"plain-2"]
        made, count = replica.read_committed_through(0, 1 << 20)
        assert count == 3 and [e.value for e in decode_entries(made)] == [b"plain-0", b"plain-1", b"plain-2"]
    finally:
        replica.close()


@pytest.mark.anyio
async def test_a_leader_without_the_key_refuses_writes_and_stores_nothing(tmp_path):
    replica = leader(tmp_path, Keyless("LIFTBRIDGE_ENCRYPTION_KEY is not set"))
    try:
        offset, error = await written(replica, [Record(b"never stored")])
        assert offset is None and isinstance(error, EncryptionUnavailable)
        replica.submit([Record(b"nor this")])  # no outcome asked: dropped all the same
        await asyncio.sleep(0.01)
        assert replica.log.next_offset == 0
        on_disk = b"".join(path.read_bytes() for path in (tmp_path / "p").glob("*.log"))
        assert b"stored" not in on_disk and b"nor this" not in on_disk
    finally:
        replica.close()
