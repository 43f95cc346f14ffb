"""Opening a running reservation's web apps and web terminal (docs/proxy.md): the API hands out one-time links
that the proxy turns into a session of the app's own host, or a terminal's WebSocket."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access.web import grants, links
from controlplane.access.web.grants import Grant
from controlplane.core.errors import Conflict, DomainError, NotFound, ValidationFailed
from controlplane.reservations.api.fields import StrictStringField
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ports_from_stored


class Gone(DomainError):
    status_code = 410
    code = "gone"


class OpenSerializer(serializers.Serializer):
    port = StrictStringField(max_length=64, help_text="The name of one of the reservation's http ports.")
    path = StrictStringField(
        max_length=600, required=False, help_text="Where to land on the app (default: the port's path)."
    )


class TerminalSerializer(serializers.Serializer):
    server = StrictStringField(
        max_length=253, required=False, help_text="For a reservation on several servers: which one (default the first)."
    )


class LinkSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="Good once, until expires_at: navigate to it (a terminal's: connect to it).")
    expires_at = serializers.DateTimeField()


class AppLinkSerializer(LinkSerializer):
    name = serializers.CharField()
    app_url = serializers.CharField(help_text="The app's stable address (needs the session the link opens).")


class TerminalLinkSerializer(LinkSerializer):
    server = serializers.CharField()


def _granted(request: Request, reservation: str, port: str | None) -> Grant:
    """The grant, or the API's error for it: 404 (not the caller's, or a viewer), 409 not ready, 410 gone."""
    grant = grants.grant_for(request.user.pk, reservation, port, now=timezone.now())
    if grant.status == grants.NOT_FOUND:
        raise NotFound("No such reservation among those you may open.")
    if grant.status == grants.GONE:
        raise Gone(grant.message)
    if grant.status == grants.NOT_READY:
        raise Conflict(grant.message, code="not_ready")
    return grant


def _may_open(request: Request, reservation: str) -> Grant:
    """The caller's right to the reservation, before anything of the body is read: a 404 first, the same for a
    reservation that does not exist, so a refusal tells nothing."""
    grant = grants.grant_for(request.user.pk, reservation, None, now=timezone.now())
    if grant.status == grants.NOT_FOUND:
        raise NotFound("No such reservation among those you may open.")
    return grant


def _check_port(grant: Grant, name: str) -> Any:
    """The port named, of a reservation the caller may open."""
    stored = Reservation.objects.filter(pk=grant.reservation_pk).values_list("ports", flat=True).first()
    ports = {p.name: p for p in ports_from_stored(list(stored or []))}
    port = ports.get(name)
    if port is None:
        names = ", ".join(sorted(ports)) or "none"
        message = f"No port named {name!r}; the reservation's ports: {names}."
        raise ValidationFailed(f"port: {message}", fields={"port": [message]})
    if port.protocol != "http":
        message = f"{name} is a {port.protocol} port: only http ports open in the browser; use gpucp ssh -L."
        raise ValidationFailed(f"port: {message}", fields={"port": [message]})
    return port


class OpenView(APIView):
    @extend_schema(
        summary="A one-time link that opens one of a running reservation's web apps in the browser",
        request=OpenSerializer,
        responses={200: AppLinkSerializer},
    )
    def post(self, request: Request, id: Any) -> Response:
        reservation = str(id)
        visible = _may_open(request, reservation)
        body = OpenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        port = _check_port(visible, body.validated_data["port"])
        grant = _granted(request, reservation, port.name)
        path = body.validated_data.get("path") or port.path
        if links.safe_next(path, default="") != path:
            raise ValidationFailed("path: a path on the app, starting with one /.",
                                   fields={"path": ['A path on the app, starting with one "/".']})  # fmt: skip
        assert grant.ends_at is not None
        link = links.open_link(
            user_id=request.user.pk, reservation=reservation, port=port.name, path=path,
            now=timezone.now(), ends_at=grant.ends_at,
        )  # fmt: skip
        return Response(
            {
                "name": port.name,
                "url": link.url,
                "app_url": links.app_url(reservation, port.name),
                "expires_at": link.expires_at,
            }
        )


class TerminalView(APIView):
    @extend_schema(
        summary="A one-time WebSocket link to a shell in a running reservation's container (the web terminal)",
        request=TerminalSerializer,
        responses={200: TerminalLinkSerializer},
    )
    def post(self, request: Request, id: Any) -> Response:
        reservation = str(id)
        _may_open(request, reservation)
        body = TerminalSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        grant = _granted(request, reservation, None)
        server = body.validated_data.get("server")
        servers = [t.server for t in grant.targets]
        if server is not None and server not in servers:
            message = f"The reservation's container does not run on {server!r} (it runs on: {', '.join(servers)})."
            raise ValidationFailed(f"server: {message}", fields={"server": [message]})
        assert grant.ends_at is not None
        chosen = server or servers[0]
        link = links.terminal_link(
            user_id=request.user.pk, reservation=reservation, server=chosen, now=timezone.now(), ends_at=grant.ends_at
        )
        return Response({"url": link.url, "expires_at": link.expires_at, "server": chosen})
