"""The rights each RPC needs (bascule.api.authz), without a server."""

from __future__ import annotations

from types import SimpleNamespace

from bascule.api.authz import CHECKS, ack_inbox_rights
from bascule.metadata.state import MetadataState
from bascule.wire.pb import admin_pb2, api_pb2, data_pb2

# Checked inside its handler, request by request (a stream of publishes).
CHECKED_BY_ITS_HANDLER = {"PublishAsync"}


def test_every_method_served_behind_authorization_has_its_rights_stated():
    """A method without an entry would be served unchecked: none may be added without one."""
    served = {method.name for module in (api_pb2, data_pb2, admin_pb2)
              for service in module.DESCRIPTOR.services_by_name.values() for method in service.methods}
    assert served - CHECKED_BY_ITS_HANDLER == set(CHECKS)


def test_an_ack_inbox_is_a_publish_to_its_subject():
    request = api_pb2.PublishRequest(stream="orders", ackInbox="other.in")
    assert CHECKS["Publish"](request, MetadataState()) == [("orders", "Publish"), ("other.in", "PublishToSubject")]
    assert ack_inbox_rights(api_pb2.PublishRequest(stream="orders")) == []


def test_a_group_unknown_to_the_metadata_names_no_right_and_is_refused_whatever_the_policy():
    unknown = SimpleNamespace(groupId="nobody-knows")
    for call in ("LeaveConsumerGroup", "FetchConsumerGroupAssignments", "ReportConsumerGroupCoordinator"):
        assert CHECKS[call](unknown, MetadataState()) is None
    assert CHECKS["JoinConsumerGroup"](SimpleNamespace(streams=[]), MetadataState()) is None
