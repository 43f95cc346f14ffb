"""The general rules that make the schema true (issue 12), each on one endpoint: error responses documented in
the one error shape, strict paging, query parameters read one way, filters naming a missing object, an unknown
format, JSON read at the documented types. tests/test_schemathesis.py checks them all against a live system."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from controlplane.inventory.models import Rack, Site
from tests.factories import OperatorFactory, ProjectFactory, UserFactory, member_of

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


@pytest.fixture
def tenant() -> APIClient:
    client = APIClient()
    client.force_authenticate(UserFactory())
    return client


@pytest.fixture
def operator() -> APIClient:
    client = APIClient()
    client.force_authenticate(OperatorFactory())
    return client


def error(response, status: int) -> dict:
    assert response.status_code == status, response.content
    return response.json()["error"]


def test_every_operation_documents_its_errors_in_the_one_shape(schema):
    error_ref = "#/components/schemas/Error"
    ops = schema["paths"]
    servers = ops["/api/v1/servers/{id}/"]["get"]["responses"]
    assert {"200", "401", "404", "429"} <= set(servers)
    assert servers["404"]["content"]["application/json"]["schema"]["$ref"] == error_ref
    assert {"400", "401", "403", "404", "409", "413", "429"} <= set(ops["/api/v1/sites/{id}/"]["put"]["responses"])
    # A read any signed-in user may make is never a 403; a list with no path parameter never a 404.
    assert not {"403", "404"} & set(ops["/api/v1/gpu-models/"]["get"]["responses"])
    # Login takes no token (no 401) but checks CSRF (403).
    login = set(ops["/api/v1/auth/login/"]["post"]["responses"])
    assert "401" not in login and "403" in login
    assert set(schema["components"]["schemas"]["ErrorDetail"]["required"]) == {"code", "message", "fields"}


def test_nullable_fields_are_declared_nullable(schema):
    components = schema["components"]["schemas"]
    assert "null" in components["LedgerEntry"]["properties"]["reservation"]["type"]
    assert "null" in components["QuotaPolicy"]["properties"]["updated_by"]["type"]
    assert "null" in components["OperatorServer"]["properties"]["rack"]["type"]
    assert "null" in components["JoinToken"]["properties"]["server"]["type"]
    assert "null" in components["ServerEvent"]["properties"]["gpu"]["type"]
    refs = [s["$ref"] for s in components["OperatorServer"]["properties"]["state_before_offline"]["oneOf"]]
    assert "#/components/schemas/BlankEnum" in refs


def test_a_decimal_pattern_needs_a_digit(schema):
    import re

    pattern = re.compile(schema["components"]["schemas"]["GrantRequest"]["properties"]["amount"]["pattern"])
    assert pattern.search("12.5") and pattern.search(".5")
    assert not any(pattern.search(v) for v in ["", "-", ".", "-1", "0", "0.0000"])


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=null", "offset"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("offset=-1", "offset"),
        ("offset=1&offset=2", "offset"),
        ("offset=" + "9" * 50, "offset"),
    ],
)
def test_paging_is_strict(tenant, query, field):
    assert field in error(tenant.get(f"/api/v1/gpu-models/?{query}"), 400)["fields"]


def test_empty_paging_is_the_default(tenant):
    assert tenant.get("/api/v1/gpu-models/?limit=&offset=").status_code == 200


def test_a_one_value_filter_given_twice_is_a_400_and_empty_is_not_given(operator):
    assert "rack" in error(operator.get("/api/v1/servers/?rack=1&rack=2"), 400)["fields"]
    assert operator.get("/api/v1/servers/?state=ready&state=draining").status_code == 200  # a list filter
    assert operator.get("/api/v1/servers/?rack=").status_code == 200
    assert "simulated" in error(operator.get("/api/v1/servers/?simulated=-5"), 400)["fields"]


def test_a_filter_naming_a_missing_object_finds_nothing(operator):
    site = Site.objects.create(name="s1")
    Rack.objects.create(site=site, name="r1")
    assert operator.get(f"/api/v1/racks/?site={site.pk}").json()["count"] == 1
    assert operator.get(f"/api/v1/racks/?site={site.pk + 100}").json()["count"] == 0
    assert "site" in error(operator.get("/api/v1/racks/?site=x"), 400)["fields"]


def test_a_hand_read_query_refuses_repeats_and_reads_empty_as_absent(tenant):
    base = "/api/v1/availability/earliest/?duration_hours=1&gpu_count=1&min_memory_mib=1"
    assert "gpu_count" in error(tenant.get(base + "&gpu_count=2"), 400)["fields"]
    assert tenant.get(base + "&gpu_model=&whole_servers=").status_code == 200


def test_a_url_past_its_limit_is_a_414_in_the_shape(tenant, settings):
    settings.API_MAX_URL_BYTES = 2048
    assert error(tenant.get("/api/v1/gpu-models/?x=" + "a" * 2100), 414)["limit_bytes"] == 2048
    assert tenant.get("/api/v1/gpu-models/?x=" + "a" * 1900).status_code == 200


def test_an_unknown_format_is_a_400_naming_it(operator):
    assert "format" in error(operator.get("/api/v1/usage/fleet?format=xml"), 400)["fields"]


def test_a_csv_endpoints_error_is_json(tenant):
    response = tenant.get("/api/v1/usage/fleet?format=csv")
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/sites/", {"name": 0}, "name"),
        ("/api/v1/sites/", {"name": "s", "location": 0}, "location"),
        (
            "/api/v1/gpu-models/",
            {"name": "X", "product_name": "X", "memory_mib": 1, "billing_weight": 1},
            "billing_weight",
        ),
    ],
)
def test_json_is_read_at_the_documented_types(operator, path, body, field):
    assert field in error(operator.post(path, body, format="json"), 400)["fields"]


def test_a_form_still_carries_text(operator):
    assert operator.post("/api/v1/sites/", {"name": "formsite", "location": "x"}, format="multipart").status_code == 201


def test_a_patch_that_changes_nothing_is_a_200():
    project = ProjectFactory()
    owner = member_of(project, role="owner")
    client = APIClient()
    client.force_authenticate(owner)
    response = client.patch(f"/api/v1/projects/{project.pk}/members/{owner.username}/", {}, format="json")
    assert response.status_code == 200 and response.json()["role"] == "owner"


def test_booleans_are_true_or_false(tenant):
    project = ProjectFactory()
    client = APIClient()
    client.force_authenticate(member_of(project, role="owner"))
    path = f"/api/v1/projects/{project.pk}/"
    assert (
        "requeue_on_interrupt" in error(client.patch(path, {"requeue_on_interrupt": 0}, format="json"), 400)["fields"]
    )
    assert client.patch(path, {"requeue_on_interrupt": True}, format="json").status_code == 200


def test_a_request_object_admits_extra_keys_without_nul_as_the_parsers_do(schema, tenant):
    """The API ignores a key no field reads, but its parsers refuse a NUL in any key or string: the schema says
    both of every object a request carries (found by schemathesis in a preference's unknown key)."""
    components = schema["components"]["schemas"]
    preference = components["PreferenceRequest"]
    assert preference["propertyNames"] == {"pattern": "^[^\\u0000]*$"}
    assert preference["additionalProperties"] == {"$ref": "#/components/schemas/ExtraValue"}
    assert all(
        c.get("additionalProperties") is not None
        for name, c in components.items()
        if name.endswith("Request")
        if c.get("type") == "object"
    )
    body = {"preferences": [{"event_type": "reservation.booked", "channel": "email", "note": {"a\x00": 1}}]}
    refused = error(tenant.put("/api/v1/notifications/preferences/", body, format="json"), 400)
    assert refused["fields"] == {"preferences.0.note.a\\u0000": ["Null characters are not allowed."]}
    body["preferences"][0]["note"] = {"a": [1, "text"]}
    assert tenant.put("/api/v1/notifications/preferences/", body, format="json").status_code == 200


def test_a_text_is_measured_as_sent_before_its_blanks_are_trimmed(operator, schema):
    """maxLength counts what was sent: two blanks and a full-length name is one too long (schemathesis)."""
    limit = schema["components"]["schemas"]["SiteRequest"]["properties"]["name"]["maxLength"]
    refused = error(operator.post("/api/v1/sites/", {"name": "  " + "s" * limit}, format="json"), 400)
    assert refused["fields"] == {"name": [f"Ensure this field has no more than {limit} characters."]}
    assert operator.post("/api/v1/sites/", {"name": " " + "s" * (limit - 2) + " "}, format="json").status_code == 201


def test_a_servers_events_offer_no_filters_of_the_servers_list(schema):
    names = {p["name"] for p in schema["paths"]["/api/v1/servers/{id}/events/"]["get"]["parameters"]}
    assert names == {"id", "limit", "offset"}


def test_slice_specs_are_documented_where_they_are_read(schema):
    # Booking and the availability reads take slices (mig_profile, or slices with a minimum memory); the
    # answers say which profile they answer. The queue takes neither (docs/fractional.md).
    paths, components = schema["paths"], schema["components"]["schemas"]
    for path in ("/api/v1/availability/free/", "/api/v1/availability/earliest/"):
        params = {p["name"]: p for p in paths[path]["get"]["parameters"]}
        assert {"mig_profile", "slices"} <= set(params), path
        assert params["slices"]["schema"]["type"] == "boolean"
    assert {"mig_profile"} <= set(components["FreeAnswer"]["properties"])
    assert {"mig_profile"} <= set(components["EarliestAnswer"]["properties"])
    assert {"mig_profile", "slices"} <= set(components["BookingSpecRequest"]["properties"])
    assert not {"mig_profile", "slices"} & set(components["SpecRequest"]["properties"])


# --- issue 22: rules the server enforced that the schema did not state --------------------------------------
# Each value is sent for real; the schema admits it (its pattern, read as ECMA reads it) exactly when the
# server accepts it, so schemathesis needs no excuse for them.


def _admits(prop: dict, value: str) -> bool:
    import re

    # ECMA's $ (no multiline flag) is the end of the text; Python's also matches before a final newline. None
    # of these patterns has a $ inside a character class.
    return re.search(prop["pattern"].replace("$", r"\Z"), value) is not None


def _request_property(schema: dict, component: str, name: str) -> dict:
    prop = schema["components"]["schemas"][component]["properties"][name]
    return {**prop, "type": prop["type"]}


@pytest.mark.parametrize("pue", ["1", "1.00", "05.5", "4.99", "5", "5.00", "0", "0.99", ".5", "5.01", "6", "1.001"])
def test_a_sites_pue_bound_in_the_schema_is_the_servers(operator, schema, pue):
    prop = _request_property(schema, "SiteRequest", "pue")
    response = operator.post("/api/v1/sites/", {"name": f"site-{pue}", "pue": pue}, format="json")
    assert response.status_code in (201, 400), response.content
    assert _admits(prop, pue) == (response.status_code == 201), (pue, prop["pattern"], response.content)


@pytest.mark.parametrize("name", ["net", "a.b-c_d", "hosts", "Egress1", "host", "none", " net", "net\n", "-net", "a b"])
def test_an_egress_network_name_pattern_in_the_schema_is_the_servers(operator, schema, name):
    project = ProjectFactory()
    prop = _request_property(schema, "ProjectNetworkRequest", "network_name")
    response = operator.put(f"/api/v1/projects/{project.slug}/egress/", {"network_name": name}, format="json")
    assert response.status_code in (200, 400), response.content
    assert _admits(prop, name) == (response.status_code == 200), (name, response.content)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "HTTPS://127.0.0.1:8443/a?b=c#d",
        "http://localhost",
        "ftp://127.0.0.1/",
        " http://127.0.0.1/",
        "http://127.0.0.1/a b",
        "http://user:pw@127.0.0.1/",
        "http:/127.0.0.1/",
        "127.0.0.1/hook",
    ],
)
def test_a_webhook_url_scheme_in_the_schema_is_the_servers(schema, settings, url):
    # Private addresses allowed, so that only the URL's shape decides (whether a host resolves, and to a public
    # address, is checked after: a rule no schema can state).
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = True
    project = ProjectFactory()
    client = APIClient()
    client.force_authenticate(member_of(project, role="owner"))
    prop = _request_property(schema, "WebhookEndpointCreateRequest", "url")
    body = {"url": url, "events": ["reservation.booked"]}
    response = client.post(f"/api/v1/projects/{project.pk}/webhooks/", body, format="json")
    assert response.status_code in (201, 400), response.content
    assert _admits(prop, url) == (response.status_code == 201), (url, response.content)


@pytest.fixture
def booked():
    from datetime import timedelta

    from controlplane.reservations import services
    from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

    model = gpu_model()
    server(model, gpus=2)
    owner = UserFactory()
    proj = project(owner=owner, grant="1000")
    reservation = services.reservation_create(
        project=proj, name="job", spec=spec(model, count=1), window=window(start_in=timedelta(hours=1), hours=2),
        container=CONTAINER, actor=owner,
    )  # fmt: skip
    client = APIClient()
    client.force_authenticate(owner)
    return client, reservation


def _parameter(schema: dict, path: str, name: str) -> dict:
    return next(p for p in schema["paths"][path]["get"]["parameters"] if p["name"] == name)


@pytest.mark.parametrize("after", ["", "1-0", "12-345.7-0", " 1-0", "1-0\n", "\u0661-0", "1-", "x", "1-0.", "1-0,2-0"])
def test_a_log_cursor_in_the_schema_is_the_servers_with_or_without_follow(schema, booked, after):
    """The cursor is read whenever given: a malformed one with follow=0 was ignored, a schema-violating request
    answered 200; and Python's \\d and $ took an Arabic-Indic digit and a final newline that the schema's did not."""
    client, reservation = booked
    parameter = _parameter(schema, "/api/v1/reservations/{id}/logs/", "after")
    response = client.get(f"/api/v1/reservations/{reservation.public_id}/logs/", {"after": after})
    assert response.status_code in (200, 400), response.content
    assert _admits(parameter["schema"], after) == (response.status_code == 200), (after, response.content)
    if response.status_code == 400:
        assert "after" in response.json()["error"]["fields"]
    header = client.get(f"/api/v1/reservations/{reservation.public_id}/logs/", HTTP_LAST_EVENT_ID="1-0\n")
    assert "Last-Event-ID" in error(header, 400)["fields"]


@pytest.mark.parametrize(
    ("ends_at", "accepted"),
    [
        ("2030-01-01T00:00:00Z", True),
        ("2030-01-01T00:00:00.5+05:30", True),
        ("", False),
        ("2030-01-01T00:00:00", False),  # no zone: not an RFC 3339 date-time either
        ("0001-01-01T00:00:00+05:00", False),  # before year 1 in UTC
        ("9999-12-31T23:59:59-05:00", False),  # after year 9999 in UTC
        ("0001-01-01T12:00:00Z", False),  # the whole edge day, as the schema's pattern says
    ],
)
def test_an_extend_quotes_ends_at_is_a_date_time_the_schema_states(schema, booked, ends_at, accepted):
    client, reservation = booked
    parameter = _parameter(schema, "/api/v1/reservations/{id}/extend-quote/", "ends_at")
    assert parameter["required"] and parameter["schema"]["format"] == "date-time"
    assert _admits(parameter["schema"], ends_at) or not accepted
    response = client.get(f"/api/v1/reservations/{reservation.public_id}/extend-quote/", {"ends_at": ends_at})
    if accepted:
        assert response.status_code == 200, response.content
    else:
        assert "ends_at" in error(response, 400)["fields"]


def test_a_member_caps_user_who_is_not_a_member_is_a_404_as_documented(schema):
    project = ProjectFactory()
    client = APIClient()
    client.force_authenticate(member_of(project, role="owner"))
    assert "404" in schema["paths"]["/api/v1/ledger/member-caps/"]["post"]["responses"]
    for name in ("no-such-user", UserFactory().username):
        body = {"project": project.slug, "user": name, "gpu_hours_per_period": "5"}
        assert "user" in error(client.post("/api/v1/ledger/member-caps/", body, format="json"), 404)["fields"]
