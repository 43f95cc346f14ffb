"""Project volumes, datasets and a project's egress network (docs/volumes.md)."""

from __future__ import annotations

import re
from typing import Any

from django.core.validators import RegexValidator
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access import datasets, volumes
from controlplane.access.models import (
    NAME_MAX,
    RESERVED_NETWORKS,
    SIZE_LIMIT_MAX_GIB,
    Dataset,
    ProjectNetwork,
    Volume,
    network_validator,
)
from controlplane.accounts.api.permissions import IsOperator
from controlplane.accounts.models import Project
from controlplane.accounts.selectors import can_book, is_operator, projects_visible_to
from controlplane.core.api.fields import SlugRelatedField, StrictBooleanField
from controlplane.core.errors import NotFound, PermissionDenied, ValidationFailed

# --- serializers -------------------------------------------------------------------------------------------


class VolumeSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    limit_bytes = serializers.IntegerField(read_only=True, help_text="size_limit_gib in bytes (GiB = 2^30).")
    used_percent = serializers.FloatField(
        read_only=True, allow_null=True, help_text="used_bytes as a percent of the limit; null before a measurement."
    )
    over_limit = serializers.BooleanField(
        read_only=True, help_text="The last measurement is over the limit: bookings and launches are refused."
    )
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)

    class Meta:
        model = Volume
        fields = [
            "name",
            "project",
            "size_limit_gib",
            "limit_bytes",
            "shared",
            "used_bytes",
            "measured_at",
            "used_percent",
            "over_limit",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "used_bytes": {"help_text": "What the volume held when an agent last measured it; null before."},
            "measured_at": {"help_text": "When that was."},
        }


class VolumeCreateSerializer(serializers.Serializer):
    # The name's rule is the service's (volumes._check_name), the one the admin shares; not trimmed, so a name
    # with spaces is refused rather than quietly changed.
    name = serializers.CharField(
        max_length=NAME_MAX, trim_whitespace=False, help_text="Lowercase letters, digits, - and _; unique per project."
    )
    size_limit_gib = serializers.IntegerField(min_value=1, max_value=SIZE_LIMIT_MAX_GIB)
    shared = StrictBooleanField(
        default=False, help_text="May be mounted by overlapping reservations at once (they must share it safely)."
    )


class VolumeUpdateSerializer(serializers.Serializer):
    size_limit_gib = serializers.IntegerField(min_value=1, max_value=SIZE_LIMIT_MAX_GIB, required=False)
    shared = StrictBooleanField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "name" in self.initial_data:
            raise serializers.ValidationError({"name": ["A volume's name is its directory: it cannot change."]})
        return attrs


class DatasetSerializer(serializers.ModelSerializer):
    allowed_projects = serializers.SerializerMethodField(
        help_text="The projects that may mount it; a tenant sees only its own among them."
    )

    class Meta:
        model = Dataset
        fields = ["name", "description", "allowed_projects", "created_at"]
        read_only_fields = fields

    def get_allowed_projects(self, dataset: Dataset) -> list[str]:
        mine: set[int] | None = self.context.get("visible_project_ids")
        return sorted(p.slug for p in dataset.allowed_projects.all() if mine is None or p.pk in mine)


class DatasetWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=NAME_MAX, trim_whitespace=False)
    description = serializers.CharField(allow_blank=True, required=False, default="", max_length=2000)
    allowed_projects = SlugRelatedField(slug_field="slug", queryset=Project.objects.all(), many=True, required=False)


# The service's rule (volumes.project_network_set: network_validator's characters, not a reserved name) as one
# pattern the API schema states, anchored at the very end (network_validator's $ also admits a final newline)
# and read as sent, untrimmed.
_NETWORK_CHARS = re.compile(network_validator.regex).pattern.removeprefix("^").removesuffix("$")
egress_network_validator = RegexValidator(
    rf"\A(?!(?:{'|'.join(sorted(RESERVED_NETWORKS))})\Z){_NETWORK_CHARS}\Z",
    f"{network_validator.message} Not {' or '.join(sorted(RESERVED_NETWORKS))}: name the Docker network made for it.",
    code="invalid",
)


class ProjectNetworkSerializer(serializers.Serializer):
    project = serializers.CharField(read_only=True)
    allowed = serializers.BooleanField(read_only=True, help_text='Whether the project may book network "egress".')
    network_name = serializers.CharField(
        max_length=128,
        allow_null=True,
        trim_whitespace=False,
        validators=[egress_network_validator],
        help_text="The Docker network its egress containers join; null: none.",
    )


# --- views -------------------------------------------------------------------------------------------------


def visible_project(request: Request, slug: str) -> Project:
    """The project by slug if the caller can see it; another tenant's reads as absent (404, never 403)."""
    project = projects_visible_to(request.user).filter(slug=slug).first()
    if project is None:
        raise NotFound("No such project among yours.")
    return project


def _require_writer(request: Request, project: Project) -> None:
    if not can_book(request.user, project):
        raise PermissionDenied("Changing volumes needs the owner or member role in the project.")


def _valid(serializer_class: type[serializers.Serializer], request: Request, **kwargs: Any) -> dict[str, Any]:
    serializer = serializer_class(data=request.data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


@extend_schema_view(
    list=extend_schema(summary="A project's volumes, with their usage"),
    retrieve=extend_schema(summary="One volume of a project"),
    create=extend_schema(
        summary="Create a volume (owners and members)",
        request=VolumeCreateSerializer,
        responses={201: VolumeSerializer},
    ),
    partial_update=extend_schema(
        summary="Change a volume's size limit or sharing", request=VolumeUpdateSerializer, responses=VolumeSerializer
    ),
    destroy=extend_schema(
        summary="Forget a volume (its data on disk is left as it is); 409 volume_in_use while a live "
        "reservation mounts it"
    ),
)
class VolumeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = VolumeSerializer
    queryset = Volume.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def project(self) -> Project:
        if not hasattr(self, "_project"):
            self._project = visible_project(self.request, self.kwargs["slug"])
        return self._project

    def get_queryset(self) -> QuerySet[Volume]:
        if getattr(self, "swagger_fake_view", False):
            return Volume.objects.none()
        return Volume.objects.filter(project=self.project()).select_related("project", "created_by")

    def create(self, request: Request, slug: str) -> Response:
        project = self.project()
        _require_writer(request, project)
        data = _valid(VolumeCreateSerializer, request)
        volume = volumes.volume_create(project=project, actor=request.user, **data)
        volume.project = project
        return Response(VolumeSerializer(volume).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, slug: str, name: str) -> Response:
        volume = self.get_object()
        _require_writer(request, volume.project)
        data = _valid(VolumeUpdateSerializer, request)
        updated = volumes.volume_update(volume=volume, actor=request.user, **data)
        updated.project, updated.created_by = volume.project, volume.created_by
        return Response(VolumeSerializer(updated).data)

    def destroy(self, request: Request, slug: str, name: str) -> Response:
        volume = self.get_object()
        _require_writer(request, volume.project)
        volumes.volume_delete(volume=volume, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(summary="The datasets your projects may mount (operators: all)"),
    retrieve=extend_schema(summary="One dataset"),
    create=extend_schema(
        summary="Declare a dataset (operators)", request=DatasetWriteSerializer, responses={201: DatasetSerializer}
    ),
    partial_update=extend_schema(
        summary="Change a dataset's description or projects (operators)",
        request=DatasetWriteSerializer,
        responses=DatasetSerializer,
    ),
    destroy=extend_schema(summary="Remove a dataset (operators); its files are left on disk"),
)
class DatasetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = DatasetSerializer
    queryset = Dataset.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_permissions(self) -> list[BasePermission]:
        # Checked before the body is read.
        if self.action in ("create", "partial_update", "destroy"):
            return [IsAuthenticated(), IsOperator()]
        return [IsAuthenticated()]

    def _visible_ids(self) -> set[int] | None:
        if is_operator(self.request.user):
            return None
        if not hasattr(self, "_ids"):
            self._ids = set(projects_visible_to(self.request.user).values_list("pk", flat=True))
        return self._ids

    def get_queryset(self) -> QuerySet[Dataset]:
        qs = Dataset.objects.prefetch_related(Prefetch("allowed_projects", queryset=Project.objects.only("pk", "slug")))
        ids = self._visible_ids()
        if ids is not None:
            # A dataset none of the caller's projects may mount is not there for them.
            qs = qs.filter(allowed_projects__in=ids).distinct()
        return qs

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "visible_project_ids": self._visible_ids()}

    def _out(self, dataset: Dataset, code: int = status.HTTP_200_OK) -> Response:
        fresh = self.get_queryset().get(pk=dataset.pk)
        return Response(DatasetSerializer(fresh, context=self.get_serializer_context()).data, status=code)

    def create(self, request: Request) -> Response:
        data = _valid(DatasetWriteSerializer, request)
        dataset = datasets.dataset_create(actor=request.user, **data)
        return self._out(dataset, status.HTTP_201_CREATED)

    def partial_update(self, request: Request, name: str) -> Response:
        dataset = self.get_object()
        serializer = DatasetWriteSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        if "name" in data and data.pop("name") != dataset.name:
            raise ValidationFailed(
                "name: a dataset's name is its directory: it cannot change.",
                fields={"name": ["A dataset's name is its directory: it cannot change."]},
            )
        return self._out(datasets.dataset_update(dataset=dataset, actor=request.user, **data))

    def destroy(self, request: Request, name: str) -> Response:
        datasets.dataset_delete(dataset=self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProjectNetworkView(APIView):
    """The Docker network a project's egress containers join. Members read it; operators set and withdraw it."""

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method in ("PUT", "DELETE"):
            return [IsAuthenticated(), IsOperator()]
        return [IsAuthenticated()]

    def _answer(self, project: Project) -> Response:
        name = ProjectNetwork.objects.filter(project=project).values_list("network_name", flat=True).first()
        data = {"project": project.slug, "allowed": name is not None, "network_name": name}
        return Response(ProjectNetworkSerializer(data).data)

    @extend_schema(summary="A project's egress network", responses=ProjectNetworkSerializer)
    def get(self, request: Request, slug: str) -> Response:
        return self._answer(visible_project(request, slug))

    @extend_schema(
        summary="Allow a project's egress on a Docker network (operators)",
        request=ProjectNetworkSerializer,
        responses=ProjectNetworkSerializer,
    )
    def put(self, request: Request, slug: str) -> Response:
        project = visible_project(request, slug)
        data = _valid(ProjectNetworkSerializer, request)
        volumes.project_network_set(project=project, network_name=data["network_name"], actor=request.user)
        return self._answer(project)

    @extend_schema(summary="Withdraw a project's egress (operators)", responses={204: None})
    def delete(self, request: Request, slug: str) -> Response:
        volumes.project_network_set(project=visible_project(request, slug), network_name=None, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
