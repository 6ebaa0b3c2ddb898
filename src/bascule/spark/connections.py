"""bascule clients for the Spark source and sink, and the event loops they run on.

Nothing here is kept between calls: each opens its own `Client` on a fresh event loop (Spark's
Python workers have none of their own) and closes it before it returns, so that no connection ever
sits in an object Spark pickles.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from bascule.client import BasculeError, Client, ClientTls
from bascule.spark.errors import BasculeSparkError
from bascule.spark.options import TlsFiles
from bascule.spark.retry import READ_RETRY, retried

T = TypeVar("T")


def run(coroutine_function: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on a fresh event loop.

    `asyncio.Runner` closes the loop as `asyncio.run` does: remaining tasks (gRPC's own among them)
    are cancelled and finished first, so no gRPC completion arrives for a closed loop."""
    with asyncio.Runner() as runner:
        return runner.run(coroutine_function())


def iterate(generator_function: Callable[[], AsyncGenerator[T, None]]) -> Iterator[T]:
    """An async generator as a plain generator, driven on its own fresh event loop; closing the
    plain generator early closes the async one (and with it its connections)."""
    with asyncio.Runner() as runner:
        agen = generator_function()
        try:
            while True:
                try:
                    item = runner.run(_next(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            runner.run(agen.aclose())


async def _next(agen: AsyncGenerator[T, None]) -> T:
    return await agen.__anext__()


async def connect(brokers: tuple[str, ...], timeout: float, tls: TlsFiles | None = None) -> Client:
    """A client on the first broker that answers a metadata request."""
    failures = []
    client_tls = None if tls is None else ClientTls.from_files(tls.ca, tls.cert, tls.key)
    for address in brokers:
        client = Client(address, timeout=timeout, tls=client_tls)
        try:
            await client.fetch_metadata()
            return client
        except BasculeError as exc:
            failures.append(f"{address}: {exc}")
            await client.close()
    raise BasculeSparkError(f"no broker answered ({'; '.join(failures)})")


def run_with_client(
    brokers: tuple[str, ...], timeout: float, call: Callable[[Client], Awaitable[T]], what: str,
    tls: TlsFiles | None = None,
) -> T:
    """`call(client)` on a fresh event loop, tried again (`READ_RETRY`) on a fresh client after
    errors a leader change explains; `what` names it in the log and in the error."""

    async def attempt() -> T:
        client = await connect(brokers, timeout, tls)
        try:
            return await call(client)
        finally:
            await client.close()

    async def attempts() -> T:
        try:
            return await retried(READ_RETRY, attempt, what)
        except BasculeError as exc:
            raise BasculeSparkError(f"{what} failed: {exc}") from exc

    return run(attempts)
