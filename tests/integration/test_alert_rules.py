"""The alerting rules of compose/alerts.yml: valid and passing their unit tests (compose/alerts.test.yml) by
promtool, each alert tested firing and not, every series they use exported by a real node, and a real
Prometheus evaluating them on a healthy node's series without an alert."""

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import running_node
from test_metrics import METRICS_ON, get

from bascule.client import Client
from bascule.testing.ports import free_port

pytestmark = pytest.mark.anyio

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
RULES, RULE_TESTS, PROMETHEUS_CONFIG = COMPOSE / "alerts.yml", COMPOSE / "alerts.test.yml", COMPOSE / "prometheus.yml"
# Series a node exports; `up` is Prometheus' own, one per scrape target.
NODE_SERIES = re.compile(r"\b(?:bascule|process)_[a-z_]+\b")
HISTOGRAM_SAMPLES = ("_bucket", "_count", "_sum")


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def installed(program: str) -> str:
    """The path of one of Debian's prometheus package's programs, or the test skipped saying how to get it."""
    binary = shutil.which(program)
    if binary is None:
        pytest.skip(f"no {program}: `make promtool` installs Debian's prometheus package (as root, with apt-get)")
    return binary


def promtool(*args: str) -> None:
    """Run promtool, failing the test with what it printed unless it succeeds."""
    binary = installed("promtool")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"


def test_the_rules_and_the_prometheus_config_that_loads_them_are_valid():
    promtool("check", "rules", str(RULES))
    promtool("check", "config", str(PROMETHEUS_CONFIG))


def test_the_rules_pass_their_unit_tests():
    promtool("test", "rules", str(RULE_TESTS))


def test_every_alert_is_tested_firing_and_not_firing():
    checks = [check for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for check in test["alert_rule_test"]]
    for rule in rules():
        outcomes = [bool(check["exp_alerts"]) for check in checks if check["alertname"] == rule["alert"]]
        assert True in outcomes, f"{rule['alert']} is never tested firing"
        assert False in outcomes, f"{rule['alert']} is never tested staying quiet"


async def test_every_series_the_rules_use_is_exported_by_a_node(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON):
        status, _, body = await get(servers[0].port, "/metrics")
    assert status == 200
    # Every family is announced by a TYPE line, traffic or not (counters with their _total).
    families = dict(line.split()[2:4] for line in body.decode().splitlines() if line.startswith("# TYPE "))
    exported = set(families) | {
        name + suffix for name, kind in families.items() if kind == "histogram" for suffix in HISTOGRAM_SAMPLES
    }
    used = {name for rule in rules() for name in NODE_SERIES.findall(rule["expr"])}
    assert used, "no node series found in the rules"
    assert used <= exported, f"the rules use series no node exports: {sorted(used - exported)}"


def prometheus_api(port: int, path: str, **query: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]


async def until_prometheus(port: int, path: str, check, timeout: float = 30.0, **query: str) -> dict:
    """Prometheus' answer at ``path`` once ``check`` accepts it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = await asyncio.to_thread(prometheus_api, port, path, **query)
            if check(data):
                return data
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, f"Prometheus' {path} {query} never as expected"
        await asyncio.sleep(0.25)


async def test_a_real_prometheus_evaluates_every_rule_and_a_healthy_node_raises_no_alert(tmp_path):
    binary = installed("prometheus")
    servers = []
    (tmp_path / "node").mkdir()
    async with running_node(tmp_path / "node", metrics_servers=servers, **METRICS_ON) as (node, address):
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "bascule", "static_configs": [{"targets": [f"127.0.0.1:{servers[0].port}"]}]},
            ],
        }))
        port = free_port()
        prometheus = await asyncio.create_subprocess_exec(
            binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with Client(address) as client:
                await client.create_stream("orders", "orders.in")
                await client.publish("orders", b"m", ack_policy="all")

                async def reverse_reads(calls: int) -> None:
                    for _ in range(calls):
                        assert [m.value async for m in client.subscribe("orders", start="latest", reverse=True)] == [
                            b"m",
                        ]
                    # Scraped since: Prometheus' rate needs the counter seen before and after it moved.
                    await until_prometheus(port, "query", lambda data: data["result"], query=(
                        f'bascule_grpc_requests_total{{code="UNKNOWN"}} >= {calls}'
                    ))

                await reverse_reads(1)
                await reverse_reads(2)
            # Every reverse read ended UNKNOWN "EOF": an alert on the code alone would fire.
            await until_prometheus(port, "query", lambda data: data["result"], query=(
                'rate(bascule_grpc_requests_total{code="UNKNOWN"}[5m]) > 0'
            ))
            evaluated_after = time.time() + 2

            def evaluated(data: dict) -> bool:
                [group] = data["groups"]
                return group["lastEvaluation"] > time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(evaluated_after))

            [group] = (await until_prometheus(port, "rules", evaluated))["groups"]
            assert len(group["rules"]) == len(rules())
            assert {rule["name"]: rule["health"] for rule in group["rules"]} == {
                rule["alert"]: "ok" for rule in rules()
            }
            alerts = (await asyncio.to_thread(prometheus_api, port, "alerts"))["alerts"]
            assert alerts == [], "a healthy node raised alerts, pending or firing"
        finally:
            prometheus.terminate()
            await prometheus.wait()
