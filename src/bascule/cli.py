"""The ``bascule`` command: the server, and Liftbridge-style admin commands.

Admin commands print tables for people and JSON with ``--json``; a failure is one
line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from typing import Any

from bascule.client import ACK_POLICIES, START_POSITIONS, BasculeError, Client, ClientTls

EXIT_ERROR = 1


def _address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-a", "--address", default="127.0.0.1:9292", help="server address host:port")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a reply")
    parser.add_argument("--tls-ca", metavar="FILE", help="TLS: the CA that signed the server's certificate")
    parser.add_argument("--tls-cert", metavar="FILE", help="TLS: this client's certificate (mutual TLS)")
    parser.add_argument("--tls-key", metavar="FILE", help="TLS: the key of --tls-cert")


def _stream(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-s", "--stream", required=True, help="stream name")


def _target_partitions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--partitions", type=int, action="append", default=[],
                        help="target partition (repeatable; default all)")


def build_parser() -> argparse.ArgumentParser:
    from bascule.config import add_server_arguments

    parser = argparse.ArgumentParser(prog="bascule", description="Durable, replicated streams on NATS")
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run a bascule server")
    add_server_arguments(server)

    create = commands.add_parser("create", help="create a stream")
    _address(create)
    _stream(create)
    create.add_argument("--subject", help="NATS subject (default: the stream name)")
    create.add_argument("-g", "--group", default="", help="NATS queue group")
    create.add_argument("-n", "--partitions", type=int, default=1, help="number of partitions")
    create.add_argument("-r", "--replication-factor", type=int, default=1, help="replicas (-1: all brokers)")
    create.add_argument("--min-isr", type=int, help="minimum in-sync replicas")
    create.add_argument("--retention-max-bytes", type=int)
    create.add_argument("--retention-max-messages", type=int)
    create.add_argument("--retention-max-age", type=float, help="seconds")
    create.add_argument("--compact", dest="compact_enabled", action="store_true", default=None,
                        help="compact by key (compactEnabled)")
    create.add_argument("--encryption", action="store_true", default=None,
                        help="encrypt values at rest (every node needs LIFTBRIDGE_ENCRYPTION_KEY)")

    delete = commands.add_parser("delete", help="delete a stream")
    _address(delete)
    _stream(delete)

    publish = commands.add_parser("publish", help="publish messages to a stream")
    _address(publish)
    _stream(publish)
    publish.add_argument("-m", "--message", action="append", required=True, help="message value (repeatable)")
    publish.add_argument("-k", "--key", help="message key")
    publish.add_argument("-H", "--header", action="append", default=[], help="header NAME=VALUE (repeatable)")
    publish.add_argument("--partition", type=int, default=0)
    publish.add_argument("--ack-policy", choices=sorted(ACK_POLICIES), default="leader")

    subscribe = commands.add_parser("subscribe", help="read messages from a stream partition")
    _address(subscribe)
    _stream(subscribe)
    subscribe.add_argument("--partition", type=int, default=0)
    subscribe.add_argument("--start", choices=sorted(START_POSITIONS), default="earliest")
    subscribe.add_argument("-o", "--offset", type=int, help="start at this offset")
    subscribe.add_argument("--timestamp", type=int, help="start at this time (ns since epoch)")
    subscribe.add_argument("-n", "--count", type=int, help="exit after this many messages")
    subscribe.add_argument("--stop-latest", action="store_true", help="exit after the newest message")
    subscribe.add_argument("--read-isr-replica", action="store_true")
    subscribe.add_argument("--reverse", action="store_true", help="newest first, back to the oldest message")

    metadata = commands.add_parser("metadata", help="brokers and streams")
    _address(metadata)
    metadata.add_argument("streams", nargs="*", help="streams to show (default all)")

    partition_metadata = commands.add_parser("partition-metadata", help="one partition, from its leader")
    _address(partition_metadata)
    _stream(partition_metadata)
    partition_metadata.add_argument("--partition", type=int, default=0)

    pause = commands.add_parser("pause", help="pause a stream's partitions")
    _address(pause)
    _stream(pause)
    _target_partitions(pause)
    pause.add_argument("-r", "--resume-all", action="store_true",
                       help="resume all partitions when one is published to")

    readonly = commands.add_parser("set-readonly", help="make partitions readonly (or writable)")
    _address(readonly)
    _stream(readonly)
    _target_partitions(readonly)
    readonly.add_argument("--writable", action="store_true", help="clear the readonly flag instead")

    set_cursor = commands.add_parser("set-cursor", help="store a consumer cursor")
    _address(set_cursor)
    _stream(set_cursor)
    set_cursor.add_argument("--partition", type=int, default=0)
    set_cursor.add_argument("-c", "--cursor", required=True, help="cursor id")
    set_cursor.add_argument("-o", "--offset", type=int, required=True)

    fetch_cursor = commands.add_parser("fetch-cursor", help="read a consumer cursor (-1 if unknown)")
    _address(fetch_cursor)
    _stream(fetch_cursor)
    fetch_cursor.add_argument("--partition", type=int, default=0)
    fetch_cursor.add_argument("-c", "--cursor", required=True, help="cursor id")
    status = commands.add_parser("status", help="the metadata Raft group: leader, term, voters' lag")
    _address(status)

    partitions = commands.add_parser("partitions", help="leader, ISR, HW, log end and lag of each replica")
    _address(partitions)
    partitions.add_argument("stream", nargs="?", default="", help="one stream (default all)")
    return parser


def _print(args: argparse.Namespace, data: Any, table: list[list[Any]] | None = None) -> None:
    if args.json:
        print(json.dumps(data, default=_jsonable))
    elif table:
        widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
        for row in table:
            print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    elif data is not None:
        print(data)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return asdict(value)


async def _admin(args: argparse.Namespace) -> None:
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = ClientTls.from_files(args.tls_ca, args.tls_cert, args.tls_key)
    async with Client(args.address, timeout=args.timeout, tls=tls) as client:
        await ADMIN_COMMANDS[args.command](client, args)


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
    _print(args, {"created": args.stream}, None if args.json else [[f"created stream {args.stream}"]])


async def _delete(client: Client, args: argparse.Namespace) -> None:
    await client.delete_stream(args.stream)
    _print(args, {"deleted": args.stream}, [[f"deleted stream {args.stream}"]])


async def _publish(client: Client, args: argparse.Namespace) -> None:
    headers = {}
    for header in args.header:
        name, sep, value = header.partition("=")
        if not sep:
            raise ValueError(f"header {header!r} is not NAME=VALUE")
        headers[name] = value.encode()
    acks = []
    for value in args.message:
        ack = await client.publish(
            args.stream, value.encode(), key=args.key.encode() if args.key else None, headers=headers,
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
            print(json.dumps({
                "offset": message.offset, "timestamp": message.timestamp, "subject": message.subject,
                "key": message.key.decode(errors="replace") if message.key else None,
                "value": message.value.decode(errors="replace"),
                "headers": {k: v.decode(errors="replace") for k, v in message.headers.items()},
            }), flush=True)
        else:
            key = f" key={message.key.decode(errors='replace')}" if message.key else ""
            print(f"{message.offset}{key} {message.value.decode(errors='replace')}", flush=True)
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
            flags = ",".join(f for f, on in (("paused", p.paused), ("readonly", p.readonly)) if on)
            rows.append([stream.name, stream.subject, p.id, p.leader, ",".join(p.replicas), ",".join(p.isr),
                         p.high_watermark, p.newest_offset, flags or "-"])
    if not args.json:
        print("brokers: " + ", ".join(f"{b} ({addr})" for b, addr in sorted(metadata.brokers.items())))
    _print(args, metadata, rows)


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
    "partition-metadata": _partition_metadata,
    "pause": _pause,
    "set-readonly": _set_readonly,
    "set-cursor": _set_cursor,
    "fetch-cursor": _fetch_cursor,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["server"]:
        from bascule.config.loading import go_style_flags

        argv = ["server", *go_style_flags(argv[1:])]
    args = build_parser().parse_args(argv)
    try:
        if args.command == "server":
            from bascule.server import run_from_args

            return run_from_args(args)
        asyncio.run(_admin(args))
    except BasculeError as exc:
        print(f"bascule {args.command}: {exc.code.name.lower().replace('_', ' ')}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except (ValueError, OSError) as exc:
        print(f"bascule {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
