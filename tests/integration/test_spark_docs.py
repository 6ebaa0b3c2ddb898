"""The README's Spark snippet and docs/spark.md's examples run as written against a real node, so that
one that stops working, or stops printing what the text says it prints, fails here.

They run in the order a newcomer meets them: the README's "Trying it" block (which makes `orders`),
then each page's shell blocks through bash (the CLI pointed at the test's node by $BASCULE_ADDRESS),
its Python fragments in one namespace with the test session's SparkSession, and the complete program
(docs/spark.md's pipeline) as a script of its own. Only the node's addresses and /tmp paths change.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from test_spark import JVM_OPTIONS, run, spark  # noqa: E402, F401  (the session-scoped SparkSession fixture)

from bascule.client import Client  # noqa: E402
from bascule.testing.local import LocalCluster  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark 4 needs Java 17: no `java` on PATH"),
]

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
SPARK_DOC = (ROOT / "docs" / "spark.md").read_text()


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def output_after(text: str, words: str) -> str:
    """The first untagged or `text` block after `words`: what the text says is printed."""
    return re.findall(r"```(?:text)?\n(.*?)```", text[text.index(words) :], re.S)[0]


@dataclass(frozen=True)
class Node:
    """Where the examples run instead of `make run`'s node and /tmp."""

    broker: str
    nats_url: str
    tmp: Path


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with LocalCluster(1, embedded_nats=True) as cluster:
        assert cluster.nats_url is not None
        here = Node(cluster.brokers[0], cluster.nats_url, tmp_path_factory.mktemp("docs"))
        shell(blocks(section(README, "## Trying it"), "sh")[0], here)
        yield here


def local(source: str, node: Node) -> str:
    return (
        source.replace("127.0.0.1:9292", node.broker).replace("nats://127.0.0.1:4222", node.nats_url)
        .replace("/tmp/", f"{node.tmp}/")
    )


def shell(block: str, node: Node) -> str:
    done = subprocess.run(
        ["bash", "-e", "-c", local(block, node)], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "BASCULE_ADDRESS": node.broker},
    )
    assert done.returncode == 0, f"{block}\nfailed ({done.returncode}): {done.stderr}"
    return done.stdout


def python(fragment: str, namespace: dict, node: Node, name: str) -> str:
    """Runs `fragment` in `namespace`; what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(local(fragment, node), name, "exec"), namespace)
    return printed.getvalue()


def test_the_readme_spark_snippet_prints_what_the_readme_says(spark, node):  # noqa: F811
    text = section(README, "## Spark")
    for block in blocks(text, "sh"):
        shell(block, node)
    (snippet,) = blocks(text, "python")
    printed = python(snippet, {}, node, "README.md's Spark snippet")
    assert printed.rstrip() == output_after(text, "It prints").rstrip()  # show() ends with a blank line


def test_the_spark_pages_examples_run_in_order_and_print_what_it_says(spark, node):  # noqa: F811
    shell(blocks(SPARK_DOC, "sh")[0], node)  # the streams the examples use
    fragments = [b for b in blocks(SPARK_DOC, "python") if not b.startswith('"""')]
    namespace: dict = {}
    printed = "".join(
        python(fragment, namespace, node, f"docs/spark.md fragment {number + 1}")
        for number, fragment in enumerate(fragments)
    )
    lag = "{'minOffsetsBehindLatest': '0', 'maxOffsetsBehindLatest': '0', 'avgOffsetsBehindLatest': '0.0'}"
    assert printed == f"{{}} {lag}\n"
    said = " ".join(section(SPARK_DOC, "## Streaming").split())
    assert f"It prints `{{}}` (see below) and `{lag}`" in said

    async def partitions_written() -> list[int]:
        async with Client(node.broker) as client:
            return [
                m.partition for p in range(3)
                async for m in client.subscribe("orders-out", p, start="earliest", stop_latest=True)
            ]

    assert sorted(run(partitions_written())) == [0, 1, 2]  # "one each"


def test_the_pipeline_example_prints_its_documented_output(node):
    text = section(SPARK_DOC, "## Example: a pipeline from one stream to another")
    (program,) = blocks(text, "python")
    script = node.tmp / "big_orders.py"
    script.write_text(program)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=node.tmp, capture_output=True, text=True, timeout=240,
        env={
            **os.environ, "BASCULE_BROKERS": node.broker, "NATS_URL": node.nats_url,
            "CHECKPOINT": str(node.tmp / "big-orders-checkpoint"), "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1", "JDK_JAVA_OPTIONS": JVM_OPTIONS,  # the JDK notes it on stderr
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip() == output_after(text, "Its output").rstrip()
