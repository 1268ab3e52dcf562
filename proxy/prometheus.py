"""/metrics in the Prometheus text format, rendered by prometheus_client.

The server's report is a nested JSON object (engine, server counters, policies, ...;
`/metrics.json` serves it as is). Here every number in it becomes one sample: the
path of keys is the metric name (`jumpahead_engine_prefix_cache_hits`), booleans are
0/1, strings and lists are left out. The `server` section holds monotonic request
counters and is exported as Prometheus counters; everything else as gauges.

Upstream mode's replica list (`engine.upstream.replicas`, from ReplicaSet.report) is
exported as labelled series instead, one per replica (label `replica` = its base URL):
`jumpahead_engine_upstream_replica_*` in-flight requests, requests / errors / failovers
counters, healthy (0/1), sessions pinned, and the time to the upstream's response
headers as a summary (its `_count` and `_sum`; ReplicaSet keeps no quantiles).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
_BAD = re.compile(r"[^a-zA-Z0-9_]+")
_COUNTER_SECTIONS = {"server"}
_MAX_DEPTH = 8


def _name(parts: list[str]) -> str:
    name = "_".join(p for p in (_BAD.sub("_", part).strip("_") for part in parts) if p)
    return re.sub(r"_+", "_", name).lower()


def _leaves(value: Any, path: list[str], depth: int = 0) -> Iterator[tuple[list[str], float]]:
    if isinstance(value, bool):
        yield path, float(value)
    elif isinstance(value, int | float):
        yield path, float(value)
    elif isinstance(value, dict) and depth < _MAX_DEPTH:
        for key, sub in value.items():
            yield from _leaves(sub, [*path, str(key)], depth + 1)


class _ReportCollector:
    """A prometheus_client collector over one report snapshot."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for path, value in _leaves(self.report, ["jumpahead"]):
            counter = len(path) > 1 and path[1] in _COUNTER_SECTIONS
            name = _name(path)
            if counter:
                name = name.removesuffix("_total")
            if name in seen or name == "jumpahead":
                continue  # two keys that sanitize to one name: the first wins
            seen.add(name)
            doc = "/metrics.json " + ".".join(path[1:])
            family: Metric = CounterMetricFamily(name, doc) if counter else GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            yield family


_REPLICA = "jumpahead_engine_upstream_replica_"
# (report key, metric name, kind, help); counters are named without _total (the client adds it)
_REPLICA_SERIES = (
    ("in_flight", "in_flight_requests", "gauge", "Requests open on the replica now."),
    ("requests", "requests", "counter", "Requests sent to the replica (each failover attempt counts)."),
    ("errors", "errors", "counter", "Errors on the replica: unreachable, timed out, non-200, broken stream."),
    ("failovers", "failovers", "counter", "Requests of sessions homed on another replica (theirs was down)."),
    ("healthy", "healthy", "gauge", "1 while the replica is routed to, 0 while it is skipped as down."),
    ("sessions", "sessions", "gauge", "Sessions that have been served by the replica."),
)


class _ReplicaCollector:
    """Per-replica series over upstream mode's replica report (the same snapshot
    /metrics.json shows)."""

    def __init__(self, replicas: list[dict[str, Any]]) -> None:
        self.replicas = [r for r in replicas if isinstance(r, dict) and isinstance(r.get("url"), str)]

    def collect(self) -> Iterator[Metric]:
        for key, name, kind, doc in _REPLICA_SERIES:
            rows = [r for r in self.replicas if isinstance(r.get(key), bool | int | float)]
            if not rows:
                continue
            family: Metric = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                _REPLICA + name, doc, labels=["replica"])
            for r in rows:
                family.add_metric([r["url"]], float(r[key]))
            yield family
        timed = [r for r in self.replicas
                 if isinstance(r.get("ttfb_count"), int) and isinstance(r.get("ttfb_s_sum"), int | float)]
        if timed:
            summary = SummaryMetricFamily(
                _REPLICA + "time_to_first_byte_seconds",
                "Time from sending a request to the replica's response status and headers.", labels=["replica"])
            for r in timed:
                summary.add_metric([r["url"]], count_value=r["ttfb_count"], sum_value=float(r["ttfb_s_sum"]))
            yield summary


def prometheus_text(report: dict[str, Any]) -> bytes:
    """The report in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector(report))
    engine = report.get("engine")
    upstream = engine.get("upstream") if isinstance(engine, dict) else None
    replicas = upstream.get("replicas") if isinstance(upstream, dict) else None
    if isinstance(replicas, list):
        registry.register(_ReplicaCollector(replicas))
    return generate_latest(registry)
