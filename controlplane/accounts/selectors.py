"""Who may see and do what. Every tenant-facing query narrows through these."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from controlplane.accounts.choices import BOOKING_ROLES, Role
from controlplane.accounts.models import ApiToken, Membership, Project


def is_operator(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def projects_visible_to(user: Any) -> QuerySet[Project]:
    """Operators see every project; anyone else the projects they are a member of."""
    if is_operator(user):
        return Project.objects.all()
    if not user or not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user)


def role_in(user: Any, project: Project | int) -> Role | None:
    if not user or not user.is_authenticated:
        return None
    project_id = project if isinstance(project, int) else project.pk
    role = Membership.objects.filter(user=user, project_id=project_id).values_list("role", flat=True).first()
    return Role(role) if role else None


def can_book(user: Any, project: Project | int) -> bool:
    return is_operator(user) or role_in(user, project) in BOOKING_ROLES


def can_manage(user: Any, project: Project | int) -> bool:
    return is_operator(user) or role_in(user, project) == Role.OWNER


def members_of(project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user").order_by("user__username")


def api_tokens_of(user: Any) -> QuerySet[ApiToken]:
    """A caller's own tokens only: even operators manage other people's tokens in the admin, not the API."""
    if not user or not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)
