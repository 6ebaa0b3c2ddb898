"""The ``bascule`` command: the server, and Liftbridge-style admin commands.

Admin commands print tables for people and JSON with ``--json`` (camelCase keys, as Liftbridge's JSON
has them; bytes in base64); a failure is one line on stderr and an exit status that says what failed
(EXIT_STATUS below). The admin commands are in ``admin``, imported only for them: `bascule server` never
loads grpcio and the client (10 MiB of every node's memory).
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bascule.config import Config

EXIT_ERROR = 1  # the server refused or failed the request, or did not answer in time
EXIT_USAGE = 2  # argparse's own status for bad flags
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

ADDRESS_ENV = "BASCULE_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:9292"

EPILOG = f"""\
addresses:
  -a/--address HOST:PORT, before or after the command, repeatable or comma-separated; else
  ${ADDRESS_ENV} (comma-separated); else {DEFAULT_ADDRESS}. The first address that accepts a
  connection within --connect-timeout is asked first, the others if it fails.

flags that mean the same in every command:
  -s/--stream NAME, -p/--partition ID, -o/--offset OFFSET, -n/--count N (messages), -c/--cursor ID,
  -k/--key, -m/--message, -H/--header, -g/--group, -r/--replication-factor.
  `bascule server` takes Liftbridge's server flags instead (there -n is --nats-servers, -p --port).

exit status:
  {0} done
  {EXIT_ERROR} the server refused or failed the request, or gave no answer within --timeout
  {EXIT_USAGE} usage error: a bad flag, address, offset or other argument
  {EXIT_UNREACHABLE} no server reachable at any address
  {EXIT_INTERRUPTED} interrupted (Ctrl-C)
"""




# --- argument types: each refuses a bad value with a usage error that says why ---


def _addresses(value: str) -> list[str]:
    addresses = [item.strip() for item in value.split(",") if item.strip()]
    if not addresses:
        raise argparse.ArgumentTypeError("no address given")
    for address in addresses:
        _host_and_port(address)
    return addresses


def _host_and_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:9292
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{address!r} is not HOST:PORT")
    return host, int(port)


def _non_negative(value: str) -> int:
    number = _integer(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is negative")
    return number


def _positive(value: str) -> int:
    number = _integer(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not at least 1")
    return number


def _integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of seconds")
    return seconds


def _header(value: str) -> tuple[str, bytes]:
    name, sep, header_value = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=VALUE")
    return name, header_value.encode()


# --- the parser ---


def _connection_options(parser: argparse.ArgumentParser, per_command: bool) -> None:
    """The options every admin command takes, before the command (global) or after it. After it, a
    flag not given keeps the global value (SUPPRESS), and addresses add to the global ones."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if per_command else value

    parser.add_argument("-a", "--address", dest="command_addresses" if per_command else "addresses",
                        type=_addresses, action="extend", default=default([]), metavar="HOST:PORT[,...]",
                        help=f"server addresses (repeatable; default ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print JSON (camelCase keys, bytes in base64) instead of a table")
    parser.add_argument("--timeout", type=_seconds, default=default(10.0), metavar="SECONDS",
                        help="seconds to wait for a reply (default 10)")
    parser.add_argument("--connect-timeout", type=_seconds, default=default(1.0), metavar="SECONDS",
                        help="seconds to wait for each address to accept a connection (default 1)")
    parser.add_argument("--tls-ca", metavar="FILE", default=default(None),
                        help="TLS: the CA that signed the server's certificate")
    parser.add_argument("--tls-cert", metavar="FILE", default=default(None),
                        help="TLS: this client's certificate (mutual TLS)")
    parser.add_argument("--tls-key", metavar="FILE", default=default(None), help="TLS: the key of --tls-cert")


def _stream(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-s", "--stream", required=True, help="stream name")


def _partition(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--partition", type=_non_negative, default=0, help="partition (default 0)")


def _target_partitions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--partition", "--partitions", dest="partitions", type=_non_negative,
                        action="append", default=[], help="target partition (repeatable; default all)")


def build_parser() -> argparse.ArgumentParser:
    from bascule.config import VersionAction, add_server_arguments
    from bascule.wire.policies import ACK_POLICIES, START_POSITIONS  # protobuf: after the server's deferrals

    parser = argparse.ArgumentParser(
        prog="bascule", description="Durable, replicated streams on NATS", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    _connection_options(parser, per_command=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    server = commands.add_parser("server", help="run a bascule server")
    add_server_arguments(server)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, epilog=EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        _connection_options(sub, per_command=True)
        sub.set_defaults(command_parser=sub)  # for usage errors that only a whole command line shows
        return sub

    create = command("create", "create a stream")
    _stream(create)
    create.add_argument("--subject", help="NATS subject (default: the stream name)")
    create.add_argument("-g", "--group", default="", help="NATS queue group")
    create.add_argument("--partitions", type=_positive, default=1, help="number of partitions (default 1)")
    create.add_argument("-r", "--replication-factor", type=int, default=1, help="replicas (-1: all brokers)")
    create.add_argument("--min-isr", type=_non_negative, help="minimum in-sync replicas")
    create.add_argument("--retention-max-bytes", type=_non_negative)
    create.add_argument("--retention-max-messages", type=_non_negative)
    create.add_argument("--retention-max-age", type=float, help="seconds")
    create.add_argument("--compact", dest="compact_enabled", action="store_true", default=None,
                        help="compact by key (compactEnabled)")
    create.add_argument("--encryption", action="store_true", default=None,
                        help="encrypt values at rest (every node needs LIFTBRIDGE_ENCRYPTION_KEY)")

    delete = command("delete", "delete a stream")
    _stream(delete)

    publish = command("publish", "publish messages to a stream partition")
    _stream(publish)
    _partition(publish)
    publish.add_argument("-m", "--message", action="append", required=True, help="message value (repeatable)")
    publish.add_argument("-k", "--key", help="message key")
    publish.add_argument("-H", "--header", type=_header, action="append", default=[],
                         help="header NAME=VALUE (repeatable)")
    publish.add_argument("--ack-policy", choices=sorted(ACK_POLICIES), default="leader")

    subscribe = command("subscribe", "read messages from a stream partition")
    _stream(subscribe)
    _partition(subscribe)
    subscribe.add_argument("--start", choices=sorted(START_POSITIONS),
                           help="where to start (default earliest; offset with -o, timestamp with --timestamp)")
    subscribe.add_argument("-o", "--offset", type=_non_negative, help="start at this offset")
    subscribe.add_argument("--timestamp", type=_non_negative, help="start at this time (ns since the epoch)")
    subscribe.add_argument("-n", "--count", type=_non_negative, help="exit after this many messages")
    subscribe.add_argument("--stop-latest", action="store_true", help="exit after the newest message")
    subscribe.add_argument("--read-isr-replica", action="store_true", help="read from any ISR replica")
    subscribe.add_argument("--reverse", action="store_true", help="newest first, back to the oldest message")

    wait = command("wait", "wait until a server answers and its metadata lists enough brokers (a starting "
                           "node, a forming cluster), then print them")
    wait.add_argument("--brokers", type=_positive, default=1, metavar="N", help="brokers to wait for (default 1)")
    wait.add_argument("--for", dest="wait_for", type=_seconds, default=30.0, metavar="SECONDS",
                      help="give up after this long (default 30): exit status 3 if no server answered, else 1")

    metadata = command("metadata", "brokers and streams")
    metadata.add_argument("streams", nargs="*", help="streams to show (default all)")

    stream_info = command("stream-info", "a stream's settings and each partition's log: messages, bytes, "
                                         "oldest and newest offset, HW, leader, replicas, ISR")
    stream_info.add_argument("stream", help="stream name")

    partition_metadata = command("partition-metadata", "one partition, from its leader")
    _stream(partition_metadata)
    _partition(partition_metadata)

    pause = command("pause", "pause a stream's partitions")
    _stream(pause)
    _target_partitions(pause)
    pause.add_argument("--resume-all", action="store_true", help="resume all partitions when one is published to")

    readonly = command("set-readonly", "make partitions readonly (or writable)")
    _stream(readonly)
    _target_partitions(readonly)
    readonly.add_argument("--writable", action="store_true", help="clear the readonly flag instead")

    set_cursor = command("set-cursor", "store a consumer cursor")
    _stream(set_cursor)
    _partition(set_cursor)
    set_cursor.add_argument("-c", "--cursor", required=True, help="cursor id")
    set_cursor.add_argument("-o", "--offset", type=_non_negative, required=True)

    fetch_cursor = command("fetch-cursor", "read a consumer cursor (-1 if unknown)")
    _stream(fetch_cursor)
    _partition(fetch_cursor)
    fetch_cursor.add_argument("-c", "--cursor", required=True, help="cursor id")

    command("status", "the metadata Raft group: leader, term, voters' lag")

    partitions = command("partitions", "leader, ISR, HW, log end and lag of each replica")
    partitions.add_argument("stream", nargs="?", default="", help="one stream (default all)")
    return parser



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["server"]:
        return _server(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "server":
        import_server()
        from bascule.server import run_from_args

        return run_from_args(args)
    from bascule.cli.admin import run

    return run(args)


def _server(argv: list[str]) -> int:
    """``bascule server``: its configuration is read before the server's modules are imported, which
    leave ssl out unless it asks for TLS (``prepare_server_imports``)."""
    prepare_server_imports()
    from bascule.config import ConfigError, load_config, overrides_from_args
    from bascule.config.loading import go_style_flags

    args = build_parser().parse_args(["server", *go_style_flags(argv)])
    config: Config | None
    try:
        config = load_config(args.config, overrides_from_args(args))
    except ConfigError:
        config = None  # run_from_args reads it again and says why
    import_server(tls=config is None or config.asks_for_tls)
    from bascule.server import run_from_args

    return run_from_args(args, config)


# The stand-ins prepare_server_imports put in sys.modules, until import_server withdraws them; None before.
_stand_ins: list[ModuleType | None] | None = None


def prepare_server_imports() -> None:
    """What must precede the first of the server's imports: dataclasses take their code from the file
    (``dataclass_code``); ssl, nats-py's JetStream API and protobuf's pure-Python messages are loaded on
    first use (``deferred_imports``); and nats-py and crc32c look their versions up at their import
    without importlib.metadata (``installed_version``; 2.7 MiB resident, 15 ms)."""
    global _stand_ins
    if _stand_ins is not None or "bascule.server" in sys.modules:
        return
    from bascule import dataclass_code, deferred_imports

    dataclass_code.install()
    deferred_imports.defer_ssl()
    _stand_ins = [deferred_imports.stand_in_for_versions()]
    deferred_imports.defer_submodules()


def import_server(write_code: bool | None = None, tls: bool = True) -> None:
    """The server's modules, imported after ``prepare_server_imports``, with ssl unless ``tls`` is
    false (then it is imported at its first use: a NATS server that asks for TLS); the dataclasses'
    code file written as ``dataclass_code.finish``'s ``write`` says."""
    global _stand_ins
    if "bascule.server" in sys.modules:
        return
    prepare_server_imports()
    from bascule import dataclass_code, deferred_imports

    if tls:
        deferred_imports.load_ssl()
    import bascule.server  # noqa: F401

    for placeholder in _stand_ins or []:
        deferred_imports.withdraw(placeholder)
    _stand_ins = None
    dataclass_code.finish(write=write_code)
