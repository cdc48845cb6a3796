"""The Prometheus alerting rules in ops/prometheus: valid, unit-tested with promtool, and
every alert covered by a firing and a non-firing case in alerts_test.yml."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS = Path(__file__).resolve().parents[1] / "ops" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERT_TESTS = PROMETHEUS / "alerts_test.yml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not found (apt-get install prometheus, or a Prometheus release)",
)


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_alert_rules_are_valid():
    result = _promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alert_rule_unit_tests_pass():
    result = _promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def _alerts() -> list[str]:
    """The alert names in alerts.yml (``- alert: Name`` lines; PyYAML is no dependency)."""
    text = ALERTS.read_text()
    return re.findall(r"^\s*-\s+alert:\s*[\"']?([A-Za-z0-9_]+)", text, re.MULTILINE)


def _cases() -> dict[str, set[bool]]:
    """For each alert name tested in alerts_test.yml, whether its cases expect it to fire
    (True: a non-empty ``exp_alerts``) and not to fire (False: ``exp_alerts: []``)."""
    cases: dict[str, set[bool]] = {}
    name = None
    for line in ALERT_TESTS.read_text().splitlines():
        if m := re.match(r"^\s*alertname:\s*[\"']?([A-Za-z0-9_]+)", line):
            name = m.group(1)
        elif (m := re.match(r"^\s*exp_alerts:\s*(.*?)\s*$", line)) and name is not None:
            cases.setdefault(name, set()).add(m.group(1) != "[]")
            name = None
    return cases


def test_every_alert_is_tested_firing_and_not_firing():
    alerts = _alerts()
    assert len(alerts) >= 14 and len(set(alerts)) == len(alerts)
    cases = _cases()
    assert set(cases) <= set(alerts), "tests for alerts that do not exist"
    untested = [a for a in alerts if a not in cases]
    assert not untested, f"alerts without a test in {ALERT_TESTS.name}: {untested}"
    one_sided = [a for a in alerts if cases[a] != {True, False}]
    assert not one_sided, f"alerts not tested both firing and not firing: {one_sided}"
