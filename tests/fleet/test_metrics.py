from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from nodeagent import schema
from tests.factories import ApiTokenFactory, OperatorFactory, UserFactory
from tests.fleet.helpers import gpu_uuid, heartbeat, ingest

pytestmark = pytest.mark.django_db


def scrape(client: APIClient | None = None) -> Any:
    return (client or APIClient()).get("/metrics")


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_expose_fleet_gauges_and_dcgm_series(node: Any) -> None:
    ingest(node[0], heartbeat("node-a", fields={gpu_uuid("node-a", 1): {schema.GPU_UTIL: 87.0, schema.GPU_TEMP: 95.0}}))
    response = scrape()
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = series(response.content.decode())
    labels = (
        ("gpu", "1"),
        ("hostname", "node-a"),
        ("modelName", "H100-80GB"),
        ("simulated", "true"),
        ("uuid", gpu_uuid("node-a", 1)),
    )
    assert found[("DCGM_FI_DEV_GPU_UTIL", labels)] == 87.0
    assert found[("DCGM_FI_DEV_GPU_TEMP", labels)] == 95.0
    assert found[("DCGM_FI_DEV_FB_USED", labels)] == 1000.0
    assert found[("DCGM_FI_DEV_POWER_USAGE", labels)] == 300.0
    assert found[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels)] == 1_000_000.0
    assert found[("DCGM_FI_DEV_XID_ERRORS", labels)] == 0.0
    assert found[("gpucp_gpu_unhealthy", labels)] == 1.0  # over the temperature limit
    assert found[("gpucp_servers", (("state", "commissioning"),))] == 1.0
    assert found[("gpucp_servers", (("state", "ready"),))] == 0.0
    assert found[("gpucp_gpus", (("health", "healthy"), ("present", "true")))] == 1.0
    assert found[("gpucp_gpus", (("health", "unhealthy"), ("present", "true")))] == 1.0


def test_scrape_cost_does_not_grow_with_gpus(node: Any, django_assert_max_num_queries: Any) -> None:
    from tests.fleet.helpers import gpu_facts

    ingest(node[0], heartbeat("node-a", gpus=gpu_facts("node-a", count=8)))
    # Three for the fleet, two for node loss (the watch and an open disruption).
    with django_assert_max_num_queries(5):
        assert scrape().status_code == 200


@override_settings(METRICS_PUBLIC=False)
def test_private_metrics_need_an_operator_token(db: Any) -> None:
    assert scrape().status_code == 401
    tenant = APIClient()
    tenant.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=UserFactory()).plaintext}")
    assert scrape(tenant).status_code == 403
    operator = APIClient()
    operator.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=OperatorFactory()).plaintext}")
    assert scrape(operator).status_code == 200
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION="Bearer gcp_abcdefabcdef_nope")
    assert scrape(forged).status_code == 401


def test_metrics_count_the_calls_that_went_without_redis(db: Any) -> None:
    body = scrape().content.decode()
    assert 'gpucp_cache_errors_total{operation="get"}' in body  # at 0 from the start, for rate() and alerts
    assert "gpucp_broker_publish_errors_total" in body
