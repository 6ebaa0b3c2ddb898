"""A consumer group coordinator's work (Liftbridge's): serving the assignments of the groups this
node coordinates, and removing the members that stop asking for them.

A member's FetchConsumerGroupAssignments is its heartbeat. Their times live here, in memory: a
node that becomes a group's coordinator (it created the group, took it over, or restarted) gives
every member a full consumer timeout from the moment it first sees it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from bascule.metadata import groups as rules
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.state import FAILED_PRECONDITION, NOT_FOUND, MetadataState
from bascule.node.tasks import Tasks

log = logging.getLogger(__name__)

Member = tuple[str, str]  # (group id, consumer id)
Call = Callable[..., Awaitable[None]]


class GroupCoordinator:
    def __init__(
        self, server_id: str, consumer_timeout: float, state: Callable[[], MetadataState], call: Call, tasks: Tasks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server_id = server_id
        self.consumer_timeout = consumer_timeout
        self._state = state
        self._call = call
        self._tasks = tasks
        self._clock = clock
        self._seen: dict[Member, float] = {}  # the members of the groups coordinated here
        self._expiring: set[Member] = set()

    def assignments(self, group_id: str, consumer_id: str, epoch: int) -> tuple[int, rules.Assignment]:
        """The group epoch and the consumer's partitions, refused as Liftbridge refuses them: an
        unknown group, another coordinator, another epoch, a consumer that is no member."""
        state = self._state()
        group = state.groups.get(group_id)
        if group is None:
            raise MetadataError(NOT_FOUND, rules.GROUP_NOT_FOUND)
        if group.coordinator != self.server_id:
            raise MetadataError(FAILED_PRECONDITION, rules.NOT_COORDINATOR)
        if epoch != group.epoch:
            raise MetadataError(FAILED_PRECONDITION, rules.EPOCH_DIFFERS)
        if consumer_id not in group.members:
            raise MetadataError(FAILED_PRECONDITION, rules.NOT_MEMBER)
        self._seen[(group_id, consumer_id)] = self._clock()
        return group.epoch, state.group_assignments(group_id).get(consumer_id, {})

    async def expire_idle(self) -> None:
        """The periodic job: members silent for the consumer timeout leave their group (expired)."""
        now = self._clock()
        watched = {
            (group.id, consumer) for group in self._state().groups.values()
            if group.coordinator == self.server_id for consumer in group.members
        }
        self._seen = {member: self._seen.get(member, now) for member in watched}
        for member, seen in self._seen.items():
            if now - seen > self.consumer_timeout and member not in self._expiring:
                self._expiring.add(member)
                self._tasks.spawn(self._expire(member), "expire consumer")

    async def _expire(self, member: Member) -> None:
        group_id, consumer_id = member
        log.warning("consumer %s timed out for consumer group %s, removing it from the group", consumer_id, group_id)
        try:
            await self._call("leave_consumer_group", group=group_id, consumer=consumer_id, expired=True)
        except (MetadataError, NoMetadataLeader) as exc:
            log.warning("could not remove consumer %s from consumer group %s: %s", consumer_id, group_id, exc)
            if member in self._seen:  # try again after another timeout, as Liftbridge does
                self._seen[member] = self._clock()
        finally:
            self._expiring.discard(member)
