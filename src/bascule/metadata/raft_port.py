"""Bounds on what a stranger can make the Raft port hold (issue 27).

pysyncobj 0.3.17's TcpConnection reads whatever arrives into one ``bytes`` buffer, re-copied at each
read, until the 4-byte length at its head is complete; it checks no length, authenticates the first
message only once it is whole, and checks an idle connection's timeout only when its socket has an
event. A client without the password could make a node buffer up to 2 GiB (with quadratic copying)
and keep any number of silent connections open. Installed once per process (``install``):

- a message's declared length is checked as soon as its 4 bytes are there: the first message of a
  connection (the encrypted key exchange, some 150 bytes) may be at most FIRST_MESSAGE_LIMIT, any
  other at most MESSAGE_LIMIT (pysyncobj's own are batches of entries, at most raft.APPEND_BATCH_BYTES,
  or a snapshot piece); a longer, or negative, one closes the connection;
- reading stops once a whole message's worth is buffered, and the buffer is a bytearray that is
  consumed in place;
- ``expire_silent`` (on the tick thread) closes the connections that have not identified themselves
  (no key exchange, or no node name yet) within the connection timeout;
- at most UNIDENTIFIED_LIMIT such connections are held at once: a new one beyond it takes the place
  of the one silent longest, so that a stranger opening connections as fast as it can neither
  exhausts the process's file descriptors nor keeps a peer that identifies itself at once out;
- the listening socket's backlog is ACCEPT_BACKLOG, not pysyncobj's 5: a burst of a stranger's
  connects would otherwise fill it, and a peer's connect be dropped and retried seconds later.
"""

from __future__ import annotations

import errno
import logging
import pickle  # pysyncobj's own format, unpickled only once a message is authenticated
import socket
import struct
import zlib
from typing import Any

from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.transport import TCPTransport

log = logging.getLogger(__name__)

FIRST_MESSAGE_LIMIT = 4 << 10
MESSAGE_LIMIT = 64 << 20
UNIDENTIFIED_LIMIT = 64
ACCEPT_BACKLOG = 128
_LENGTH = struct.Struct("i")  # pysyncobj's: native byte order


def _limit(connection: Any) -> int:
    authenticated = connection.encryptor is None or connection.sendRandKey is not None
    return MESSAGE_LIMIT if authenticated else FIRST_MESSAGE_LIMIT


def _process_read(connection: Any) -> bool:
    buffer = _buffer(connection)
    if len(buffer) > _LENGTH.size + _limit(connection):
        return False  # a whole message's worth is here: it is parsed before more is read
    sock = connection._TcpConnection__socket
    try:
        incoming = sock.recv(connection._TcpConnection__recvBufferSize)
    except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            connection.disconnect()
        return False
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or not incoming:
        connection.disconnect()
        return False
    buffer += incoming
    return True


def _process_parse_message(connection: Any) -> Any:
    buffer = _buffer(connection)
    if len(buffer) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(buffer)
    if not 0 <= length <= _limit(connection):
        log.warning("closing a Raft connection that announced a message of %d bytes", length)
        connection.disconnect()
        return None
    end = _LENGTH.size + length
    if len(buffer) < end:
        return None
    data = bytes(buffer[_LENGTH.size:end])
    del buffer[:end]
    try:
        encryptor = connection.encryptor
        if encryptor:
            timestamp = encryptor.extract_timestamp(data)
            if timestamp < connection.recvLastTimestamp:
                raise ValueError("a replayed message")
            connection.recvLastTimestamp = timestamp
            data = encryptor.decrypt(data)
        message = pickle.loads(zlib.decompress(data))
        if connection.recvRandKey:
            rand_key, message = message
            if rand_key != connection.recvRandKey:
                raise ValueError("the wrong session key")
    except Exception:  # a message that does not authenticate or decode: the connection goes
        connection.disconnect()
        return None
    return message


def _buffer(connection: Any) -> bytearray:
    buffer = connection._TcpConnection__readBuffer
    if not isinstance(buffer, bytearray):  # pysyncobj resets it to bytes() at connect and disconnect
        buffer = connection._TcpConnection__readBuffer = bytearray(buffer)
    return buffer


_accept = TCPTransport._onNewIncomingConnection
_bind = TcpServer.bind


def _bind_with_backlog(server: Any) -> None:
    _bind(server)
    server._TcpServer__socket.listen(ACCEPT_BACKLOG)


def _on_new_incoming_connection(transport: Any, connection: Any) -> None:
    unidentified = [c for c in transport._unknownConnections if c.state != CONNECTION_STATE.DISCONNECTED]
    if len(unidentified) >= UNIDENTIFIED_LIMIT:
        silent_longest = min(unidentified, key=lambda c: c._TcpConnection__lastReadTime)
        silent_longest.disconnect()
        transport._unknownConnections.discard(silent_longest)
    _accept(transport, connection)


def install() -> None:
    TcpConnection._TcpConnection__processRead = _process_read
    TcpConnection._TcpConnection__processParseMessage = _process_parse_message
    TCPTransport._onNewIncomingConnection = _on_new_incoming_connection
    TcpServer.bind = _bind_with_backlog


def expire_silent(transport: Any, timeout: float) -> None:
    """Close the incoming connections that have not identified themselves within ``timeout``."""
    now = monotonic()
    for connection in list(transport._unknownConnections):
        if connection.state != CONNECTION_STATE.DISCONNECTED and \
                now - connection._TcpConnection__lastReadTime > timeout:
            connection.disconnect()
            transport._unknownConnections.discard(connection)
