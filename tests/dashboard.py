"""Read the Grafana dashboard's PromQL: which metric names and labels each query uses, and
which sample names a Prometheus exposition offers. Shared by the dashboard's unit test
(the Metrics class) and the e2e scrape (the real server's /metrics)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parent.parent / "docs/grafana/mtt-dashboard.json"

# Labels Prometheus adds when it scrapes (target labels), not the server.
TARGET_LABELS = frozenset({"pod", "namespace", "instance", "job", "container", "node"})
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "group_left", "group_right"})
# The sample names of a family, by its type (prometheus_client's exposition).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def load() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every query, rows' nested panels included."""
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def with_prefix(expr: str, prefix: str) -> str:
    """The query as Grafana sends it with the `prefix` variable set."""
    return expr.replace("${prefix}", prefix).replace("$prefix", prefix)


@dataclass(frozen=True)
class Parsed:
    metrics: frozenset[str]  # sample names the query selects
    labels: frozenset[str]  # labels it matches on or groups by


def parse(expr: str) -> Parsed:
    """Metric names and labels of a PromQL query (enough PromQL for dashboards: selectors,
    ranges, functions, aggregations with by/without, binary operators)."""
    labels: set[str] = set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings hold no names
    text = re.sub(r"\[[^\]]*\]", " ", text)  # [5m], [$__rate_interval]

    def matchers(m: re.Match[str]) -> str:
        labels.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(1)))
        return " "

    text = re.sub(r"\{([^}]*)\}", matchers, text)

    def grouping(m: re.Match[str]) -> str:
        labels.update(_IDENT.findall(m.group(2)))
        return " "

    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", grouping, text
    )
    metrics = {
        m.group(0)
        for m in _IDENT.finditer(text)
        if m.group(0) not in _KEYWORDS
        and not re.match(r"\s*\(", text[m.end() :])  # a function call
        and not (m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."))
    }
    return Parsed(frozenset(metrics), frozenset(labels))


def exposed(exposition: str) -> dict[str, str]:
    """{sample name: family name} for every family in an exposition, samples or not."""
    out = {}
    for family in text_string_to_metric_families(exposition):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            out[family.name + suffix] = family.name
    return out
