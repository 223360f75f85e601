"""jev_common.metrics: every service's exposition counts the tasks alive on its event loop
(`jev_<service>_asyncio_tasks`), read at the scrape."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from jev_common.metrics import HttpMetrics


def tasks_gauge(metrics: HttpMetrics, service: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    (sample,) = families[f"jev_{service}_asyncio_tasks"].samples
    return sample.value


async def test_the_gauge_counts_the_tasks_alive_on_the_loop():
    metrics = HttpMetrics("svc")
    before = tasks_gauge(metrics, "svc")
    assert before >= 1  # this test's own task
    parked = [asyncio.ensure_future(asyncio.sleep(60)) for _ in range(5)]
    await asyncio.sleep(0)
    assert tasks_gauge(metrics, "svc") == before + 5
    for task in parked:
        task.cancel()
    await asyncio.gather(*parked, return_exceptions=True)
    assert tasks_gauge(metrics, "svc") == before


def test_off_the_loop_the_gauge_is_left_out():
    text = HttpMetrics("svc").exposition().decode()
    assert "jev_svc_asyncio_tasks " not in text and "jev_svc_http_in_flight" in text
