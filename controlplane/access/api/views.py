"""The caller's SSH public keys."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.access import selectors, services
from controlplane.access.api import serializers as s
from controlplane.access.models import SshKey


@extend_schema_view(
    list=extend_schema(summary="The caller's SSH public keys"),
    retrieve=extend_schema(summary="One of the caller's SSH public keys"),
    create=extend_schema(
        summary="Add an SSH public key (ed25519, ECDSA, or RSA of 2048 bits or more, in OpenSSH format)",
        request=s.SshKeyCreateSerializer,
        responses={201: s.SshKeySerializer},
    ),
    destroy=extend_schema(summary="Remove an SSH public key"),
)
class SshKeyViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    serializer_class = s.SshKeySerializer
    queryset = SshKey.objects.all()
    filterset_fields = {"name": ["exact"], "fingerprint": ["exact"], "key_type": ["exact"]}

    def get_queryset(self) -> QuerySet[SshKey]:
        # Another user's key is not in the queryset: a 404, the same as for a key that does not exist.
        return selectors.ssh_keys_of(self.request.user)

    def create(self, request: Request) -> Response:
        serializer = s.SshKeyCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key = services.ssh_key_create(
            user=request.user,
            name=serializer.validated_data["name"],
            public_key=serializer.validated_data["public_key"],
            actor=request.user,
        )
        return Response(s.SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: SshKey) -> None:
        services.ssh_key_delete(key=instance, actor=self.request.user)
