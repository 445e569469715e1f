"""docs/grafana/mtt-dashboard.json: every query names only metrics the server exports
(the Metrics class, on a fresh registry, with each prefix the dashboard offers) and only
labels those metrics have; the key router and latency metrics all have a panel; the JSON
is a well-formed dashboard (unique ids, declared variables, non-overlapping panels)."""

from __future__ import annotations

import re
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from tests.dashboard import TARGET_LABELS, exposed, load, parse, queries, with_prefix

DASHBOARD = load()
# The dashboard's queries read `<prefix>:<name>`: the modes named so (not trtllm-serve's).
PREFIXES = tuple(
    n for n in typing.get_args(Settings.model_fields["metrics_names"].annotation) if n != "trtllm"
)
QUERIES = list(queries(DASHBOARD))


def server_metrics(prefix: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """What the server exports with this prefix: {sample name: family}, {family: labels}."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, prefix=prefix + ":")
    names = exposed(generate_latest(registry).decode())
    labels = {
        m._name: set(m._labelnames)  # prometheus_client keeps label names only here
        for m in vars(metrics).values()
        if isinstance(m, MetricWrapperBase)
    }
    for family in set(names.values()) - labels.keys():  # a collector's (the KV use)
        labels[family] = {key for s in family_samples(registry, family) for key in s.labels}
    return names, labels


def family_samples(registry: CollectorRegistry, family: str) -> list:
    return [s for m in registry.collect() if m.name == family for s in m.samples]


def test_the_prefix_variable_offers_exactly_the_servers_settings() -> None:
    (variable,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "prefix"]
    assert [o["value"] for o in variable["options"]] == list(PREFIXES)
    assert variable["current"]["value"] == Settings().metrics_names  # the default


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[f"{t}: {e}" for t, e in QUERIES])
def test_every_query_names_only_exported_metrics_and_labels(
    prefix: str, title: str, expr: str
) -> None:
    names, labels = server_metrics(prefix)
    parsed = parse(with_prefix(expr, prefix))
    assert parsed.metrics, f"{title}: no metric in {expr}"
    unknown = parsed.metrics - names.keys()
    assert not unknown, f"{title}: {sorted(unknown)} not exported with prefix {prefix}"
    have = set().union(*(labels[names[m]] for m in parsed.metrics)) | TARGET_LABELS
    if any(m.endswith("_bucket") for m in parsed.metrics):
        have.add("le")
    assert parsed.labels <= have, f"{title}: labels {sorted(parsed.labels - have)} unknown"


def test_the_router_and_latency_metrics_each_have_a_panel() -> None:
    used = set().union(*(parse(with_prefix(e, "mtt")).metrics for _, e in QUERIES))
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "time_to_first_token_seconds_bucket",
        "time_per_output_token_seconds_bucket",
        "e2e_request_latency_seconds_bucket",
        "request_queue_time_seconds_bucket",
        "prompt_tokens_total",
        "generation_tokens_total",
        "request_finished_total",
    ):
        assert "mtt:" + name in used


def test_the_dashboard_is_well_formed() -> None:
    panels = DASHBOARD["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    declared = {v["name"] for v in DASHBOARD["templating"]["list"]}
    for panel in panels:
        text = repr(panel)
        used = set(re.findall(r"\$\{(\w+)\}|\$(\w+)", text))
        variables = {a or b for a, b in used} - {"__rate_interval", "__interval", "__range"}
        assert variables <= declared, f"{panel['title']}: undeclared {variables - declared}"
        for target in panel.get("targets", []):
            assert target["refId"] and target["datasource"]["uid"] == "${datasource}"
    cells = set()
    for p in panels:  # no two panels share a grid cell (Grafana would shift them)
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, p["title"]
        cells |= mine


# ---- the PromQL reader itself ----


@pytest.mark.parametrize(
    ("expr", "metrics", "labels"),
    [
        ("up", {"up"}, set()),
        ('sum by (pod) (a:b{route="chat", x=~"y|z"})', {"a:b"}, {"pod", "route", "x"}),
        (
            "histogram_quantile(0.99, sum by (le) (rate(h_bucket[$__rate_interval])))",
            {"h_bucket"},
            {"le"},
        ),
        (
            "rate(a_total[5m]) / on (pod) group_left rate(b_total[5m]) > bool 0.5e3",
            {"a_total", "b_total"},
            {"pod"},
        ),
        ('count_values("a_total", x) offset 5m', {"x"}, set()),
    ],
)
def test_parse(expr: str, metrics: set[str], labels: set[str]) -> None:
    assert parse(expr).metrics == metrics and parse(expr).labels == labels


@given(st.text(max_size=60))
def test_parse_takes_any_text(text: str) -> None:
    parse(text)  # garbage in gives some (possibly empty) sets, never an exception
