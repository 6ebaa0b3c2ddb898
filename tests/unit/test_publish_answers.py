"""What a client is told about a publish forwarded through NATS, from the leader's Ack: the ack
itself, or the refusal its ackError names, in Liftbridge's codes and words."""

import grpc
import pytest

from bascule.api.publish import _accepted
from bascule.api.status import PublishError
from bascule.wire.pb import api_pb2

Error = api_pb2.Ack.Error


def test_an_ack_without_error_is_the_answer():
    ack = api_pb2.Ack(offset=7, ackError=Error.OK)
    assert _accepted(ack) is ack
    assert _accepted(None) is None


@pytest.mark.parametrize(("error", "status", "async_code", "message"), [
    (Error.INCORRECT_OFFSET, grpc.StatusCode.UNKNOWN, "INCORRECT_OFFSET", "incorrect expected offset"),
    (Error.ENCRYPTION, grpc.StatusCode.INTERNAL, "ENCRYPTION_FAILED", "encryption failed on partition"),
    (Error.UNKNOWN, grpc.StatusCode.UNKNOWN, "UNKNOWN", "unknown error"),
    (99, grpc.StatusCode.UNKNOWN, "UNKNOWN", "unknown error"),  # a value no Liftbridge version sends
])
def test_an_ack_error_is_the_refusal_it_names(error, status, async_code, message):
    with pytest.raises(PublishError) as refused:
        _accepted(api_pb2.Ack(ackError=error))
    assert (refused.value.status, refused.value.async_code, refused.value.message) == (status, async_code, message)
