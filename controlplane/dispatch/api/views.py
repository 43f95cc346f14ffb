from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, viewsets

from controlplane.dispatch.api.serializers import ImagePullSerializer, LaunchSerializer
from controlplane.dispatch.filters import LaunchFilter
from controlplane.dispatch.models import ImagePull, Launch
from controlplane.dispatch.selectors import launches_visible_to
from controlplane.reservations.selectors import reservations_visible_to


class LaunchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Launches of your projects' reservations (``?reservation=<id>``). Another project's launch is 404."""

    serializer_class = LaunchSerializer
    filterset_class = LaunchFilter
    lookup_field = "launch_id"
    queryset = Launch.objects.none()

    def get_queryset(self) -> QuerySet[Launch]:
        return launches_visible_to(self.request.user).select_related("reservation", "server")


@extend_schema(summary="The launches of one reservation")
class ReservationLaunchesView(generics.ListAPIView):
    """The containers dispatched for a reservation, every generation. Another project's reservation is 404."""

    serializer_class = LaunchSerializer
    queryset = Launch.objects.none()

    def get_queryset(self) -> QuerySet[Launch]:
        reservation = get_object_or_404(reservations_visible_to(self.request.user), public_id=self.kwargs["id"])
        return Launch.objects.filter(reservation=reservation).select_related("reservation", "server")


@extend_schema(summary="The images pulled ahead of one reservation's window")
class ReservationImagesView(generics.ListAPIView):
    """Per server, what its agent reported of pulling the reservation's image before the window: pulling (with
    layers, bytes and seconds), present (with the digest) or failed (with the registry's reason). Another project's
    reservation is 404."""

    serializer_class = ImagePullSerializer
    queryset = ImagePull.objects.none()

    def get_queryset(self) -> QuerySet[ImagePull]:
        reservation = get_object_or_404(reservations_visible_to(self.request.user), public_id=self.kwargs["id"])
        return ImagePull.objects.filter(reservation=reservation).select_related("server")
