"""The shipped alert rules (deploy/prometheus/cgwatch-rules.yml): valid, and their unit tests
(cgwatch-rules.test.yml) pass under `promtool test rules`. promtool comes with Debian's
`prometheus` package, which scripts/test unpacks into a cache (tests/tools); only a machine
without it and without CGWATCH_REQUIRE_REAL=1 (a developer's laptop) skips."""

from __future__ import annotations

import os
import subprocess

from tests.cgroup_helpers import PROJECT
from tests.extras import debian_program

DEPLOY = os.path.join(PROJECT, "deploy", "prometheus")
RULES = os.path.join(DEPLOY, "cgwatch-rules.yml")
RULE_TESTS = os.path.join(DEPLOY, "cgwatch-rules.test.yml")
ALERTS = ("CgwatchOOMKill", "CgwatchHeadroomLow", "CgwatchMemoryHighThrottling",
          "CgwatchMemoryPressureFull")


def promtool() -> str:
    return debian_program("promtool", "prometheus")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=DEPLOY, capture_output=True, text=True,
                          timeout=60)


def test_rules_are_valid() -> None:
    done = run("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_rule_unit_tests_pass() -> None:
    done = run("test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test() -> None:
    with open(RULES) as f:
        rules = f.read()
    with open(RULE_TESTS) as f:
        tests = f.read()
    for alert in ALERTS:
        assert f"alert: {alert}\n" in rules
        assert f"alertname: {alert}\n" in tests, f"{alert} has no promtool test"
