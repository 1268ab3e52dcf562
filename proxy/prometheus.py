"""/metrics in the Prometheus text format, rendered by prometheus_client.

The server's report is a nested JSON object (engine, server counters, policies, ...;
`/metrics.json` serves it as is). Here every number in it becomes one sample: the
path of keys is the metric name (`jumpahead_engine_prefix_cache_hits`), booleans are
0/1, strings and lists are left out. The `server` section holds monotonic request
counters and is exported as Prometheus counters; everything else as gauges.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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


def prometheus_text(report: dict[str, Any]) -> bytes:
    """The report in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector(report))
    return generate_latest(registry)
