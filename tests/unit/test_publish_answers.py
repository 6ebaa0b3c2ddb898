"""What a client is told about a publish forwarded through NATS, from the leader's Ack: the ack
itself, or the refusal its ackError names, in Liftbridge's codes and words."""

import errno
import os

import pytest

from bascule.api.publish import _accepted
from bascule.api.status import PublishError, publish_failure
from bascule.h2grpc import Status
from bascule.wire.pb import api_pb2

Error = api_pb2.Ack.Error


def test_an_ack_without_error_is_the_answer():
    ack = api_pb2.Ack(offset=7, ackError=Error.OK)
    assert _accepted(ack) is ack
    assert _accepted(None) is None


@pytest.mark.parametrize(("error", "status", "async_code", "message"), [
    (Error.INCORRECT_OFFSET, Status.UNKNOWN, "INCORRECT_OFFSET", "incorrect expected offset"),
    (Error.ENCRYPTION, Status.INTERNAL, "ENCRYPTION_FAILED", "encryption failed on partition"),
    (Error.UNKNOWN, Status.UNKNOWN, "UNKNOWN", "unknown error"),
    (99, Status.UNKNOWN, "UNKNOWN", "unknown error"),  # a value no Liftbridge version sends
])
def test_an_ack_error_is_the_refusal_it_names(error, status, async_code, message):
    with pytest.raises(PublishError) as refused:
        _accepted(api_pb2.Ack(ackError=error))
    assert (refused.value.status, refused.value.async_code, refused.value.message) == (status, async_code, message)


def test_a_write_the_leaders_disk_refused_is_unavailable_so_clients_retry_at_the_next_leader():
    refused = publish_failure(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert (refused.status, refused.async_code) == (Status.UNAVAILABLE, "UNKNOWN")
    assert refused.message.startswith("unavailable: the leader could not store it")
    timed_out = publish_failure(TimeoutError())  # an OSError too, with its own words
    assert timed_out.message == "unavailable: timed out waiting for the ack"
