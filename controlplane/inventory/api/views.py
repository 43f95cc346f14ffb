"""The inventory API: sites, racks and the GPU model catalog. Any signed-in user reads them; operators change them.

The servers and GPUs (with their credentials, holders and acknowledgements) are the fleet's console:
``controlplane.fleet.api.servers``, above both this app and reservations.
"""

from __future__ import annotations

from typing import Any

from django.db.models import ProtectedError
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.core.errors import Conflict, NotFound
from controlplane.inventory import services
from controlplane.inventory.api import serializers as s
from controlplane.inventory.api.permissions import IsOperatorOrReadOnly
from controlplane.inventory.filters import RackFilter
from controlplane.inventory.models import GpuModel, GpuModelMigProfile, Rack, Site


class ProtectedDestroyMixin:
    def perform_destroy(self, instance: Any) -> None:
        try:
            instance.delete()
        except ProtectedError:
            raise Conflict(f"{instance} is still in use and cannot be deleted.", code="in_use")


class SiteViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    queryset = Site.objects.all()
    serializer_class = s.SiteSerializer
    permission_classes = [IsOperatorOrReadOnly]


class RackViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    queryset = Rack.objects.all()
    serializer_class = s.RackSerializer
    filterset_class = RackFilter
    permission_classes = [IsOperatorOrReadOnly]


class GpuModelViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    queryset = GpuModel.objects.prefetch_related("mig_profiles")
    serializer_class = s.GpuModelSerializer
    permission_classes = [IsOperatorOrReadOnly]

    @extend_schema(
        request=s.MigProfileWeightSerializer,
        responses={200: s.GpuModelMigProfileSerializer},
        parameters=[OpenApiParameter("profile", str, OpenApiParameter.PATH, description='e.g. "1g.10gb".')],
        summary="Set or clear a MIG profile's billing weight",
    )
    @action(detail=True, methods=["patch"], url_path=r"mig-profiles/(?P<profile>[^/]+)")
    def mig_profile(self, request: Request, pk: str | None = None, profile: str = "") -> Response:
        """Operators: a MIG profile's billing weight, credits per slice-hour; null returns it to the
        profile's share of the GPU's memory slices."""
        model = self.get_object()
        found = GpuModelMigProfile.objects.filter(gpu_model=model, name=profile).first()
        if found is None:
            names = ", ".join(p.name for p in model.mig_profiles.all()) or "(none)"
            raise NotFound(f"{model.name} has no MIG profile {profile!r} in the catalog; it has {names}.")
        payload = s.MigProfileWeightSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        updated = services.mig_profile_set_weight(
            profile=found, billing_weight=payload.validated_data["billing_weight"]
        )
        return Response(s.GpuModelMigProfileSerializer(updated).data)
