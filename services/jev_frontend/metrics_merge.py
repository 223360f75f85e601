"""Several workers' Prometheus expositions as one: each sample gets a `backend` label (the worker's URL),
and samples of the same family from different workers are grouped under one HELP/TYPE header."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families


def merged_exposition(texts: dict[str, bytes]) -> bytes:
    """{backend url: exposition} -> one exposition; a worker whose text does not parse is left out."""
    merged: dict[str, Metric] = {}
    for backend, raw in texts.items():
        try:
            families = list(text_string_to_metric_families(raw.decode("utf-8", "replace")))
        except ValueError:
            continue
        for family in families:
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                target.add_sample(
                    sample.name, {**sample.labels, "backend": backend}, sample.value, sample.timestamp, sample.exemplar
                )
    if not merged:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)
