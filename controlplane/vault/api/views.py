"""/projects/{slug}/secrets/ and /projects/{slug}/registries/ (docs/images.md).

Members of the project (any role) read the names; owners and members (those who book) write. Another tenant's
project is a 404. The role is checked before the body is read; no answer holds a value or a password.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.models import Project
from controlplane.accounts.selectors import can_book, projects_visible_to
from controlplane.core.errors import NotFound, PermissionDenied
from controlplane.vault import services
from controlplane.vault.api.serializers import (
    RegistryCreateSerializer,
    RegistryCredentialSerializer,
    RegistrySerializer,
    SecretCreateSerializer,
    SecretSerializer,
    SecretValueSerializer,
)
from controlplane.vault.models import EntryKind, VaultEntry


def _valid(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class _ProjectEntries(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    kind: str
    noun: str
    queryset = VaultEntry.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    http_method_names = ["get", "post", "put", "delete", "head", "options"]
    pagination_class = None

    def project(self) -> Project:
        if not hasattr(self, "_project"):
            project = projects_visible_to(self.request.user).filter(slug=self.kwargs["slug"]).first()
            if project is None:
                raise NotFound("No such project among yours.")
            self._project = project
        return self._project

    def writable_project(self) -> Project:
        project = self.project()
        if not can_book(self.request.user, project):
            raise PermissionDenied(f"Changing {self.noun} needs the owner or member role in the project.")
        return project

    def get_queryset(self) -> QuerySet[VaultEntry]:
        if getattr(self, "swagger_fake_view", False):
            return VaultEntry.objects.none()
        return (
            VaultEntry.objects.filter(project=self.project(), kind=self.kind)
            .select_related("created_by", "updated_by")
            .defer("sealed")
            .order_by("name")
        )

    def _entry(self, name: str) -> VaultEntry | None:
        return self.get_queryset().filter(name=name).first()

    def _answer(self, entry: VaultEntry, code: int) -> Response:
        fresh = self.get_queryset().get(pk=entry.pk)
        return Response(self.get_serializer(fresh).data, status=code)


_NEVER_SHOWN = "The value is write-only: no answer shows it."


@extend_schema_view(
    list=extend_schema(summary="A project's secrets: names and who set them, never values"),
    retrieve=extend_schema(summary="One secret of a project (its name, not its value)"),
    create=extend_schema(
        summary="Add a secret (owners and members); 409 secret_exists when the name is taken",
        description=_NEVER_SHOWN,
        request=SecretCreateSerializer,
        responses={201: SecretSerializer},
        examples=[OpenApiExample("A token", value={"name": "HF_TOKEN", "value": "<your token>"}, request_only=True)],
    ),
    update=extend_schema(
        summary="Set or replace a secret's value (owners and members); it applies from the next launch",
        description=_NEVER_SHOWN,
        request=SecretValueSerializer,
        responses={200: SecretSerializer, 201: SecretSerializer},
    ),
    destroy=extend_schema(
        summary="Delete a secret; 409 secret_in_use while a reservation not yet ended or a queued request asks for it"
    ),
)
class SecretViewSet(_ProjectEntries):
    serializer_class = SecretSerializer
    kind = EntryKind.SECRET
    noun = "secrets"
    schema_error_statuses = {"POST": ("409",), "DELETE": ("409",)}

    def create(self, request: Request, slug: str) -> Response:
        project = self.writable_project()
        data = _valid(SecretCreateSerializer, request)
        entry, _ = services.secret_set(project=project, actor=request.user, create_only=True, **data)
        return self._answer(entry, status.HTTP_201_CREATED)

    def update(self, request: Request, slug: str, name: str) -> Response:
        project = self.writable_project()
        data = _valid(SecretValueSerializer, request)
        entry, created = services.secret_set(project=project, name=name, value=data["value"], actor=request.user)
        return self._answer(entry, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def destroy(self, request: Request, slug: str, name: str) -> Response:
        self.writable_project()
        entry = self.get_object()
        services.secret_delete(entry=entry, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(summary="A project's registry credentials: registries and user names, never passwords"),
    retrieve=extend_schema(summary="One registry credential of a project (not its password)"),
    create=extend_schema(
        summary="Add a registry credential (owners and members); 409 registry_exists when the registry has one",
        description=_NEVER_SHOWN,
        request=RegistryCreateSerializer,
        responses={201: RegistrySerializer},
        examples=[
            OpenApiExample(
                "NGC",
                value={"registry": "nvcr.io", "username": "$oauthtoken", "password": "<your NGC API key>"},
                request_only=True,
            )
        ],
    ),
    update=extend_schema(
        summary="Set or replace a registry credential (owners and members); used from the next pull",
        description=_NEVER_SHOWN,
        request=RegistryCredentialSerializer,
        responses={200: RegistrySerializer, 201: RegistrySerializer},
    ),
    destroy=extend_schema(summary="Forget a registry credential: later pulls from that registry go without it"),
)
class RegistryViewSet(_ProjectEntries):
    serializer_class = RegistrySerializer
    kind = EntryKind.REGISTRY
    noun = "registry credentials"
    lookup_url_kwarg = "registry"
    schema_error_statuses = {"POST": ("409",)}

    def get_object(self) -> VaultEntry:
        entry = self._entry(self._host(self.kwargs["registry"]))
        if entry is None:
            raise NotFound("No such registry credential in the project.")
        return entry

    @staticmethod
    def _host(text: str) -> str:
        from controlplane.core.errors import ValidationFailed

        try:
            return services.registry_host(text)
        except ValidationFailed:
            return text

    def create(self, request: Request, slug: str) -> Response:
        project = self.writable_project()
        data = _valid(RegistryCreateSerializer, request)
        entry, _ = services.registry_set(project=project, actor=request.user, create_only=True, **data)
        return self._answer(entry, status.HTTP_201_CREATED)

    def update(self, request: Request, slug: str, registry: str) -> Response:
        project = self.writable_project()
        data = _valid(RegistryCredentialSerializer, request)
        entry, created = services.registry_set(project=project, registry=registry, actor=request.user, **data)
        return self._answer(entry, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def destroy(self, request: Request, slug: str, registry: str) -> Response:
        self.writable_project()
        services.registry_delete(entry=self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
