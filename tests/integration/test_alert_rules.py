"""The alerting rules of compose/alerts.yml: valid and passing their unit tests (compose/alerts.test.yml) by
promtool, each alert tested firing and not, and every series they use exported by a real node."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import running_node
from test_metrics import METRICS_ON, get

pytestmark = pytest.mark.anyio

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
RULES, RULE_TESTS, PROMETHEUS_CONFIG = COMPOSE / "alerts.yml", COMPOSE / "alerts.test.yml", COMPOSE / "prometheus.yml"
# Series a node exports; `up` is Prometheus' own, one per scrape target.
NODE_SERIES = re.compile(r"\b(?:bascule|process)_[a-z_]+\b")
HISTOGRAM_SAMPLES = ("_bucket", "_count", "_sum")


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def promtool(*args: str) -> None:
    """Run promtool, failing the test with what it printed unless it succeeds."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("no promtool: `make promtool` installs Debian's prometheus package (as root, with apt-get)")
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
