"""Generated bodies, posted to every write endpoint of the OpenAPI schema: no answer is a 5xx, nor anything but
JSON in the API's error shape (issue 10, item 7; invariant 7).

The schema is the one served at /api/v1/schema/, generated in-process. For each POST, PUT and PATCH, as a
project owner and as an operator, hypothesis draws bodies from the operation's request schema, each value
sometimes swapped for a hostile one (NUL, a lone surrogate, megabytes of text, a huge or fractional number,
a value of the wrong type), sent as JSON or as a form. The hostile requests an outside suite sent are
explicit examples, sent to every endpoint first. Bounded: a fixed number of examples per endpoint, drawn
deterministically (``derandomize``), so a failure reproduces and each leg stays well under a minute.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.cache import cache
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from controlplane.access.datasets import dataset_create
from controlplane.access.volumes import volume_create
from controlplane.accounts.choices import Role
from controlplane.fleet import services as fleet_services
from controlplane.inventory.models import Gpu, GpuModel, Rack, Site
from controlplane.ledger.services import ledger_grant
from controlplane.reservations import services
from controlplane.reservations.choices import ReservationState
from controlplane.scheduling.models import PriorityClass
from controlplane.scheduling.services import request_submit
from tests.factories import ApiTokenFactory, OperatorFactory, ProjectFactory, UserFactory, member_of
from tests.reservations.fleet import CONTAINER, gpu_model, server, spec, window

pytestmark = pytest.mark.django_db

EXAMPLES_PER_ENDPOINT = 12
WRITE_METHODS = ("post", "put", "patch")

SCHEMA = SchemaGenerator().get_schema(request=None, public=True)
COMPONENTS: dict[str, Any] = SCHEMA["components"]["schemas"]
OPERATIONS = [
    (method.upper(), path, operation)
    for path, operations in sorted(SCHEMA["paths"].items())
    for method, operation in operations.items()
    if method in WRITE_METHODS
]

# Values no field should take, and that once reached the database or the parser's recursion (500s).
HOSTILE_TEXT = st.sampled_from(
    ["\x00", "a\x00b", "\ud800", "x" * 5000, "", " ", "1' OR '1'='1", "A=B", "now", "-1", "1e400", "é" * 300]
)
HOSTILE = st.one_of(
    HOSTILE_TEXT,
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 2**31, 2**63, 10**30, 1.5, -0.0]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = COMPONENTS[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _instants() -> st.SearchStrategy[str]:
    now = datetime.now(UTC)
    return st.integers(min_value=-48, max_value=24 * 30).map(lambda h: (now + timedelta(hours=h)).isoformat())


def from_schema(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for a JSON Schema node: mostly what it describes (near its bounds), sometimes hostile."""
    node = resolve(node)
    return st.one_of(_described(node, depth), HOSTILE) if depth < 6 else HOSTILE


def _described(node: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    for combinator in ("oneOf", "anyOf", "allOf"):
        if combinator in node:
            return st.one_of([_described(resolve(sub), depth) for sub in node[combinator]])
    if "enum" in node:
        return st.sampled_from([value for value in node["enum"] if value is not None] or [None])
    kind = node.get("type")
    if isinstance(kind, list):
        return st.one_of([_described({**node, "type": k}, depth) for k in kind])
    if kind == "string":
        fmt = node.get("format")
        if fmt == "date-time":
            return st.one_of(_instants(), st.just("now"))
        if fmt == "uuid":
            return st.uuids().map(str)
        if fmt == "decimal":
            return st.decimals(min_value=-(10**12), max_value=10**12, places=4, allow_nan=False).map(str)
        limit = node.get("maxLength", 200)
        return st.one_of(st.text(min_size=1, max_size=min(limit, 40)), st.just("s" * limit), st.just("s" * (limit + 1)))
    if kind == "integer":
        low, high = node.get("minimum", -(2**31)), node.get("maximum", 2**31)
        return st.one_of(st.integers(min_value=low, max_value=min(high, 2**31)), st.sampled_from([low - 1, high + 1]))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(node.get("items", {}), depth + 1)
        return st.lists(items, max_size=min(node.get("maxItems", 4), 4))
    if kind == "object" or "properties" in node:
        properties = node.get("properties", {})
        required = set(node.get("required", []))
        fixed = {name: from_schema(sub, depth + 1) for name, sub in properties.items() if name in required}
        optional = {name: from_schema(sub, depth + 1) for name, sub in properties.items() if name not in required}
        strategy = st.fixed_dictionaries(fixed, optional=optional)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            more = st.dictionaries(
                st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), HOSTILE_TEXT),
                from_schema(extra, depth + 1),
                max_size=3,
            )
            strategy = st.builds(lambda a, b: {**b, **a}, strategy, more)
        return strategy
    return HOSTILE


def request_schema(operation: dict[str, Any]) -> dict[str, Any]:
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    return resolve(schema) if schema else {"type": "object", "properties": {}}


class World:
    """Objects for every path parameter: a project with members, the fleet, reservations, tokens."""

    def __init__(self) -> None:
        self.project = ProjectFactory(slug="atlas", name="Atlas")
        owner = member_of(self.project, Role.OWNER, username="olive")
        member_of(self.project, Role.MEMBER, username="tom")
        UserFactory(username="sam")
        operator = OperatorFactory(username="opal")
        model = gpu_model()
        srv = server(model, gpus=8)
        site = Site.objects.create(name="dc-1")
        rack = Rack.objects.create(site=site, name="r1")
        ledger_grant(project=self.project, amount=10_000, actor=None, reason="fuzz")
        future = services.reservation_create(
            project=self.project, name="future", spec=spec(model), window=window(), container=CONTAINER, actor=owner
        )
        join_token, _ = fleet_services.join_token_create(actor=operator, note="fuzz")
        self.clients = {"owner": self._client(owner), "operator": self._client(operator)}
        self.ids = {
            "projects": self.project.pk,
            "gpu-models": GpuModel.objects.get(pk=model.pk).pk,
            "gpus": Gpu.objects.filter(server=srv).first().pk,  # type: ignore[union-attr]
            "join-tokens": join_token.pk,
            "racks": rack.pk,
            "reservations": future.public_id,
            "servers": srv.pk,
            "sites": site.pk,
            # A spare token of the owner's: revoking the one a client authenticates with would end the run.
            "tokens": ApiTokenFactory(user=owner, name="spare").pk,
            "datasets": dataset_create(name="imagenet", allowed_projects=[self.project], actor=operator).name,
            "volumes": volume_create(project=self.project, name="data", size_limit_gib=10, actor=owner).name,
            # A shipped operator-wide launch template (controlplane/templates/shipped.py).
            "templates": "pytorch",
            "requests": request_submit(
                project=self.project,
                name="queued",
                spec=spec(model),
                container=CONTAINER,
                duration=timedelta(hours=1),
                start_by=None,
                priority_class=PriorityClass.objects.get(name="normal"),
                actor=owner,
            ).public_id,
        }
        done = services.reservation_create(
            project=self.project,
            name="done",
            spec=spec(model),
            window=window(start_in=timedelta(hours=5)),
            container=CONTAINER,
            actor=owner,
        )
        services.reservation_finish(
            reservation=done, to=ReservationState.COMPLETED, ended_at=done.ends_at, actor_label="fuzz", reason="fuzz"
        )

    @staticmethod
    def _client(user: Any) -> APIClient:
        client = APIClient(raise_request_exception=False)
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=user).plaintext}")
        return client

    def url(self, path: str, hostile_id: str | None = None) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            if hostile_id is not None:
                return hostile_id
            if name == "project_pk":
                return str(self.project.pk)
            if name == "username":
                return "tom"
            if name == "slug":
                return self.project.slug
            collection = path.removeprefix("/api/v1/").split("/", 1)[0]
            if name == "name" and "/volumes/" in path:
                collection = "volumes"
            assert collection in self.ids, f"{path}: give World an object for /{collection}/ to fuzz it with"
            return str(self.ids[collection])

        return re.sub(r"\{(\w+)\}", value, path)


def check(response: Any, what: str) -> None:
    """Not a 5xx; JSON (a 204 aside), in the error shape when a refusal."""
    status = response.status_code
    assert status < 500, f"{what}: {status} {response.content[:500]!r}"
    if status == 204:
        return
    content_type = response.get("Content-Type", "")
    assert content_type.startswith("application/json"), f"{what}: {status} {content_type} {response.content[:300]!r}"
    body = json.loads(response.content)
    if status >= 400:
        assert set(body) == {"error"}, f"{what}: {body}"
        assert {"code", "message", "fields"} <= set(body["error"]), f"{what}: {body}"


def send(client: APIClient, method: str, url: str, body: Any, encoding: str) -> Any:
    if encoding == "form" and isinstance(body, dict):
        flat = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in body.items()}
        data = urlencode(flat, encoding="utf-8", errors="surrogatepass")
        return client.generic(method, url, data, content_type="application/x-www-form-urlencoded")
    raw = body if encoding == "raw" else json.dumps(body)
    return client.generic(method, url, raw, content_type="application/json")


def _deep(levels: int, open_: str, close: str) -> str:
    return open_ * levels + close * levels


# The outside suite's requests, as bodies for any endpoint: each key of the real body set to each of these.
EXPLICIT_VALUES: list[Any] = ["\x00", "a\x00", "\ud800", 10**30, 1e300, {"A=B": "1", "": "2"}, [[[[]]]]]
TOO_LARGE = "x" * 3_000_000
EXPLICIT_RAW = [
    '{"container": {"env": ' + _deep(100_000, '{"a":', "}").replace("}", '"x"}', 1) + "}}",
    '{"container": {"command": ' + _deep(5_000, "[", "]") + "}}",
    '{"name": ' + _deep(5_000, "[", "]") + "}",
    "project=%00",
    "{not json",
    "[]",
    "null",
    '"text"',
]
HOSTILE_IDS = ["x%00", "1' OR '1'='1", "not-a-uuid", "99999999999999999999999999", "%ED%A0%80"]


@pytest.fixture
def world(db: Any) -> Iterator[World]:
    # The anonymous rate (login, enrollment) counts per address in the cache: a fresh count for each endpoint,
    # so its bodies reach the view, and none left over for the tests that run after.
    cache.clear()
    yield World()
    cache.clear()


@pytest.mark.parametrize("caller", ["owner", "operator"])
@pytest.mark.parametrize(("method", "path", "operation"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS])
def test_no_write_endpoint_answers_a_5xx_or_anything_but_json(
    world: World, caller: str, method: str, path: str, operation: dict[str, Any]
) -> None:
    client = world.clients[caller]
    url = world.url(path)
    schema = request_schema(operation)
    keys = list(schema.get("properties", {})) or ["name"]

    for value in EXPLICIT_VALUES:
        for encoding in ("json", "form"):
            check(send(client, method, url, {key: value for key in keys}, encoding), f"{method} {url} {value!r:.40}")
    check(send(client, method, url, {keys[0]: TOO_LARGE}, "json"), f"{method} {url} 3 MB")
    for raw in EXPLICIT_RAW:
        form = raw.startswith("project=")
        response = send(client, method, url, {"project": "\x00"} if form else raw, "form" if form else "raw")
        check(response, f"{method} {url} {raw[:40]!r}")
    if "{" in path:
        for hostile_id in HOSTILE_IDS:
            check(send(client, method, world.url(path, hostile_id), {}, "json"), f"{method} {path} id={hostile_id}")

    @settings(
        max_examples=EXAMPLES_PER_ENDPOINT,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=from_schema(schema), encoding=st.sampled_from(["json", "json", "form"]))
    def generated(body: Any, encoding: str) -> None:
        check(send(client, method, url, body, encoding), f"{method} {url} {encoding} {json.dumps(body)[:300]}")

    generated()


def test_every_write_endpoint_is_fuzzed() -> None:
    """The schema lists the write endpoints; none is left out because its path or body is unusual."""
    assert len(OPERATIONS) >= 30
    assert {path for _, path, _ in OPERATIONS} >= {
        "/api/v1/reservations/",
        "/api/v1/projects/",
        "/api/v1/projects/{project_pk}/members/",
        "/api/v1/ledger/grants/",
        "/api/v1/ledger/refunds/",
        "/api/v1/agent/heartbeat/",
    }
