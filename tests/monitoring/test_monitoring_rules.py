"""The Grafana dashboard and the Prometheus alert rules under monitoring/, checked without a daemon.

promtool (Debian's prometheus package) checks and unit-tests the alert rules, and parses every
dashboard query: it has no PromQL checker of its own, so the queries go into a throw-away rules
file as recording rules, which `promtool check rules` parses and type-checks.  Every series a
query or a rule names must be one the supervisor serves; the list comes from kdaemon's metric
definitions themselves (imported in a child interpreter), not from a copy kept here.

There is no YAML library in the venv, so alerts.yml and alerts_test.yml are read with a small line
reader for the plain YAML they are written in (promtool checks the files themselves); the
temporary rules file is JSON, which is YAML too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana" / "kdaemon.json"
ALERTS = ROOT / "monitoring" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "monitoring" / "prometheus" / "alerts_test.yml"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: install Debian's prometheus package (bash .ci/system-deps does)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


# The series Prometheus adds to every target: the only names a query may use that kdaemon (the
# supervisor's /metrics and kdaemon lag-exporter's) does not serve.
PROMETHEUS_SERIES = {"up": "gauge"}

# What Grafana puts in place of its built-in variables; a template variable becomes its "All" value.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}

# The series names each metric type puts on /metrics.  Counters and histograms carry no _created
# series here, summaries no quantiles: the supervisor renders the multiprocess files, which have none.
SERIES_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
                   "summary": ("_sum", "_count")}

# Run in a child interpreter: importing the metric modules registers their metrics in
# prometheus_client's global registry, and the multiprocess mode is chosen from the environment
# at prometheus_client's first import; neither must leak into the test process.
_LIST_METRICS = textwrap.dedent("""
    import json, sys
    from prometheus_client.metrics import MetricWrapperBase
    import kdaemon.supervisor.metrics as supervisor
    import kdaemon.worker.metrics

    # What supervisor.metrics.render() serves: every metric any kdaemon process writes to the
    # multiprocess directory (defined at module level, wherever it is), and WORKER_RESOURCES.
    families = [family for name, module in sorted(sys.modules.items()) if name.startswith("kdaemon")
                for value in vars(module).values() if isinstance(value, MetricWrapperBase)
                for family in value.describe()]
    families += supervisor.WORKER_RESOURCES.collect()
    # kdaemon lag-exporter's page, the other scrape job (its families, without samples).
    from kdaemon.cli.lag_exporter import LagExporter
    families += LagExporter({"group_id": "g"}, [], interval_s=1, timeout_ms=1).describe()
    json.dump({family.name: family.type for family in families}, sys.stdout)
""")


@cache
def exported_series() -> dict[str, str]:
    """{series name on /metrics: its metric's type}, from kdaemon's own metric definitions."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = subprocess.run([sys.executable, "-c", _LIST_METRICS], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)
    assert proc.returncode == 0, f"listing kdaemon's metrics failed:\n{proc.stderr}"
    families = json.loads(proc.stdout)
    series = {name + suffix: kind for name, kind in families.items() for suffix in SERIES_SUFFIXES[kind]}
    return {**series, **PROMETHEUS_SERIES}


# -- PromQL, as far as these checks need it --------------------------------------------------------

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "inf", "nan"}
# The functions that take a counter's (or a histogram series') range and handle its resets.
_COUNTER_FUNCTIONS = r"(?:rate|irate|increase|resets)"


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: what is left once strings, label matchers,
    ranges, offsets, grouping clauses, function names, keywords and numbers are taken out."""
    rest = _STRINGS.sub('""', expr)
    for pattern in (_MATCHERS, _RANGES, _OFFSET, _GROUPING):
        rest = pattern.sub(" ", rest)
    return {name for name in _NAME.findall(rest) if name.lower() not in _KEYWORDS}


def misused_series(expr: str, series: dict[str, str]) -> list[str]:
    """Counters and histogram series not taken through rate()/increase() (their raw values mean
    nothing across restarts), histogram buckets outside histogram_quantile(), and gauges put
    through a counter function."""
    text = _STRINGS.sub('""', expr)
    problems = []
    for name in metric_names(expr):
        kind = series.get(name)
        uses = len(re.findall(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text))
        in_counter_fn = len(re.findall(
            rf"\b{_COUNTER_FUNCTIONS}\(\s*{re.escape(name)}\s*(?:\{{[^{{}}]*\}})?\s*\[", text))
        if kind in ("counter", "histogram") and in_counter_fn != uses:
            problems.append(f"{name} ({kind}) used without rate()/increase()")
        if name.endswith("_bucket") and kind == "histogram" and "histogram_quantile(" not in text:
            problems.append(f"{name} used outside histogram_quantile()")
        if kind == "gauge" and in_counter_fn:
            problems.append(f"{name} (gauge) put through rate()/increase()")
    return problems


def test_the_promql_reader_finds_names_and_only_names():
    """A reader that found nothing would let every name check below pass for nothing."""
    expr = ('sum by (topic, le) (rate(kdaemon_a_total{topic=~"x|y", job="up"}[5m] offset 1m))\n'
            '/ on (topic) group_left() kdaemon_b or vector(0) > bool 1e3\n'
            'and histogram_quantile(0.99, sum by (le) (rate(c_bucket[$__rate_interval])))')
    assert metric_names(expr) == {"kdaemon_a_total", "kdaemon_b", "c_bucket"}
    kinds = {"kdaemon_a_total": "counter", "kdaemon_b": "gauge", "c_bucket": "histogram"}
    assert misused_series(expr, kinds) == []
    assert misused_series("kdaemon_a_total > 0", kinds) == ["kdaemon_a_total (counter) used without rate()/increase()"]
    assert misused_series("rate(kdaemon_b[5m])", kinds) == ["kdaemon_b (gauge) put through rate()/increase()"]


def test_kdaemon_metrics_are_listed_from_the_code():
    """The list the name checks compare with is complete enough to mean something: it has the
    worker's, the supervisor's and the scrape-time resource metrics, with their types."""
    series = exported_series()
    assert series["kdaemon_records_lag"] == "gauge"                       # worker/metrics.py
    assert series["kdaemon_worker_restarts_total"] == "counter"           # supervisor/metrics.py
    assert series["kdaemon_worker_rss_bytes"] == "gauge"                  # WorkerResources, at scrape time
    assert series["kdaemon_commit_latency_seconds_bucket"] == "histogram"
    assert series["kdaemon_commit_errors_total"] == "counter"             # worker/metrics.py
    assert series["kdaemon_start_time_seconds"] == "gauge"                # supervisor/metrics.py
    assert series["kdaemon_group_lag"] == "gauge"                         # cli/lag_exporter.py
    assert series["kdaemon_lag_exporter_errors_total"] == "counter"
    assert not any(name.startswith(("process_", "python_")) for name in series), \
        "the supervisor's page has no process or platform collector: render() builds its own registry"


# -- the dashboard ---------------------------------------------------------------------------------

def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included; rows themselves are not panels."""
    found = []
    for panel in board["panels"]:
        found.extend([panel] if panel.get("type") != "row" else panel.get("panels", []))
    return found


def substitute_variables(expr: str, board: dict, builtins: dict[str, str] = GRAFANA_BUILTINS) -> str:
    """The query as Grafana sends it with every template variable at "All" and the built-in
    intervals at ``builtins`` (typical values by default); an unknown variable is an error (it
    would reach Prometheus as literal text)."""
    variables = {v["name"]: v.get("allValue") or ".*" for v in board["templating"]["list"] if v["type"] != "datasource"}

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in builtins:
            return builtins[name]
        assert name in variables, f"{expr!r} uses ${name}, which the dashboard does not define"
        return variables[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", value, expr)


def dashboard_queries(board: dict | None = None, builtins: dict[str, str] = GRAFANA_BUILTINS) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable, variables substituted."""
    board = board or dashboard()
    queries = []
    for panel in panels(board):
        for target in panel["targets"]:
            queries.append((f"panel {panel['id']} {panel['title']!r} target {target['refId']}",
                            substitute_variables(target["expr"], board, builtins)))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            selector = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert selector, f"variable {variable['name']}: expected label_values(selector, label), got {query!r}"
            queries.append((f"variable {variable['name']}", substitute_variables(selector.group(1), board, builtins)))
    return queries


def test_the_dashboard_has_its_variables_and_every_panel_uses_the_chosen_data_source():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["job"]["type"] == "query" and variables["instance"]["type"] == "query"
    assert board["schemaVersion"] >= 39, "a dashboard of a current Grafana (10.4 or later)"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    uses_ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    for panel in panels(board):
        assert panel["datasource"] == uses_ds, f"panel {panel['title']!r}: {panel['datasource']}"
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == uses_ds, f"panel {panel['title']!r} target {target['refId']}"
            assert target["expr"].strip(), f"panel {panel['title']!r} target {target['refId']} is empty"


def test_the_dashboard_shows_what_the_issue_asks_for():
    """Throughput, lag per partition, filter ratio, DLQ rate, commit and flush latency,
    rebalances, worker restarts and RSS: each through the series kdaemon keeps for it."""
    wanted = {"throughput": "kdaemon_records_delivered_total", "lag": "kdaemon_records_lag",
              "filter ratio": "kdaemon_records_filtered_total", "DLQ rate": "kdaemon_records_dlq_total",
              "commit latency": "kdaemon_commit_latency_seconds_bucket",
              "flush latency": "kdaemon_sink_flush_seconds_bucket", "rebalances": "kdaemon_rebalances_total",
              "worker restarts": "kdaemon_worker_restarts_total", "RSS": "kdaemon_worker_rss_bytes",
              # and what came with the lag exporter and the metrics added beside it
              "lag from the brokers": "kdaemon_group_lag", "exporter health": "kdaemon_lag_exporter_up",
              "commit errors": "kdaemon_commit_errors_total", "uptime": "kdaemon_start_time_seconds"}
    used = set().union(*(metric_names(expr) for _, expr in dashboard_queries()))
    assert not {item for item, name in wanted.items() if name not in used}
    lag = [t for p in panels(dashboard()) for t in p["targets"] if "kdaemon_records_lag" in metric_names(t["expr"])
           and re.search(r"by \(topic, partition\)", t["expr"])]
    assert lag and "{{partition}}" in lag[0]["legendFormat"], "lag as a time series per topic and partition"


def test_every_dashboard_query_uses_series_kdaemon_serves_and_uses_them_as_their_type():
    series = exported_series()
    problems = []
    for where, expr in dashboard_queries():
        names = metric_names(expr)
        problems += [f"{where}: {name} is not a series kdaemon serves" for name in sorted(names - series.keys())]
        problems += [f"{where}: {p}" for p in misused_series(expr, series)]
        if not names:
            problems.append(f"{where}: selects no series")
    assert not problems, "\n".join(problems)


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path):
    queries = dashboard_queries()
    rules = {"groups": [{"name": "kdaemon_dashboard", "rules": [
        {"record": f"kdaemon_dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]}]}
    path = tmp_path / "dashboard_rules.json"
    path.write_text(json.dumps(rules, indent=2))
    result = promtool("check", "rules", str(path))
    where = "\n".join(f"query_{i}: {w}" for i, (w, _) in enumerate(queries))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n(the rules are numbered as:\n{where})"


# -- the alert rules -------------------------------------------------------------------------------

def _scalar(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return json.loads(value)
    return value


def rules(text: str) -> list[dict[str, str]]:
    """The rules of a rules file as {"alert" or "record": name, key: value, "labels.x": ...,
    "annotations.x": ...}: a reader for the plain YAML alerts.yml is written in (block scalars,
    quoted scalars, one level of nested keys), enough to find each rule's expression and
    annotations."""
    found: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    lines = text.splitlines()
    indent, parent, i = 0, "", 0
    while i < len(lines):
        line = lines[i]
        i += 1
        start = re.match(r"^(\s*)- (alert|record):\s*(.+)$", line)
        if start:
            indent = len(start.group(1)) + 2
            current = {start.group(2): _scalar(start.group(3))}
            found.append(current)
            continue
        key = re.match(r"^(\s*)([\w.]+):\s*(.*)$", line)
        if current is None or not key:
            continue
        depth, name, value = len(key.group(1)), key.group(2), key.group(3).strip()
        if depth < indent:          # past the rule: another group, or the end of the list
            current = None
            continue
        if depth == indent:
            parent = name
        full = name if depth == indent else f"{parent}.{name}"
        if value in ("|", "|-", ">", ">-"):
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > depth):
                block.append(lines[i])
                i += 1
            body = textwrap.dedent("\n".join(block)).strip("\n")
            current[full] = " ".join(body.split()) if value.startswith(">") else body
        elif value:
            current[full] = _scalar(value if value[0] in "'\"" else value.split(" #")[0])
    return found


def alert_rules() -> list[dict[str, str]]:
    found = [rule for rule in rules(ALERTS.read_text()) if "alert" in rule]
    assert found and all("expr" in rule for rule in found), f"alerts.yml read wrongly: {found}"
    return found


def test_the_alerts_the_issue_asks_for_are_there_and_tell_an_operator_what_to_check():
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert {"KdaemonLagGrowing", "KdaemonWorkerCrashLoop", "KdaemonNoCommits", "KdaemonDown",
            "KdaemonLagExporterFailing"} <= alerts.keys()
    for name, rule in alerts.items():
        assert rule.get("annotations.summary"), f"{name} has no summary"
        assert len(rule.get("annotations.description", "")) > 80, f"{name}: say what to check in its description"
        assert rule.get("labels.severity") in ("warning", "critical"), f"{name}: severity warning or critical"


def test_every_alert_uses_series_kdaemon_serves_and_uses_them_as_their_type():
    series = exported_series()
    problems = []
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        unknown = sorted(names - series.keys())
        problems += [f"{rule['alert']}: {name} is not a series kdaemon serves" for name in unknown]
        problems += [f"{rule['alert']}: {p}" for p in misused_series(rule["expr"], series)]
    assert not problems, "\n".join(problems)


def test_the_lag_alert_reads_the_brokers_view_and_the_crash_loop_alert_the_restarts():
    """KdaemonLagGrowing must fire while the daemon is stopped: it reads only the lag exporter's
    kdaemon_group_lag, never a series the workers serve (those vanish with them)."""
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert metric_names(alerts["KdaemonLagGrowing"]["expr"]) == {"kdaemon_group_lag"}
    assert "kdaemon_worker_restarts_total" in metric_names(alerts["KdaemonWorkerCrashLoop"]["expr"])
    assert "kdaemon_lag_exporter_up" in metric_names(alerts["KdaemonLagExporterFailing"]["expr"])


def test_restarts_are_counted_by_a_closed_set_of_reasons():
    """The reason label takes four values, and each worker's series exist at 0 from its start:
    increase() cannot see the first restart of a series that appears at 1."""
    from kdaemon.supervisor import metrics
    assert metrics.restart_reason(1, None) == "exit"
    assert metrics.restart_reason(0, None) == "exit"
    assert metrics.restart_reason(-9, None) == "signal"
    assert metrics.restart_reason(-9, "heartbeat_timeout") == "heartbeat_timeout"
    assert metrics.restart_reason(0, "memory") == "memory"
    with pytest.raises(ValueError, match="unknown restart reason 'oom'"):
        metrics.restart_reason(-9, "oom")
    metrics.worker_started(77)
    samples = {s.labels["reason"]: s.value for family in metrics.WORKER_RESTARTS.collect() for s in family.samples
               if s.name.endswith("_total") and s.labels["worker"] == "77"}
    assert samples == {reason: 0.0 for reason in metrics.RESTART_REASONS}
    metrics.worker_restarted(77, -9, None)
    after = {s.labels["reason"]: s.value for family in metrics.WORKER_RESTARTS.collect() for s in family.samples
             if s.name.endswith("_total") and s.labels["worker"] == "77"}
    assert after == {**samples, "signal": 1.0}


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_keeps_it_silent():
    cases = re.findall(r"alertname:\s*(\w+)\s*\n\s*exp_alerts:[ \t]*(\[\])?", ALERTS_TEST.read_text())
    firing = {name for name, empty in cases if not empty}
    silent = {name for name, empty in cases if empty}
    names = {rule["alert"] for rule in alert_rules()}
    assert names <= firing, f"no case where these fire: {sorted(names - firing)}"
    assert names <= silent, f"no case where these stay silent: {sorted(names - silent)}"


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_alert_rules_pass_their_promtool_unit_tests():
    result = promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
