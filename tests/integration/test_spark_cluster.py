"""bascule.spark on a Spark standalone cluster: a master and two workers started from the installed
pyspark (`bin/spark-class`, as docs/spark.md shows), everything on 127.0.0.1, the executors running
this venv's Python; and a real 3-node bascule cluster.

The Spark driver runs in its own process (this file, run as a script): the test session's local
SparkSession already owns this process's JVM gateway. The test drives it through its stdin and
stdout, kills a partition leader under its streaming query, and checks what it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed (pip install -e '.[spark]')")

from cluster_checks import FAST  # noqa: E402
from test_spark import JVM_OPTIONS  # noqa: E402

from bascule.client import Client  # noqa: E402
from bascule.testing.local import LocalCluster  # noqa: E402
from bascule.testing.ports import free_port  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.cluster,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark 4 needs Java 17: no `java` on PATH"),
    pytest.mark.timeout(300),
]

SPARK_HOME = Path(pyspark.__file__).parent
PARTITIONS = 4
BATCH_PER_PARTITION = 2_500
LIVE_CHUNK = 300  # per partition, three times: before, during and after the leader's death


# ---- the standalone cluster ----------------------------------------------------------------------


def spark_env(work: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_WORKER_DIR": str(work / "workers"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "JDK_JAVA_OPTIONS": JVM_OPTIONS,  # every JVM here: master, workers, driver, executors
    }


def spark_class(name: str, *args: str, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A master or worker in the foreground, in a process group of its own (its executors with it)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), f"org.apache.spark.deploy.{name}", *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )


def alive_workers(web_ui: str) -> int | None:
    """The workers the master lists as alive; None while its web UI does not answer."""
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{web_ui}/json/", timeout=2) as answer:
            return sum(w["state"] == "ALIVE" for w in json.load(answer)["workers"])
    return None


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group we started, SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
            return


class Standalone:
    """A started master and its two workers: ``url``, the master's; ``wait_for_workers``, until both
    registered (the fixture returns once the master answers; the workers' JVMs are still starting, as
    may a driver's and the test's bascule cluster)."""

    def __init__(self, url: str, web_ui: str, processes: list[subprocess.Popen], logs: Path) -> None:
        self.url = url
        self.web_ui = web_ui
        self.processes = processes
        self.logs = logs

    def wait_until(self, ready: Callable[[int | None], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready(alive_workers(self.web_ui)):
            assert all(p.poll() is None for p in self.processes), f"a Spark daemon exited; logs in {self.logs}"
            assert time.monotonic() < deadline, f"{what} in {timeout} s; logs in {self.logs}"
            time.sleep(0.2)

    def wait_for_workers(self) -> None:
        self.wait_until(lambda alive: alive is not None and alive >= 2, "two workers never registered")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[Standalone]:
    """A master and two workers (one core, 1 GiB each), the master answering."""
    work = tmp_path_factory.mktemp("spark-standalone")
    (work / "logs").mkdir()
    env = spark_env(work)
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    processes = [spark_class("master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui),
                             log=work / "logs" / "master.out", env=env)]
    try:
        for i in range(2):
            processes.append(spark_class(
                "worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()), master, log=work / "logs" / f"worker-{i}.out", env=env,
            ))
        cluster = Standalone(master, f"http://127.0.0.1:{ui}", processes, work / "logs")
        # A driver started before the master listens waits 20 s to register again: the master first.
        cluster.wait_until(lambda alive: alive is not None, "the master never answered")
        yield cluster
    finally:
        for process in reversed(processes):
            stop_group(process)


# ---- the driver (this file as a script) ----------------------------------------------------------


def drive(master: str, brokers: str, out: str) -> None:
    """The Spark application: once the test says "read" on stdin (its session starts meanwhile),
    the batch read, then the streaming query until the test says "finish"; what each wrote, read
    back through Spark, in `out`/batch and `out`/stream."""
    from pyspark.sql import SparkSession

    from bascule.spark import BasculeDataSource

    spark = (
        SparkSession.builder.master(master).appName("bascule-cluster-test")
        .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false").config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1").config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BasculeDataSource)
    assert sys.stdin.readline().strip() == "read"
    columns = ("partition", "offset", "value")
    batch = spark.read.format("bascule").option("brokers", brokers).option("stream", "cluster-batch").load()
    batch.select(*columns).write.parquet(f"{out}/batch")
    print("batch written", flush=True)

    live = (
        spark.readStream.format("bascule").option("brokers", brokers).option("stream", "cluster-live")
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "400").load()
    )
    query = (
        live.select(*columns).writeStream.format("parquet").option("path", f"{out}/live")
        .option("checkpointLocation", f"{out}/checkpoint").trigger(processingTime="500 milliseconds").start()
    )
    print("streaming", flush=True)
    assert sys.stdin.readline().strip() == "finish"
    query.processAllAvailable()
    query.stop()
    # Read back through the file sink's log: the files of committed batches only.
    spark.read.parquet(f"{out}/live").write.parquet(f"{out}/stream")
    print("done", flush=True)
    spark.stop()


class Driver:
    """The driver process: lines from its stdout, words to its stdin."""

    def __init__(self, master: str, brokers: list[str], out: Path) -> None:
        self.log = out / "driver.log"
        with open(self.log, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, __file__, master, ",".join(brokers), str(out)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                env=spark_env(out), start_new_session=True,
            )

    def expect(self, line: str) -> None:
        """Until the driver says `line` (other output passed over); its end fails the test."""
        assert self.process.stdout is not None
        for said in self.process.stdout:
            if said.strip() == line:
                return
        raise AssertionError(f"the driver ended before saying {line!r}; its log: {self.log}\n{self.tail()}")

    def say(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            message = f"the driver ended before hearing {line!r}; its log: {self.log}\n{self.tail()}"
            raise AssertionError(message) from None

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        stop_group(self.process)


# ---- the test ------------------------------------------------------------------------------------


async def publish(brokers: list[str], stream: str, first: int, count: int) -> None:
    async with Client(brokers, timeout=20) as client:
        for p in range(PARTITIONS):
            values = [b"%d-%d" % (p, i) for i in range(first, first + count)]
            for begin in range(0, count, 500):
                await client.publish_many(stream, values[begin : begin + 500], partition=p, ack_policy="all")


async def committed(brokers: list[str], stream: str) -> list[tuple[int, int, bytes]]:
    """Every committed message of `stream`: (partition, offset, value)."""
    async with Client(brokers, timeout=20) as client:
        return [
            (p, m.offset, m.value)
            for p in range(PARTITIONS)
            async for m in client.subscribe(stream, p, start="earliest", stop_latest=True)
        ]


def rows(directory: Path) -> list[tuple[int, int, bytes]]:
    table = pq.read_table(directory).to_pydict()
    return list(zip(table["partition"], table["offset"], table["value"]))


def wait_for_files(directory: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (directory.is_dir() and any(directory.glob("part-*"))):
        assert time.monotonic() < deadline, f"the streaming query wrote nothing to {directory} in {timeout} s"
        time.sleep(0.2)


async def leaders(client: Client, names: tuple[str, ...]) -> dict[str, list[str]] | None:
    """Each stream's partition leaders, once every partition of every stream has one."""
    streams = (await client.fetch_metadata(*names)).streams
    found = {name: [streams[name].partitions[p].leader for p in range(PARTITIONS)]
             for name in names if name in streams and len(streams[name].partitions) == PARTITIONS}
    return found if len(found) == len(names) and all(all(ids) for ids in found.values()) else None


def test_a_standalone_cluster_reads_exactly_and_streams_through_a_leaders_death_exactly_once(
    standalone, tmp_path
):
    cluster = LocalCluster(3, config=FAST)  # its addresses are fixed from here
    brokers = cluster.brokers
    # The driver's JVM and session, the workers and the bascule cluster start side by side; the
    # driver reads nothing before the test says "read".
    driver = Driver(standalone.url, brokers, tmp_path)
    try:
        with cluster:

            async def create() -> str:
                names = ("cluster-batch", "cluster-live")
                async with Client(brokers, timeout=20) as client:
                    await client.wait_ready()
                    for name in names:
                        await client.create_stream(name, name, partitions=PARTITIONS, replication_factor=3, min_isr=2)
                    deadline = time.monotonic() + 20  # leaders elected before the first publish
                    while (elected := await leaders(client, names)) is None:
                        assert time.monotonic() < deadline, "the streams' partitions got no leaders in 20 s"
                        await asyncio.sleep(0.05)
                    return elected["cluster-live"][0]

            leader = asyncio.run(create())
            asyncio.run(publish(brokers, "cluster-batch", 0, BATCH_PER_PARTITION))
            asyncio.run(publish(brokers, "cluster-live", 0, LIVE_CHUNK))
            standalone.wait_for_workers()
            driver.say("read")
            driver.expect("batch written")
            expected_batch = asyncio.run(committed(brokers, "cluster-batch"))
            assert len(expected_batch) == PARTITIONS * BATCH_PER_PARTITION
            assert sorted(rows(tmp_path / "batch")) == sorted(expected_batch)

            driver.expect("streaming")
            wait_for_files(tmp_path / "live")
            killed = cluster.server_ids.index(leader)
            cluster.kill(killed)
            asyncio.run(publish(brokers, "cluster-live", LIVE_CHUNK, LIVE_CHUNK))
            cluster.restart(killed)
            asyncio.run(publish(brokers, "cluster-live", 2 * LIVE_CHUNK, LIVE_CHUNK))
            driver.say("finish")
            driver.expect("done")
            driver.stop()
            streamed = rows(tmp_path / "stream")
            twice = [key for key, n in Counter((p, o) for p, o, _ in streamed).items() if n > 1]
            assert not twice, f"read more than once: {twice[:10]}"
            expected = asyncio.run(committed(brokers, "cluster-live"))
            assert sorted(streamed) == sorted(expected)
            published = {b"%d-%d" % (p, i) for p in range(PARTITIONS) for i in range(3 * LIVE_CHUNK)}
            assert {v for _, _, v in expected} == published  # acked with ALL, so none lost to the kill
    finally:
        driver.stop()


if __name__ == "__main__":
    drive(*sys.argv[1:])
