"""The admin commands of ``bascule``: each asks the first reachable server through bascule's client."""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import socket
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from bascule.cli import (
    ADDRESS_ENV,
    DEFAULT_ADDRESS,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_UNREACHABLE,
    _addresses,
    _host_and_port,
)
from bascule.client import BasculeError, Client, ClientTls, _as_dict
from bascule.wire.pb import admin_pb2, admin_pb2_grpc


class Unreachable(Exception):
    """No address accepted a connection."""



def _check_arguments(args: argparse.Namespace) -> None:
    """What argparse cannot check alone: a usage error (``error`` exits with EXIT_USAGE)."""
    error = args.command_parser.error
    args.addresses = args.addresses + getattr(args, "command_addresses", [])
    if not args.addresses:
        try:
            args.addresses = _addresses(os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS)
        except argparse.ArgumentTypeError as exc:
            error(f"${ADDRESS_ENV}: {exc}")
    if bool(args.tls_cert) != bool(args.tls_key):
        error("--tls-cert and --tls-key go together")
    try:
        args.tls = _tls(args)
    except OSError as exc:
        error(f"TLS: {exc}")
    if args.command == "subscribe":
        problem = _start_problem(args)
        if problem:
            error(problem)


def _start_problem(args: argparse.Namespace) -> str | None:
    implied = "offset" if args.offset is not None else "timestamp" if args.timestamp is not None else None
    if args.offset is not None and args.timestamp is not None:
        return "-o/--offset and --timestamp are two start positions: give one"
    if args.start == "offset" and args.offset is None:
        return "--start offset needs -o/--offset OFFSET"
    if args.start == "timestamp" and args.timestamp is None:
        return "--start timestamp needs --timestamp NS"
    if implied and args.start not in (None, implied):
        return f"--start {args.start} contradicts {'-o/--offset' if implied == 'offset' else '--timestamp'}"
    args.start = args.start or implied or "earliest"
    return None


# --- output ---




def _print(args: argparse.Namespace, data: Any, table: list[list[Any]] | None = None) -> None:
    if args.json:
        print(json.dumps(_json_ready(data)), flush=True)
    elif table:
        widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
        for row in table:
            print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


def _json_ready(value: Any) -> Any:
    """``value`` with the client's dataclasses as objects whose keys are camelCase and bytes as base64.
    Mapping keys are data (stream names, broker ids, header names) and stay as they are."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_camel(f.name): _json_ready(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    return value


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _text(data: bytes) -> str:
    return data.decode(errors="backslashreplace")


# --- running a command ---


async def _run_admin(args: argparse.Namespace) -> None:
    args.address = await _first_reachable(args.addresses, args.connect_timeout)
    brokers = [args.address, *(address for address in args.addresses if address != args.address)]
    async with Client(brokers, timeout=args.timeout, tls=args.tls) as client:
        await ADMIN_COMMANDS[args.command](client, args)


async def _run_wait(args: argparse.Namespace) -> None:
    """Polls the addresses until one answers with at least --brokers brokers, for up to --for seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.wait_for
    seen: dict[str, str] | None = None
    while True:
        try:
            address = await _first_reachable(args.addresses, args.connect_timeout)
            async with Client(address, timeout=min(args.timeout, 2.0), tls=args.tls) as client:
                seen = (await client.fetch_metadata()).brokers
        except Unreachable:
            if loop.time() > deadline and seen is None:
                raise
        except BasculeError:
            pass  # no metadata leader yet: the node is still starting
        if seen is not None and len(seen) >= args.brokers:
            print("brokers: " + ", ".join(f"{b} ({addr})" for b, addr in sorted(seen.items())))
            return
        if loop.time() > deadline:
            listed = ", ".join(sorted(seen or ())) or "none"
            raise BasculeError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"{len(seen or ())} of {args.brokers} brokers after {args.wait_for:g} s ({listed})")
        await asyncio.sleep(0.2)


async def _first_reachable(addresses: Sequence[str], timeout: float) -> str:
    """The first address that accepts a TCP connection: a wrong address fails in about a second
    instead of in the client's retries of UNAVAILABLE for the whole --timeout."""
    problems = []
    for address in addresses:
        host, port = _host_and_port(address)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except TimeoutError:
            problems.append(f"{address}: no connection within {timeout:g} s")
        except OSError as exc:
            problems.append(f"{address}: {_connect_failure(exc)}")
        else:
            writer.close()
            return address
    raise Unreachable(f"cannot reach a bascule server at {'; '.join(problems)}")


def _connect_failure(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return "unknown host"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return (error.strerror or str(error)).lower()


def _tls(args: argparse.Namespace) -> ClientTls | None:
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    return ClientTls.from_files(args.tls_ca, args.tls_cert, args.tls_key)


async def _create(client: Client, args: argparse.Namespace) -> None:
    settings = {
        key: value for key in ("min_isr", "retention_max_bytes", "retention_max_messages", "retention_max_age",
                               "compact_enabled", "encryption")
        if (value := getattr(args, key)) is not None
    }
    await client.create_stream(
        args.stream, args.subject, group=args.group, partitions=args.partitions,
        replication_factor=args.replication_factor, **settings,
    )
    _print(args, {"created": args.stream}, [[f"created stream {args.stream}"]])


async def _delete(client: Client, args: argparse.Namespace) -> None:
    await client.delete_stream(args.stream)
    _print(args, {"deleted": args.stream}, [[f"deleted stream {args.stream}"]])


async def _publish(client: Client, args: argparse.Namespace) -> None:
    acks = []
    for value in args.message:
        ack = await client.publish(
            args.stream, value.encode(), key=args.key.encode() if args.key else None, headers=dict(args.header),
            partition=args.partition, ack_policy=args.ack_policy,
        )
        acks.append({"stream": args.stream, "partition": args.partition, "offset": ack.offset if ack else None})
    _print(args, acks, [["STREAM", "PARTITION", "OFFSET"]] + [[a["stream"], a["partition"], a["offset"]] for a in acks])


async def _subscribe(client: Client, args: argparse.Namespace) -> None:
    received = 0
    if args.count == 0:
        return
    async for message in client.subscribe(
        args.stream, args.partition, start=args.start, offset=args.offset, timestamp=args.timestamp,
        stop_latest=args.stop_latest, read_isr_replica=args.read_isr_replica, reverse=args.reverse,
    ):
        if args.json:
            print(json.dumps(_json_ready(message)), flush=True)
        else:
            key = f" key={_text(message.key)}" if message.key else ""
            print(f"{message.offset}{key} {_text(message.value)}", flush=True)
        received += 1
        if args.count is not None and received >= args.count:
            return


async def _metadata(client: Client, args: argparse.Namespace) -> None:
    metadata = await client.fetch_metadata(*args.streams)
    rows = [["STREAM", "SUBJECT", "PARTITION", "LEADER", "REPLICAS", "ISR", "HW", "NEWEST", "FLAGS"]]
    for stream in metadata.streams.values():
        if not stream.exists:
            rows.append([stream.name, "-", "-", "-", "-", "-", "-", "-", "unknown stream"])
        for p in stream.partitions.values():
            rows.append([stream.name, stream.subject, p.id, p.leader, ",".join(p.replicas), ",".join(p.isr),
                         p.high_watermark, p.newest_offset, _flags(p.paused, p.readonly)])
    if not args.json:
        print("brokers: " + ", ".join(f"{b} ({addr})" for b, addr in sorted(metadata.brokers.items())))
    _print(args, metadata, rows)


def _flags(paused: bool, readonly: bool) -> str:
    return ",".join(f for f, on in (("paused", paused), ("readonly", readonly)) if on) or "-"


async def _stream_info(client: Client, args: argparse.Namespace) -> None:
    response = await _admin_partitions(client, args)
    streams = [s for s in response.streams if s.name == args.stream]
    if not streams:
        raise BasculeError(grpc.StatusCode.NOT_FOUND, f"no such stream: {args.stream}")
    stream = _as_dict(streams[0])
    stream["partitions"] = [_as_dict(p) for p in response.partitions if p.stream == args.stream]
    if args.json:
        _print(args, stream)
        return
    created = datetime.fromtimestamp(stream["creationTime"] / 1e9, UTC).isoformat(timespec="seconds")
    print(f"stream {stream['name']}  subject {stream['subject']}  group {stream['group'] or '-'}  "
          f"replication factor {stream['replicationFactor']}  created {created}")
    print("settings: " + "  ".join(f"{key}={value}" for key, value in stream["settings"].items()))
    rows = [["PARTITION", "LEADER", "REPLICAS", "ISR", "MESSAGES", "BYTES", "OLDEST", "NEWEST", "HW", "FLAGS"]]
    for p in stream["partitions"]:
        known = p["oldestOffset"] >= 0
        rows.append([p["partition"], p["leader"], ",".join(p["replicas"]), ",".join(p["isr"]),
                     *((p["messages"], p["sizeBytes"], p["oldestOffset"], p["newestOffset"]) if known else ["?"] * 4),
                     p["highWatermark"] if known else "?", _flags(p["paused"], p["readonly"])])
    _print(args, None, rows)


async def _admin_partitions(client: Client, args: argparse.Namespace) -> admin_pb2.PartitionsResponse:
    """The admin Partitions call itself, for the streams' settings that `Client.partitions` leaves out."""
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    async with (grpc.aio.insecure_channel(args.address, options=options) if args.tls is None
                else grpc.aio.secure_channel(args.address, args.tls.credentials(), options=options)) as channel:
        request = admin_pb2.PartitionsRequest(stream=args.stream)
        try:
            return await admin_pb2_grpc.AdminStub(channel).Partitions(request, timeout=args.timeout)
        except grpc.aio.AioRpcError as exc:
            raise BasculeError(exc.code(), exc.details() or "") from None


async def _partition_metadata(client: Client, args: argparse.Namespace) -> None:
    p = await client.fetch_partition_metadata(args.stream, args.partition)
    _print(args, p, [["LEADER", "REPLICAS", "ISR", "HW", "NEWEST"],
                     [p.leader, ",".join(p.replicas), ",".join(p.isr), p.high_watermark, p.newest_offset]])


async def _pause(client: Client, args: argparse.Namespace) -> None:
    await client.pause_stream(args.stream, args.partitions, args.resume_all)
    _print(args, {"paused": args.stream}, [[f"paused stream {args.stream}"]])


async def _set_readonly(client: Client, args: argparse.Namespace) -> None:
    await client.set_stream_readonly(args.stream, args.partitions, not args.writable)
    state = "writable" if args.writable else "readonly"
    _print(args, {state: args.stream}, [[f"stream {args.stream} is {state}"]])


async def _set_cursor(client: Client, args: argparse.Namespace) -> None:
    await client.set_cursor(args.stream, args.partition, args.cursor, args.offset)
    _print(args, {"cursor": args.cursor, "offset": args.offset}, [[f"cursor {args.cursor} = {args.offset}"]])


async def _fetch_cursor(client: Client, args: argparse.Namespace) -> None:
    offset = await client.fetch_cursor(args.stream, args.partition, args.cursor)
    _print(args, {"cursor": args.cursor, "offset": offset}, [[offset]])


async def _status(client: Client, args: argparse.Namespace) -> None:
    status = await client.status()
    if not args.json:
        print(f"raft leader: {status['raftLeaderId'] or '?'} ({status['raftLeader'] or 'none'})  "
              f"term {status['term']}  commit index {status['commitIndex']}  (view of {status['answeredBy']})")
    rows = [["BROKER", "ADDRESS", "RAFT", "ROLE", "MATCH", "LAG", "CONNECTED"]]
    voters = {v["address"]: v for v in status["voters"]}
    for broker in status["brokers"]:
        voter = voters.pop(broker["raftAddress"], {})
        rows.append([broker["id"], f"{broker['host']}:{broker['port']}", broker["raftAddress"],
                     "leader" if voter.get("leader") else ("voter" if voter else "-"),
                     voter.get("matchIndex", "-"), voter.get("lag", "-"), voter.get("connected", "-")])
    for voter in voters.values():
        rows.append(["?", "-", voter["address"], "leader" if voter["leader"] else "voter",
                     voter["matchIndex"], voter["lag"], voter["connected"]])
    _print(args, status, rows)


async def _partitions(client: Client, args: argparse.Namespace) -> None:
    partitions = await client.partitions(args.stream)
    rows = [["STREAM", "PARTITION", "LEADER", "EPOCH", "LEADER EPOCH", "HW", "REPLICA", "ISR", "LOG END", "LAG"]]
    for p in partitions:
        for r in p["replicaStatus"]:
            end = r["logEndOffset"] if r["reachable"] else "unreachable"
            rows.append([p["stream"], p["partition"], p["leader"], p["partitionEpoch"], p["leaderEpoch"],
                         p["highWatermark"], r["id"], _in_isr(p, r), end,
                         r["lag"] if r["reachable"] else "-"])
    _print(args, partitions, rows)


def _in_isr(partition: dict, replica: dict) -> str:
    if not replica["inIsr"]:
        return "no"
    return "unclean" if replica["id"] in partition.get("unclean", ()) else "yes"


ADMIN_COMMANDS = {
    "status": _status,
    "partitions": _partitions,
    "create": _create,
    "delete": _delete,
    "publish": _publish,
    "subscribe": _subscribe,
    "metadata": _metadata,
    "stream-info": _stream_info,
    "partition-metadata": _partition_metadata,
    "pause": _pause,
    "set-readonly": _set_readonly,
    "set-cursor": _set_cursor,
    "fetch-cursor": _fetch_cursor,
}


def run(args: argparse.Namespace) -> int:
    """Run the admin command ``args`` names; its exit status."""
    _check_arguments(args)
    try:
        asyncio.run(_run_wait(args) if args.command == "wait" else _run_admin(args))
    except BasculeError as exc:
        print(f"bascule {args.command}: {exc.code.name.lower().replace('_', ' ')}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except Unreachable as exc:
        print(f"bascule {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (ValueError, OSError) as exc:
        print(f"bascule {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0
