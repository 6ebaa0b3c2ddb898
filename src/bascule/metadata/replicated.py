"""The metadata as the node sees it, replicated: ``ReplicatedMetadata``, and ``apply_command``, the
one way every replica applies a committed command.

On a node it is ``metadata.raft.MetadataRaft`` (pysyncobj); in the simulator, a linearizable log with
leader changes (``bascule.simulation.metadata``). Either applies commands with ``apply_command``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from bascule.metadata.state import MetadataState
from bascule.metadata.watch import MetadataWatch
from bascule.wire.commands import Command, CommandError, decode_command

log = logging.getLogger(__name__)


class ReplicatedMetadata(Protocol):
    @property
    def watch(self) -> MetadataWatch:
        """Notified at every applied command and when the leader or readiness changes."""
        ...

    @property
    def state(self) -> MetadataState:
        """The metadata as last applied here: an immutable value, safe to keep."""
        ...

    @property
    def ready(self) -> bool:
        """Everything committed when this member started has been applied here."""
        ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def term(self) -> int: ...

    @property
    def leader(self) -> str | None:
        """The leader's address, None while none is known."""
        ...

    async def propose(self, proposal: Command) -> None:
        """Commit ``proposal`` (on the leader); raises ``MetadataError`` when the state machine
        refused it, ``NoMetadataLeader`` when its outcome is unknown."""
        ...

    def quorum(self) -> dict[str, Any]:
        """Leader, term, commit index, and each voter's match index and connection state."""
        ...

    def members(self) -> list[str]: ...

    async def add_voter(self, address: str, wait: float) -> bool | None: ...


def apply_command(state: MetadataState, command: bytes) -> tuple[MetadataState, tuple[str, str] | None]:
    """The state after the encoded ``command``, and the refusal (code, message) if it was refused."""
    try:
        decoded = decode_command(command)
    except CommandError as exc:
        # A command journaled by another bascule version: refuse it the same way on every node.
        log.error("refusing journaled command: %s", exc)
        return state, ("INVALID_ARGUMENT", str(exc))
    try:
        return state.apply(decoded)
    except Exception as exc:
        # pysyncobj would retry a raising apply forever, on every node and every replay,
        # wedging the group: a command that cannot be applied is a deterministic no-op.
        log.exception("refusing a command the state machine could not apply: %.200r", decoded)
        return state, ("INVALID_ARGUMENT", f"cannot apply {decoded.OP}: {exc}")
