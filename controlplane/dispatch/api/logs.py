"""Live logs over HTTP: the agents post chunks; tenants read a reservation's output or follow it (SSE)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.parsers import JSONParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.api.errors import too_large_body
from controlplane.core.errors import ValidationFailed
from controlplane.dispatch import logs
from controlplane.dispatch.api.serializers import ReservationLogsSerializer
from controlplane.dispatch.models import Launch
from controlplane.fleet.api.views import parse_wire
from controlplane.fleet.authentication import (
    DeferredNodeCredentialAuthentication,
    IsNodeAgent,
    NodeCredentialAuthentication,
)
from controlplane.reservations.models import Reservation
from controlplane.reservations.selectors import reservations_visible_to
from nodeagent import schema

POLL_S = 0.25
KEEPALIVE_S = 15.0
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


class AgentLogsView(APIView):
    """An agent's log chunks; the reply says per launch where to go on. Only its own server's launches count."""

    # The heartbeat's class (the header checked, a missing one a 401 before the body is read), and the credential
    # verified in ``post``: a second authentication class for the same scheme would be a second, clashing
    # component in the OpenAPI schema.
    authentication_classes = [DeferredNodeCredentialAuthentication]
    permission_classes = [IsNodeAgent]
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]
    throttle_classes: list[type] = []  # a fixed cadence from authenticated nodes, as the heartbeat's

    @extend_schema(
        summary="Post container log chunks (node agents)",
        request=schema.LogBatch,
        responses={
            200: schema.LogBatchReply,
            400: OpenApiResponse(description="Malformed batch (the field is named)"),
            401: OpenApiResponse(description="Missing, invalid or revoked node credential"),
            413: OpenApiResponse(description="Larger than FLEET_HEARTBEAT_MAX_BYTES"),
        },
    )
    def post(self, request: Request) -> Response | HttpResponse:
        limit = int(settings.FLEET_HEARTBEAT_MAX_BYTES)
        try:
            raw = request.body
        except RequestDataTooBig:
            raw = None
        if raw is None or len(raw) > limit:
            return Response(too_large_body(limit, "FLEET_HEARTBEAT_MAX_BYTES"), status=413)
        _, credential = NodeCredentialAuthentication().authenticate(request)
        batch = parse_wire(schema.LogBatch, raw)
        offsets = logs.logs_ingest(server=credential.server, batch=batch, now=timezone.now())
        reply = schema.LogBatchReply(next_offsets=offsets)
        return HttpResponse(reply.model_dump_json(), content_type="application/json")


class EventStreamRenderer(BaseRenderer):
    """Only so that ``Accept: text/event-stream`` (what EventSource sends) is not a 406; the stream itself
    is a StreamingHttpResponse, and errors are JSON whatever was asked for."""

    media_type = "text/event-stream"
    format = "sse"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return JSONRenderer().render(data)


def _flag(request: Request, name: str) -> bool:
    value = str(request.query_params.get(name, "")).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValidationFailed(f"{name}: must be 1 or 0.", fields={name: ["Must be 1 or 0."]})


def _sse(event: str | None, data: Any, event_id: str | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


def follow_events(reservation_pk: int, cursor: dict[int, int]) -> Iterator[bytes]:
    """The reservation's output from ``cursor`` on, polled from the database, until every launch finished and
    all of it was sent (``event: end``) or DISPATCH_LOG_FOLLOW_MAX_S passed (the client reconnects)."""
    deadline = time.monotonic() + float(settings.DISPATCH_LOG_FOLLOW_MAX_S)
    last_write = time.monotonic()
    # A comment first, so the client sees the headers at once; the retry tells EventSource how soon to reconnect.
    yield b"retry: 1000\n: following\n\n"
    pulls: dict[int, Any] = {}
    while True:
        reservation = Reservation.objects.filter(pk=reservation_pk).first()
        if reservation is None:
            yield _sse("end", {})
            return
        launches: list[Launch] = list(logs.reservation_launches(reservation))
        known = {launch.pk for launch in launches}
        for pk in [pk for pk in cursor if pk not in known]:
            del cursor[pk]  # a cursor from another reservation: its parts mean nothing here
        for launch in launches:
            # The pull of the launch's image at its window (it was not on the node): before the container writes
            # anything, its progress is the only thing to follow.
            if launch.pull != pulls.get(launch.pk):
                pulls[launch.pk] = launch.pull
                if launch.pull is not None:
                    event = {
                        "server": launch.server.hostname,
                        "launch_id": launch.launch_id,
                        "generation": launch.generation,
                        "image": reservation.image,
                        "pull": launch.pull,
                    }
                    yield _sse("pull", event, logs.format_cursor(cursor))
                    last_write = time.monotonic()
        more = False
        for launch in launches:
            log = logs.log_of(launch)
            position = cursor.setdefault(launch.pk, 0)
            if log is None or position >= log.received:
                continue
            for piece in logs.read_after(launch, log, position):
                cursor[launch.pk] = piece.offset + len(piece.data)
                event = {
                    "server": launch.server.hostname,
                    "launch_id": launch.launch_id,
                    "generation": launch.generation,
                    "offset": piece.offset,
                    "cut": piece.cut,
                    "text": piece.data.decode("utf-8", errors="replace"),
                }
                yield _sse(None, event, logs.format_cursor(cursor))
                last_write = time.monotonic()
            more = more or cursor[launch.pk] - position >= logs.READ_BYTES
        if more:
            continue  # a backlog: hand out the rest before waiting
        sent_all = all((log := logs.log_of(launch)) is None or cursor[launch.pk] >= log.received for launch in launches)
        if sent_all and logs.reservation_finished(reservation, launches, timezone.now()):
            yield _sse("end", {}, logs.format_cursor(cursor))
            return
        if time.monotonic() >= deadline:
            yield b": the stream ends here; reconnect with the last id\n\n"
            return
        if time.monotonic() - last_write >= KEEPALIVE_S:
            yield b": keep-alive\n\n"
            last_write = time.monotonic()
        time.sleep(POLL_S)


@extend_schema(
    summary="A reservation's container output (kept, or followed live)",
    description=(
        "Per launch the output kept (at most DISPATCH_LOG_KEEP_BYTES, the newest), decoded as UTF-8 with "
        "replacement; `cut` says how many bytes were dropped before it, `gaps` where bytes are missing inside "
        "it. With `?follow=1` the answer is a stream of Server-Sent Events (`text/event-stream`): each event's "
        "`data` is JSON `{server, launch_id, generation, offset, cut, text}` and its `id` a cursor, so "
        "`Last-Event-ID` (or `?after=`) resumes after it; a comment every 15 s keeps it open; `event: end` comes "
        "once every launch of the reservation has ended and all its output was sent; `event: pull` "
        "(`{server, launch_id, generation, image, pull}`) while a launch's image is pulled at its window, with "
        "layers, bytes and seconds so far. A stream ends after "
        "DISPATCH_LOG_FOLLOW_MAX_S; reconnect with the last id. Another project's reservation is 404."
    ),
    parameters=[
        OpenApiParameter("follow", OpenApiTypes.BOOL, description="1: stream Server-Sent Events instead of JSON."),
        OpenApiParameter(
            "after",
            str,
            pattern=logs.CURSOR_PATTERN,
            description="A cursor (an event's id, or `cursor` of the JSON answer): follow from there. Checked "
            "whenever given, also without `follow`.",
        ),
        OpenApiParameter(
            "Last-Event-ID",
            str,
            OpenApiParameter.HEADER,
            pattern=logs.CURSOR_PATTERN,
            description="As `after`; EventSource sends it itself.",
        ),
    ],
    responses={
        (200, "application/json"): ReservationLogsSerializer,
        (200, "text/event-stream"): OpenApiTypes.STR,
        400: OpenApiResponse(description="A bad `follow` or cursor (the parameter is named)"),
        404: OpenApiResponse(description="No such reservation among yours"),
    },
)
class ReservationLogsView(APIView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        # The API's one rule first (an unknown ?format= is a 400, controlplane/core/api/negotiation.py); then
        # JSON whatever was asked: errors (404, 400) are JSON even for an EventSource asking for
        # text/event-stream, and the stream itself is a StreamingHttpResponse, no renderer's.
        super().perform_content_negotiation(request, force)
        return JSONRenderer(), JSONRenderer.media_type

    def get(self, request: Request, id: str) -> Response | StreamingHttpResponse:
        reservation = get_object_or_404(reservations_visible_to(request.user), public_id=id)
        follow = _flag(request, "follow")
        # Both read, whichever is used: a malformed cursor is a 400 with or without follow, as the schema says.
        header = request.headers.get("Last-Event-ID")
        given = logs.parse_cursor(header, name="Last-Event-ID") if header is not None else None
        after = logs.parse_cursor(str(request.query_params.get("after", "")), name="after")
        if not follow:
            return Response(_snapshot_body(reservation))
        cursor = given if given is not None else after
        response = StreamingHttpResponse(follow_events(reservation.pk, cursor), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a reverse proxy must pass each event on, not buffer the stream
        return response


def _snapshot_body(reservation: Reservation) -> dict[str, Any]:
    snaps = logs.snapshot(reservation)
    launches = [snap.launch for snap in snaps]
    cursor = {snap.launch.pk: snap.log.received if snap.log else 0 for snap in snaps}
    return {
        "reservation": str(reservation.public_id),
        "cursor": logs.format_cursor(cursor),
        "finished": logs.reservation_finished(reservation, launches, timezone.now()),
        "launches": [
            {
                "launch_id": snap.launch.launch_id,
                "server": snap.launch.server.hostname,
                "generation": snap.launch.generation,
                "state": snap.launch.state,
                "text": snap.text,
                "cut": snap.cut,
                "gaps": snap.gaps,
                "next_offset": snap.log.received if snap.log else 0,
                "eof": bool(snap.log and snap.log.eof),
            }
            for snap in snaps
        ],
    }
