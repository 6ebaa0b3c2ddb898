"""Each example of docs/client.md runs as written against a real node (cursors on), so the
documentation stays true."""

import re
from pathlib import Path

import pytest
from conftest import running_node

from bascule.client import Client

pytestmark = pytest.mark.anyio

DOC = Path(__file__).parents[2] / "docs" / "client.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_document_has_examples():
    assert len(EXAMPLES) >= 4


async def test_every_example_runs(tmp_path):
    settings = {"groups.consumer.timeout": "2s"}
    async with running_node(tmp_path, **settings) as (node, address):
        await Client(address).wait_ready()
        for number, source in enumerate(EXAMPLES):
            namespace: dict = {}
            exec(compile(source, f"docs/client.md example {number + 1}", "exec"), namespace)
            await namespace["main"]([address])
