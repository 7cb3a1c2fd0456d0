"""Prometheus and Grafana (issue 6): promtool accepts ``ops/prometheus`` (config, rules, the rules' unit
tests) and a live ``/metrics``; every metric that an alert or a dashboard panel names is served by a
real gatewayd, and every served metric is documented in docs/METRICS.md."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.procs import Daemon, Worker

from .helpers import OPS, REPO, require_tool

PROMETHEUS = OPS / "prometheus"
DASHBOARD = OPS / "grafana" / "scheduler-gateway.json"
PROMTOOL_HINT = "Debian's prometheus package carries it: apt-get install prometheus (make test does, as root)"

#: Metrics an alert names before the code serves them, each with the reason. Keep it empty when you can.
PENDING: dict[str, str] = {}

#: Series Prometheus adds to every scrape itself.
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    tool = require_tool("promtool", PROMTOOL_HINT)
    return subprocess.run([tool, *args], input=stdin, capture_output=True, text=True, cwd=PROMETHEUS, timeout=120)


# --------------------------------------------------------------------------- a live daemon


def _post(base: str, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def _get(base: str, token: str, path: str) -> dict[str, Any]:
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


@pytest.fixture(scope="module")
def live_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The /metrics text of a real gatewayd that has run a few tasks (so histograms and labels have data)."""
    work = tmp_path_factory.mktemp("metrics")
    daemon = Daemon(data_dir=work / "var")
    daemon.start()
    worker = Worker(daemon.data_dir, "metrics-node", kinds="echo,fail")
    try:
        worker.start()
        ids = [_post(daemon.base, daemon.token, "/api/tasks", {"kind": "echo", "payload": i})["id"] for i in range(3)]
        failing = {"kind": "fail", "payload": {"message": "no", "retryable": False}}
        ids.append(_post(daemon.base, daemon.token, "/api/tasks", failing)["id"])
        deadline = time.monotonic() + 30
        while any(
            _get(daemon.base, daemon.token, f"/api/tasks/{i}")["state"] not in {"succeeded", "failed"} for i in ids
        ):
            assert time.monotonic() < deadline, "the tasks did not finish"
            time.sleep(0.1)
        with urllib.request.urlopen(daemon.base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        yield text
    finally:
        worker.stop()
        daemon.stop()
        daemon.kill_orphan_nats()


def families(metrics_text: str) -> dict[str, str]:
    """Metric family name -> type, from the ``# TYPE`` lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", metrics_text, re.MULTILINE))


def series_names(metrics_text: str) -> set[str]:
    """Every name a query may use: families, and for histograms their _bucket, _sum and _count."""
    names = set(SCRAPE_SERIES)
    for name, kind in families(metrics_text).items():
        names.add(name)
        if kind in ("histogram", "summary"):
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label values, ranges, label lists and functions left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings, label values among them
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges and subqueries, Grafana's $__rate_interval among them
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        if match.group(2) is None and match.group(1) not in _KEYWORDS:
            names.add(match.group(1))
    return names


def test_metric_names_finds_exactly_the_metrics() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, kind) "
        '(rate(gw_a_seconds_bucket{job="x", kind=~"a|b"}[$__rate_interval])))'
        " > 1e3 and on (instance) gw_b offset 30m unless topk(10, gw_c) or vector(1) > bool 2"
    )
    assert metric_names(expr) == {"gw_a_seconds_bucket", "gw_b", "gw_c"}


# --------------------------------------------------------------------------- promtool


def test_promtool_checks_the_config_and_its_rules() -> None:
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "rule files found" in done.stdout


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_issue_alerts_exist() -> None:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {
        "GatewaydDown",
        "GatewaydNatsDisconnected",
        "GatewaydOutboxBacklogGrowing",
        "GatewaydDeadLettersGrowing",
        "GatewaydLeaseExpiriesSpiking",
        "GatewaydScheduleFiringLate",
        "GatewaydScheduleBudgetSaturated",
    } <= alerts


def test_promtool_accepts_a_live_metrics_page(live_metrics: str) -> None:
    assert "gw_task_transitions_total{" in live_metrics  # the tasks ran: labelled series are there
    done = promtool("check", "metrics", stdin=live_metrics)
    # promtool prints one line per lint problem (naming, units, types) and exits non-zero on any
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_every_alert_names_served_metrics(live_metrics: str) -> None:
    served = series_names(live_metrics)
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in metric_names(rule["expr"]):
                assert name in served or name in PENDING, (
                    f"alert {rule['alert']} names {name}, which gatewayd does not serve"
                )


# --------------------------------------------------------------------------- Grafana


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            # label_values(<series selector>, <label>): the selector is the PromQL
            selector = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            out.append((f"variable {var['name']!r}", selector.group(1) if selector else query))
    return out


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    datasource = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert datasource["query"] == "prometheus"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_dashboard_query_names_served_metrics(live_metrics: str) -> None:
    served = series_names(live_metrics)
    queries = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) > 20
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        missing = names - served
        assert not missing, f"{where} names {sorted(missing)}, which gatewayd does not serve"


def test_every_served_metric_is_documented(live_metrics: str) -> None:
    documented = set(re.findall(r"^\| `(gw_[a-z0-9_]+)`", (REPO / "docs" / "METRICS.md").read_text(), re.MULTILINE))
    served = {name for name in families(live_metrics) if name.startswith("gw_") and not name.endswith("_created")}
    assert served - documented == set(), "served but not in docs/METRICS.md"
    assert documented - served == set(), "in docs/METRICS.md but not served"


def test_the_dashboard_file_ends_with_a_newline() -> None:
    assert Path(DASHBOARD).read_text().endswith("}\n")
