"""GET/POST /templates/, and one template by name (docs/templates.md)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.core.errors import NotFound
from controlplane.templates import services
from controlplane.templates.api.serializers import (
    TemplateChangeSerializer,
    TemplateSerializer,
    TemplateWriteSerializer,
    template_answer,
)
from controlplane.templates.models import LaunchTemplate

_PROJECT = OpenApiParameter(
    "project",
    str,
    required=False,
    description="A project's slug: the templates it books from (its own, and the operator-wide ones it does not "
    "shadow). On one template: the project's, else the operator-wide one of that name.",
)


@extend_schema_view(
    list=extend_schema(summary="Launch templates you can book from", parameters=[_PROJECT]),
    retrieve=extend_schema(summary="One launch template by name", parameters=[_PROJECT]),
    create=extend_schema(
        summary="Create a launch template (operators: operator-wide; owners: their project's)",
        request=TemplateWriteSerializer,
        responses={201: TemplateSerializer},
    ),
    partial_update=extend_schema(
        summary="Change a template: the keys given replace its own (container key by key)",
        parameters=[_PROJECT],
        request=TemplateChangeSerializer(partial=True),
        responses={200: TemplateSerializer},
    ),
    destroy=extend_schema(summary="Delete a template", parameters=[_PROJECT]),
)
class TemplateViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    # A body or a ?project= naming a project not the caller's; a name with no template.
    schema_error_statuses = ("404",)
    serializer_class = TemplateSerializer
    queryset = LaunchTemplate.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def _project(self) -> Any:
        slug = self.request.query_params.get("project")
        return services.visible_project(self.request.user, slug) if slug else None

    def list(self, request: Request) -> Response:
        project = self._project()
        if project is not None:
            templates = services.effective(list(services.templates_for(project).select_related("project")))
        else:
            templates = list(services.templates_visible_to(request.user).select_related("project"))
        page = self.paginate_queryset(templates)
        items = page if page is not None else templates
        answer = [template_answer(t) for t in items]
        return self.get_paginated_response(answer) if page is not None else Response(answer)

    def retrieve(self, request: Request, name: str) -> Response:
        template = services.find(name, self._project())
        if template is None:
            raise NotFound(f"No template named {name!r}.")
        return Response(template_answer(template))

    def create(self, request: Request) -> Response:
        template = services.template_create(data=request.data, actor=request.user)
        return Response(template_answer(template), status=status.HTTP_201_CREATED)

    def _own(self, name: str) -> LaunchTemplate:
        """The template of exactly that scope: the project's own with ?project=, else the operator-wide one."""
        project = self._project()
        template = LaunchTemplate.objects.filter(project=project, name=name).select_related("project").first()
        if template is None:
            where = f" in project {project.slug}" if project is not None else " among the operator-wide templates"
            raise NotFound(f"No template named {name!r}{where}.")
        return template

    def partial_update(self, request: Request, name: str) -> Response:
        template = services.template_update(template=self._own(name), data=request.data, actor=request.user)
        return Response(template_answer(template))

    def destroy(self, request: Request, name: str) -> Response:
        services.template_delete(template=self._own(name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
