"""The fleet's console of servers and GPUs. Any signed-in user reads the live fleet; operators see and do the rest.

It lives in the fleet, not the inventory: besides the inventory's servers and GPUs it shows and changes what the
fleet owns (agent credentials, acknowledged GPU faults) and who holds each GPU (reservations), apps above the
inventory (docs/design-notes.md, Layers). The routes are the same ``/servers`` and ``/gpus``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import generics, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.selectors import is_operator
from controlplane.fleet import mig as fleet_mig
from controlplane.fleet import services as fleet_services
from controlplane.fleet.models import NodeCredential
from controlplane.inventory import services
from controlplane.inventory.api import serializers as s
from controlplane.inventory.api.permissions import IsOperator, IsOperatorOrReadOnly
from controlplane.inventory.choices import GpuHealth
from controlplane.inventory.filters import GpuFilter, ServerFilter
from controlplane.inventory.models import Gpu, Server, ServerEvent
from controlplane.inventory.selectors import servers_visible_to_tenants
from controlplane.reservations.holders import gpus_in_use, reservations_on_server


class ServerViewSet(viewsets.ReadOnlyModelViewSet):
    """Servers with their GPUs. Servers are created by enrollment, not here."""

    queryset = Server.objects.all()
    serializer_class = s.ServerSerializer
    filterset_class = ServerFilter
    permission_classes = [IsOperatorOrReadOnly]

    def get_queryset(self) -> QuerySet[Server]:
        gpus = Prefetch(
            "gpus", queryset=Gpu.objects.select_related("model").prefetch_related("mig_devices").order_by("index")
        )
        if is_operator(self.request.user):
            active = Prefetch(
                "credentials",
                queryset=NodeCredential.objects.filter(revoked_at__isnull=True),
                to_attr="active_credentials",
            )
            return Server.objects.select_related("rack__site").prefetch_related(gpus, active)
        return servers_visible_to_tenants().select_related("rack__site").prefetch_related(gpus)

    def get_serializer_class(self) -> type:
        return s.OperatorServerSerializer if is_operator(self.request.user) else s.ServerSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        context = dict(super().get_serializer_context())
        if is_operator(self.request.user):
            # Who holds each GPU now, read once for the whole page rather than once per GPU.
            context["gpus_in_use"] = gpus_in_use()
        return context

    def _server(self) -> Server:
        # The actions need the server row alone, not the GPUs, MIG devices and credentials the list prefetches.
        server = generics.get_object_or_404(Server.objects.all(), pk=self.kwargs["pk"])
        self.check_object_permissions(self.request, server)
        return server

    @extend_schema(request=s.ServerStateChangeSerializer, responses={200: s.OperatorServerSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def state(self, request: Request, pk: str | None = None) -> Response:
        payload = s.ServerStateChangeSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        server = services.server_set_state(
            server=self._server(),
            to=payload.validated_data["state"],
            actor=request.user,
            reason=payload.validated_data["reason"],
        )
        return Response(
            s.OperatorServerSerializer(
                self.get_queryset().get(pk=server.pk), context=self.get_serializer_context()
            ).data
        )

    @extend_schema(responses={200: s.DrainPreviewSerializer})
    @action(detail=True, methods=["get"], url_path="drain-preview", permission_classes=[IsOperator])
    def drain_preview(self, request: Request, pk: str | None = None) -> Response:
        """What draining (or maintenance) would leave in place: the reservations holding the server's GPUs now or
        later, and its unhealthy GPUs (worth a look before returning it to ready)."""
        server = self._server()
        unhealthy = [g.index for g in server.gpus.all() if g.health != GpuHealth.HEALTHY or not g.present]
        body = {
            "server": server.hostname,
            "state": server.state,
            "reservations": reservations_on_server(server=server),
            "unhealthy_gpus": sorted(unhealthy),
        }
        return Response(s.DrainPreviewSerializer(body).data)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.OperatorServerSerializer})
    @action(detail=True, methods=["post"], url_path="revoke-credential", permission_classes=[IsOperator])
    def revoke_credential(self, request: Request, pk: str | None = None) -> Response:
        payload = s.ReasonSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        server = self._server()
        fleet_services.credential_revoke(server=server, actor=request.user, reason=payload.validated_data["reason"])
        return Response(
            s.OperatorServerSerializer(
                self.get_queryset().get(pk=server.pk), context=self.get_serializer_context()
            ).data
        )

    @extend_schema(responses={200: s.ServerEventSerializer(many=True)})
    # filterset_class=None: the servers' filters are not the events'; the schema must not offer them here.
    @action(detail=True, methods=["get"], permission_classes=[IsOperator], filterset_class=None)
    def events(self, request: Request, pk: str | None = None) -> Response:
        server = self._server()
        events = ServerEvent.objects.filter(server=server).select_related("gpu")
        page = self.paginate_queryset(events)
        return self.get_paginated_response(s.ServerEventSerializer(page, many=True).data)


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Gpu.objects.all()
    serializer_class = s.GpuSerializer
    filterset_class = GpuFilter
    permission_classes = [IsOperatorOrReadOnly]

    def get_queryset(self) -> QuerySet[Gpu]:
        qs = Gpu.objects.select_related("server", "model").prefetch_related("mig_devices")
        if is_operator(self.request.user):
            return qs
        return qs.filter(server__in=servers_visible_to_tenants())

    def get_serializer_class(self) -> type:
        return s.OperatorGpuSerializer if is_operator(self.request.user) else s.GpuSerializer

    @extend_schema(request=s.ReasonSerializer, responses={200: s.OperatorGpuSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        payload = s.ReasonSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        gpu = fleet_services.gpu_acknowledge(
            gpu=self.get_object(), actor=request.user, reason=payload.validated_data["reason"]
        )
        return Response(s.OperatorGpuSerializer(self.get_queryset().get(pk=gpu.pk)).data)

    @extend_schema(request=s.MigRequestSerializer, responses={200: s.OperatorGpuSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def mig(self, request: Request, pk: str | None = None) -> Response:
        """Reconfigure the GPU's MIG layout: its server drained, nothing booked on it. The agent applies it on
        its next heartbeat and reports; ``mig_change`` follows (applying, then none, refused or reset_required)."""
        payload = s.MigRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        gpu = fleet_mig.gpu_request_mig(
            gpu=self.get_object(),
            enabled=data["enabled"],
            layout=data["layout"],
            actor=request.user,
            reason=data["reason"],
        )
        return Response(s.OperatorGpuSerializer(self.get_queryset().get(pk=gpu.pk)).data)
