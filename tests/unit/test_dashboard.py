"""The Grafana dashboard parses, shows what the issue asks for, and queries only metrics that exist:
the operator's (kvtier.telemetry.metrics.OperatorMetrics), the probe's, and the engines' (vLLM 0.33.0,
LMCache 0.5.6, as listed in the shared engine-metrics reference)."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvtier.probe.options import ProbeOptions
from kvtier.telemetry.metrics import OperatorMetrics
from tests.conftest import REPO_ROOT

DASHBOARD = REPO_ROOT / "charts" / "kvtier-operator" / "dashboards" / "kvtier.json"
#: A copy of the shared reference (read from the released wheels), so a clean clone has it too.
ENGINE_METRICS = REPO_ROOT / "tests" / "data" / "engine-metrics.md"
SHARED_REFERENCE = next(
    (
        parent / "shared" / "reference" / "engine-metrics.md"
        for parent in REPO_ROOT.parents
        if (parent / "shared" / "reference" / "engine-metrics.md").exists()
    ),
    None,
)

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
}


def operator_names() -> set[str]:
    """Every series name the operator's registry can expose, from its collectors' types."""
    names = set()
    for family in OperatorMetrics().registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def probe_names(tmp_path) -> set[str]:
    """The probe's series, from its own exposition (with --chunk-bytes, so the byte histogram is there)."""
    probe = ProbeOptions(log_dir=str(tmp_path), chunk_bytes=1 << 20).build()
    text = generate_latest(probe.registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def engine_names() -> set[str]:
    names = set()
    for name, kind in re.findall(r"^\| `([a-z_:]+)` \| (counter|gauge|histogram) \|", ENGINE_METRICS.read_text(), re.M):
        names |= {name} if kind != "histogram" else {name + suffix for suffix in SUFFIXES["histogram"]}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana label_values() query) selects."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # strings
    expr = re.sub(r"\{[^{}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    expr = re.sub(r"label_values\(([^,()]+),[^)]*\)", r"\1", expr)  # Grafana: label_values(metric, label)
    expr = re.sub(r"\$\w+", "", expr)  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", expr):  # not a number's unit (5m)
        word, rest = match.group(), expr[match.end() :].lstrip()
        if word in KEYWORDS or rest.startswith("("):  # functions and aggregations
            continue
        names.add(word)
    return names


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append((f"${variable['name']}", variable["query"]["query"]))
    return queries


def test_the_parser_finds_names_and_skips_everything_else():
    expr = (
        "histogram_quantile(0.99, sum by (le, kind) (rate(kvtier_reconcile_duration_seconds_bucket"
        '{kind=~"$kind", x="a{b}"}[$__rate_interval]))) / ignoring(le) group_left '
        "sum(vllm:kv_cache_usage_perc offset 5m) and on(pool) kvtier_pool_capacity_bytes > bool 0"
    )
    assert metric_names(expr) == {
        "kvtier_reconcile_duration_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "kvtier_pool_capacity_bytes",
    }
    assert metric_names('label_values(kvtier_deployment_hit_ratio{namespace=~"$namespace"}, deployment)') == {
        "kvtier_deployment_hit_ratio"
    }


def test_the_exported_names_are_what_prometheus_sees(tmp_path):
    operator = operator_names()
    assert {
        "kvtier_rebalance_moves_total",
        "kvtier_reconcile_duration_seconds_bucket",
        "kvtier_deployment_hit_ratio",
    } <= operator
    assert "kvtier_rebalance_moves" not in operator  # a counter is only ever seen with _total
    assert {"kvtier_probe_stack_distance_bytes_bucket", "kvtier_probe_lookups_total"} <= probe_names(tmp_path)
    engines = engine_names()
    assert {
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "lmcache:num_hit_tokens_total",
    } <= engines
    assert len(engines) > 100


def test_the_engine_metrics_copy_is_the_shared_reference():
    if SHARED_REFERENCE is None:
        pytest.skip("the shared reference is not beside this checkout")
    assert ENGINE_METRICS.read_text() == SHARED_REFERENCE.read_text()


def test_every_queried_metric_is_exported(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    exported = operator_names() | probe_names(tmp_path) | engine_names()
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 20
    unknown = [(where, name) for where, expr in queries for name in sorted(metric_names(expr)) if name not in exported]
    assert not unknown, "\n".join(
        f"{where}: {name} is exported by neither the operator nor the engines" for where, name in unknown
    )
    for where, expr in queries:
        assert metric_names(expr), f"{where}: no metric in {expr!r}"


@pytest.mark.parametrize(
    "needed, metric",
    [
        ("per deployment: the watermark", "kvtier_deployment_hbm_watermark_ratio"),
        ("per deployment: hit ratio by tier", "kvtier_deployment_hit_ratio"),
        ("per deployment: quota over time", "kvtier_deployment_storage_quota_bytes"),
        ("per pool: capacity", "kvtier_pool_capacity_bytes"),
        ("per pool: allocated", "kvtier_pool_allocated_bytes"),
        ("rebalance moves", "kvtier_rebalance_moves_total"),
    ],
)
def test_the_dashboard_shows_what_users_need(needed, metric):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [title for title, expr in dashboard_queries(dashboard) if metric in metric_names(expr)]
    assert panels, f"no panel shows {needed} ({metric})"


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "kvtier"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used - variables)
