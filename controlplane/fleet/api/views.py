"""The agent endpoints (enroll, heartbeat) and the operators' join tokens."""

from __future__ import annotations

import logging
from typing import Any

import pydantic
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.api.errors import database_unavailable, error_body
from controlplane.core.errors import ValidationFailed
from controlplane.fleet import services
from controlplane.fleet.api.serializers import (
    JoinTokenCreateSerializer,
    JoinTokenIssuedSerializer,
    JoinTokenSerializer,
)
from controlplane.fleet.authentication import (
    CredentialRefused,
    DeferredNodeCredentialAuthentication,
    IsNodeAgent,
    PresentedNodeCredential,
)
from controlplane.fleet.models import JoinToken
from controlplane.inventory.api.permissions import IsOperator
from nodeagent import schema

log = logging.getLogger(__name__)


def _refused(exc: pydantic.ValidationError) -> ValidationFailed:
    fields = schema.error_fields(exc)
    first = next(iter(fields))
    return ValidationFailed(f"{first}: {fields[first][0]}", fields=fields)


def parse_wire(model: type[pydantic.BaseModel], raw: bytes) -> Any:
    """Validate a wire message straight from the raw body; errors name dotted field paths."""
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise _refused(exc) from None


def _too_big(limit: int) -> Response:
    body = error_body(
        "payload_too_large",
        f"A heartbeat may be at most {limit} bytes (FLEET_HEARTBEAT_MAX_BYTES).",
        {"body": [f"Larger than {limit} bytes."]},
        {"limit_bytes": limit},
    )
    return Response(body, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)


class AgentEnrollView(APIView):
    """A node's agent trades a one-time join token for its node credential."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    parser_classes = [JSONParser]  # the raw body is validated by the wire schema; this only documents it

    @extend_schema(
        request=schema.EnrollRequest,
        responses={
            201: schema.EnrollReply,
            400: OpenApiResponse(description="Malformed request"),
            403: OpenApiResponse(description="Join token not valid, used, expired or revoked"),
            409: OpenApiResponse(description="Hostname already enrolled with an active credential"),
        },
    )
    def post(self, request: Request) -> Response:
        if len(request.body) > 64 * 1024:
            return _too_big(64 * 1024)
        enroll = parse_wire(schema.EnrollRequest, request.body)
        server, credential = services.agent_enroll(
            join_token=enroll.join_token, hostname=enroll.hostname, simulated=enroll.simulated
        )
        reply = schema.EnrollReply(
            server=server.hostname, credential=credential, heartbeat_interval_s=server.heartbeat_interval_s
        )
        return Response(reply.model_dump(mode="json"), status=status.HTTP_201_CREATED)


class AgentHeartbeatView(APIView):
    """The agent's report; the reply is the node's desired state. Only the credential's own server is reachable."""

    authentication_classes = [DeferredNodeCredentialAuthentication]
    permission_classes = [IsNodeAgent]
    parser_classes = [JSONParser]
    # Agents read JSON only; negotiating among the browsable API's renderers cost every heartbeat.
    renderer_classes = [JSONRenderer]
    # Heartbeats come at a fixed cadence from authenticated nodes; the anonymous-rate throttle would cut off a
    # fleet behind one NAT address.
    throttle_classes: list[type] = []

    @extend_schema(
        request=schema.Heartbeat,
        description=(
            "Version 2 of the heartbeat (samples as one series of columns per GPU) is documented; version 1 "
            "(one object per sample, `schema_version: 1`, `HeartbeatV1` in nodeagent/schema.py) is still "
            "accepted from older agents."
        ),
        responses={
            200: schema.HeartbeatReply,
            400: OpenApiResponse(description="Malformed heartbeat"),
            401: OpenApiResponse(description="Missing, invalid or revoked node credential"),
            403: OpenApiResponse(description="Heartbeat for another node"),
            413: OpenApiResponse(description="Larger than FLEET_HEARTBEAT_MAX_BYTES"),
            503: OpenApiResponse(description="The database is unavailable (database_unavailable); send it again"),
        },
    )
    def post(self, request: Request) -> Response | HttpResponse:
        limit = settings.FLEET_HEARTBEAT_MAX_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            return _too_big(limit)
        try:
            raw = request.body
        except RequestDataTooBig:
            return _too_big(limit)
        if len(raw) > limit:
            return _too_big(limit)
        try:
            heartbeat = schema.parse_heartbeat(raw)
        except pydantic.ValidationError as exc:
            raise _refused(exc) from None
        credential = request.auth
        assert isinstance(credential, PresentedNodeCredential)  # IsNodeAgent
        try:
            reply = services.heartbeat_ingest_with_credential(credential=credential.plaintext, heartbeat=heartbeat)
        except CredentialRefused as exc:
            raise exceptions.AuthenticationFailed(exc.message) from None
        except (OperationalError, InterfaceError) as exc:
            # The database is restarting, failing over or out of reach (what a lost or refused connection
            # raises): nothing of the heartbeat was kept, and the agent sends its reports again. A retry, not
            # a server error.
            log.warning("heartbeat not taken, the database is unavailable: %s", exc)
            return database_unavailable("The database is unavailable; this heartbeat was not taken. Send it again.")
        return HttpResponse(reply.model_dump_json(), content_type="application/json")


class JoinTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Operators hand join tokens to new nodes. The plaintext is in the create response only."""

    queryset = JoinToken.objects.select_related("created_by", "server")
    serializer_class = JoinTokenSerializer
    permission_classes = [IsOperator]

    @extend_schema(request=JoinTokenCreateSerializer, responses={201: JoinTokenIssuedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = JoinTokenCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        token, plaintext = services.join_token_create(actor=request.user, **payload.validated_data)
        token.token = plaintext  # type: ignore[attr-defined]
        return Response(JoinTokenIssuedSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JoinTokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = services.join_token_revoke(token=self.get_object(), actor=request.user)
        return Response(JoinTokenSerializer(token).data)
