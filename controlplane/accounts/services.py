"""Writes to projects, memberships and API tokens. Views and the admin call these and nothing else."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from controlplane.accounts import selectors
from controlplane.accounts.choices import Role
from controlplane.accounts.models import ApiToken, Membership, Project
from controlplane.core import tokens
from controlplane.core.errors import Conflict, NotFound, PermissionDenied, ValidationFailed

LAST_OWNER_RULE = "A project must keep at least one owner"
PROJECT_EDITABLE_FIELDS = frozenset({"name", "description", "requeue_on_interrupt"})


def _require_manager(*, actor: Any, project: Project) -> None:
    if not selectors.can_manage(actor, project):
        raise PermissionDenied("Only an owner of this project or an operator may do this.")


def _locked_project(project: Project) -> Project:
    # The row lock serialises every membership change of one project, so two owners demoting each other
    # at the same moment cannot both pass the "another owner remains" check.
    return Project.objects.select_for_update().get(pk=project.pk)


@transaction.atomic
def project_create(
    *, name: str, owner: Any, actor: Any, slug: str = "", description: str = "", requeue_on_interrupt: bool = False
) -> Project:
    """Create a project with ``owner`` as its first owner. Operators only."""
    if not selectors.is_operator(actor):
        raise PermissionDenied("Only an operator may create projects.")
    if not owner.is_active:
        raise ValidationFailed("The owner's account is disabled.", fields={"owner": ["This user is disabled."]})
    slug = slug or slugify(name)[:80]
    if not slug:
        raise ValidationFailed(
            "The project needs a slug; the name gives none.",
            fields={"slug": ["Give a slug of letters, digits, '-' or '_'."]},
        )
    if Project.objects.filter(slug=slug).exists():
        raise Conflict(
            f"A project with the slug {slug!r} already exists.",
            code="slug_taken",
            fields={"slug": ["A project with this slug already exists."]},
        )
    try:
        with transaction.atomic():
            project = Project.objects.create(
                name=name, slug=slug, description=description, requeue_on_interrupt=requeue_on_interrupt
            )
    except IntegrityError:
        # Another request created the same slug between the check and the insert.
        raise Conflict(
            f"A project with the slug {slug!r} already exists.",
            code="slug_taken",
            fields={"slug": ["A project with this slug already exists."]},
        )
    Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    return project


@transaction.atomic
def project_update(*, project: Project, actor: Any, **changes: Any) -> Project:
    """Change a project's name, description or interruption policy. Owners and operators."""
    _require_manager(actor=actor, project=project)
    unknown = set(changes) - PROJECT_EDITABLE_FIELDS
    if unknown:
        raise ValidationFailed(
            "These fields cannot be changed.",
            fields={name: ["This field cannot be changed."] for name in sorted(unknown)},
        )
    if changes:
        Project.objects.filter(pk=project.pk).update(**changes)
        project.refresh_from_db()
    return project


@transaction.atomic
def membership_set(*, project: Project, user: Any, role: Role | str, actor: Any) -> Membership:
    """Add ``user`` to ``project`` with ``role``, or change the role they have. Owners and operators."""
    try:
        role = Role(role)
    except ValueError:
        raise ValidationFailed(f"{role!r} is not a role.", fields={"role": [f"Choose one of {', '.join(Role)}."]})
    if not user.is_active:
        raise ValidationFailed("The user's account is disabled.", fields={"user": ["This user is disabled."]})
    _locked_project(project)
    # Checked under the lock: an owner demoted a moment ago must not still add members.
    _require_manager(actor=actor, project=project)
    membership = Membership.objects.filter(project=project, user=user).first()
    if membership is None:
        return Membership.objects.create(project=project, user=user, role=role)
    if membership.role == Role.OWNER and role != Role.OWNER:
        _refuse_if_last_owner(project=project, membership=membership, doing="demote")
    Membership.objects.filter(pk=membership.pk).update(role=role)
    membership.role = role
    return membership


@transaction.atomic
def membership_remove(*, project: Project, user: Any, actor: Any) -> None:
    """Remove ``user`` from ``project``. Owners and operators; the last owner stays."""
    _locked_project(project)
    _require_manager(actor=actor, project=project)
    membership = Membership.objects.filter(project=project, user=user).first()
    if membership is None:
        raise NotFound(f"{user} is not a member of {project}.")
    if membership.role == Role.OWNER:
        _refuse_if_last_owner(project=project, membership=membership, doing="remove")
    membership.delete()


def _refuse_if_last_owner(*, project: Project, membership: Membership, doing: str) -> None:
    others = Membership.objects.filter(project=project, role=Role.OWNER).exclude(pk=membership.pk)
    if not others.exists():
        raise Conflict(
            f"{LAST_OWNER_RULE}: cannot {doing} {membership.user}, the last owner of {project}. "
            "Make another member an owner first.",
            code="last_owner",
        )


@transaction.atomic
def api_token_create(
    *, user: Any, name: str, expires_at: datetime | None = None, issued_with: ApiToken | None = None
) -> tuple[ApiToken, str]:
    """Issue a personal API token. Returns the token and its plaintext, which is never stored or shown again.

    A token created with another token (``issued_with``) cannot outlive it, so a leaked short-lived token
    cannot be turned into a permanent one.
    """
    now = timezone.now()
    if not name.strip():
        raise ValidationFailed("The token needs a name.", fields={"name": ["This field may not be blank."]})
    if expires_at is not None and expires_at <= now:
        raise ValidationFailed("The expiry must be in the future.", fields={"expires_at": ["Must be in the future."]})
    if issued_with is not None and issued_with.expires_at is not None:
        if expires_at is None:
            expires_at = issued_with.expires_at
        elif expires_at > issued_with.expires_at:
            raise ValidationFailed(
                "A token cannot outlive the token used to create it.",
                fields={"expires_at": [f"Must not be after {issued_with.expires_at.isoformat()}."]},
            )
    issued = tokens.issue(tokens.USER_TOKEN)
    token = ApiToken.objects.create(
        user=user, name=name.strip(), lookup=issued.lookup, digest=issued.digest, created_at=now, expires_at=expires_at
    )
    return token, issued.plaintext


@transaction.atomic
def api_token_revoke(*, token: ApiToken, actor: Any) -> ApiToken:
    """Revoke a token. Its user and operators may; revoking twice is harmless."""
    if token.user_id != actor.pk and not selectors.is_operator(actor):
        raise NotFound("No such token.")
    now = timezone.now()
    # Conditional: the first revocation's time is the one kept when two arrive together.
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    token.refresh_from_db()
    return token
