"""The inventory API: sites, racks and the GPU model catalog. Any signed-in user reads them; operators change them.

The servers and GPUs (with their credentials, holders and acknowledgements) are the fleet's console:
``controlplane.fleet.api.servers``, above both this app and reservations.
"""

from __future__ import annotations

from typing import Any

from django.db.models import ProtectedError
from rest_framework import viewsets

from controlplane.core.errors import Conflict
from controlplane.inventory.api import serializers as s
from controlplane.inventory.api.permissions import IsOperatorOrReadOnly
from controlplane.inventory.filters import RackFilter
from controlplane.inventory.models import GpuModel, Rack, Site


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
    queryset = GpuModel.objects.all()
    serializer_class = s.GpuModelSerializer
    permission_classes = [IsOperatorOrReadOnly]
