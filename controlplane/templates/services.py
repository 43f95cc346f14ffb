"""Launch templates: who may change which, the lookup a booking makes, and writes (docs/templates.md)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.accounts.selectors import can_manage, is_operator, projects_visible_to
from controlplane.core.errors import NotFound, PermissionDenied, ValidationFailed
from controlplane.reservations.api.serializers import container_from, port_from
from controlplane.reservations.specs import port_problems
from controlplane.templates.api.serializers import TemplateWriteSerializer, stored_container, stored_spec
from controlplane.templates.models import LaunchTemplate

log = logging.getLogger(__name__)


def templates_visible_to(user: Any) -> QuerySet[LaunchTemplate]:
    """Operator-wide templates and those of the projects the caller sees."""
    if is_operator(user):
        return LaunchTemplate.objects.all()
    return LaunchTemplate.objects.filter(Q(project__isnull=True) | Q(project__in=projects_visible_to(user)))


def templates_for(project: Project | None) -> QuerySet[LaunchTemplate]:
    """The templates ``project`` books from: its own and the operator-wide ones (both, by name, before
    shadowing; see ``effective``)."""
    scope = Q(project__isnull=True)
    if project is not None:
        scope |= Q(project=project)
    return LaunchTemplate.objects.filter(scope)


def effective(templates: list[LaunchTemplate]) -> list[LaunchTemplate]:
    """A project's templates by name: its own shadows an operator-wide one of the same name."""
    by_name: dict[str, LaunchTemplate] = {}
    for template in templates:
        if template.name not in by_name or template.project_id is not None:
            by_name[template.name] = template
    return sorted(by_name.values(), key=lambda t: t.name)


def find(name: str, project: Project | None) -> LaunchTemplate | None:
    """The template ``name`` as ``project`` sees it (its own first), or None."""
    found = list(templates_for(project).filter(name=name).select_related("project")[:2])
    return effective(found)[0] if found else None


def visible_project(user: Any, slug: str) -> Project:
    project = projects_visible_to(user).filter(slug=slug).first()
    if project is None:
        message = "No such project among yours."
        raise NotFound(message, fields={"project": ["No such project."]})
    return project


def require_manager(user: Any, project: Project | None) -> None:
    """Operators manage operator-wide templates; a project's owners (and operators) manage its own."""
    if project is None:
        if not is_operator(user):
            raise PermissionDenied("Operator-wide templates are managed by operators; give your project's slug.")
    elif not can_manage(user, project):
        raise PermissionDenied("A project's templates are managed by its owners.")


def read(data: Any, *, user: Any) -> dict[str, Any]:
    """A template's body read by TemplateWriteSerializer (the booking's container and spec serializers) and the
    booking's container rules (mount paths), as the model's fields."""
    serializer = TemplateWriteSerializer(data=data, projects=projects_visible_to(user))
    serializer.is_valid(raise_exception=True)
    values = serializer.validated_data
    # The booking's rules on the container as a whole (mount paths, repeats), with the booking's field names.
    container_from(values["container"]).validate()
    ports = [port_from(p) for p in values["ports"]]
    problems = port_problems(ports, {}, at="ports")
    if problems:
        raise ValidationFailed("; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()), fields=problems)
    return {
        "project": values["project"],
        "name": values["name"],
        "title": values["title"],
        "description": values["description"],
        "container": stored_container(values["container"]),
        "spec": stored_spec(values["spec"]),
        "ports": [port.stored() for port in ports],
        "duration_s": int(values["duration"].total_seconds()),
    }


def _duplicate(name: str, project: Project | None) -> ValidationFailed:
    where = f"project {project.slug}" if project is not None else "the operator-wide templates"
    message = f"A template named {name!r} exists already in {where}."
    return ValidationFailed(message, code="duplicate_name", fields={"name": [message]})


def scope_of(data: Any, *, user: Any) -> Project | None:
    """The project a body names (404 when the caller cannot see it), or None for an operator-wide template;
    a project that is not a string is left to the serializer (400)."""
    slug = data.get("project") if isinstance(data, dict) else None
    return visible_project(user, slug) if isinstance(slug, str) else None


def template_create(*, data: Any, actor: Any) -> LaunchTemplate:
    # Whose it would be, and may the caller write there, before the rest of the body (as a booking does).
    require_manager(actor, scope_of(data, user=actor))
    values = read(data, user=actor)
    project = values["project"]
    if LaunchTemplate.objects.filter(project=project, name=values["name"]).exists():
        raise _duplicate(values["name"], project)
    now = timezone.now()
    try:
        with transaction.atomic():
            template = LaunchTemplate.objects.create(
                **values, created_by=actor if getattr(actor, "pk", None) else None, created_at=now, updated_at=now
            )
    except IntegrityError:
        raise _duplicate(values["name"], project) from None
    log.info("template created: scope=%s name=%s", project.slug if project else "*", template.name)
    return template


def as_request(template: LaunchTemplate) -> dict[str, Any]:
    """A stored template in the write body's form: what a change is merged into."""
    return {
        "project": template.project.slug if template.project_id else None,
        "name": template.name,
        "title": template.title,
        "description": template.description,
        "container": dict(template.container),
        "spec": template.spec,
        "ports": list(template.ports),
        "duration": template.duration_s,
    }


def template_update(*, template: LaunchTemplate, data: Any, actor: Any) -> LaunchTemplate:
    """A change: the keys given replace the template's (``container`` key by key), then the whole is read
    again as a new template would be. The name and the project are its address (the URL's): a body's are
    ignored, as any key a change does not take."""
    require_manager(actor, template.project)
    if not isinstance(data, dict):
        raise ValidationFailed("Send a JSON object.", fields={"non_field_errors": ["Send a JSON object."]})
    body = as_request(template)
    for key, value in data.items():
        if key in ("name", "project"):
            continue  # the template's address, given by the URL: not a change
        if key == "container" and isinstance(value, dict):
            body["container"] = {**body["container"], **value}
        else:
            body[key] = value
    values = read(body, user=actor)
    for key, value in values.items():
        if key not in ("project", "name"):
            setattr(template, key, value)
    template.updated_at = timezone.now()
    template.save()
    log.info("template changed: scope=%s name=%s", template.project.slug if template.project_id else "*", template.name)
    return template


def template_delete(*, template: LaunchTemplate, actor: Any) -> None:
    require_manager(actor, template.project)
    scope = template.project.slug if template.project_id else "*"
    template.delete()
    log.info("template deleted: scope=%s name=%s", scope, template.name)
