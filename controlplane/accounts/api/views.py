"""Projects, members, personal tokens, the caller, and session login for the portal."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate, get_user_model, login, logout
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_protect, ensure_csrf_cookie
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts import selectors, services
from controlplane.accounts.api import serializers as s
from controlplane.accounts.api.permissions import IsOperator
from controlplane.accounts.models import ApiToken, Membership, Project
from controlplane.core.errors import PermissionDenied, ValidationFailed

User = get_user_model()


@extend_schema_view(
    list=extend_schema(summary="Projects the caller is a member of (operators: all)"),
    retrieve=extend_schema(summary="One project"),
    create=extend_schema(
        summary="Create a project with its first owner (operators)",
        request=s.ProjectCreateSerializer,
        responses={201: s.ProjectSerializer},
    ),
    update=extend_schema(
        summary="Change a project (owners)", request=s.ProjectUpdateSerializer, responses=s.ProjectSerializer
    ),
    partial_update=extend_schema(
        summary="Change a project (owners)", request=s.ProjectUpdateSerializer, responses=s.ProjectSerializer
    ),
)
class ProjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.ProjectSerializer
    queryset = Project.objects.all()
    filterset_fields = {"slug": ["exact"], "name": ["exact", "icontains"]}

    def get_permissions(self) -> list[Any]:
        # Checked before the body is read: a tenant's {"owner": "someone"} must not learn whether they exist.
        if self.action == "create":
            return [permissions.IsAuthenticated(), IsOperator()]
        return list(super().get_permissions())

    def get_queryset(self) -> QuerySet[Project]:
        # Another tenant's project is simply not in the queryset: a 404, never a 403 that confirms it exists.
        return selectors.projects_visible_to(self.request.user)

    def create(self, request: Request) -> Response:
        data = _valid(s.ProjectCreateSerializer, request)
        project = services.project_create(actor=request.user, **data)
        return Response(s.ProjectSerializer(project).data, status=status.HTTP_201_CREATED)

    def update(self, request: Request, pk: str | None = None, partial: bool = False) -> Response:
        project = self.get_object()
        _require_manager(request, project)
        data = _valid(s.ProjectUpdateSerializer, request, partial=partial)
        project = services.project_update(project=project, actor=request.user, **data)
        return Response(s.ProjectSerializer(project).data)

    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        return self.update(request, pk, partial=True)


@extend_schema_view(
    list=extend_schema(summary="Members of a project (any member)"),
    retrieve=extend_schema(summary="One member"),
    create=extend_schema(
        summary="Add a member (owners)", request=s.MembershipAddSerializer, responses={201: s.MembershipSerializer}
    ),
    update=extend_schema(
        summary="Change a member's role (owners)", request=s.MembershipRoleSerializer, responses=s.MembershipSerializer
    ),
    partial_update=extend_schema(
        summary="Change a member's role (owners)", request=s.MembershipRoleSerializer, responses=s.MembershipSerializer
    ),
    destroy=extend_schema(summary="Remove a member (owners; never the last owner)"),
)
class MembershipViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.MembershipSerializer
    queryset = Membership.objects.all()
    lookup_field = "user__username"
    lookup_url_kwarg = "username"
    # Usernames may hold '.', '@', '+' and '-'.
    lookup_value_regex = r"[^/]+"

    def project(self) -> Project:
        if not hasattr(self, "_project"):
            visible = selectors.projects_visible_to(self.request.user)
            self._project = get_object_or_404(visible, pk=self.kwargs["project_pk"])
        return self._project

    def get_queryset(self) -> QuerySet[Membership]:
        if getattr(self, "swagger_fake_view", False):
            return Membership.objects.none()
        return selectors.members_of(self.project())

    def create(self, request: Request, project_pk: str) -> Response:
        project = self.project()
        # Before the body: a teammate must not learn from "no such user" which usernames exist.
        _require_manager(request, project)
        data = _valid(s.MembershipAddSerializer, request)
        membership = services.membership_set(
            project=project, user=data["username"], role=data["role"], actor=request.user
        )
        return Response(s.MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    def update(self, request: Request, project_pk: str, username: str, partial: bool = False) -> Response:
        _require_manager(request, self.project())
        membership = self.get_object()
        data = _valid(s.MembershipRoleSerializer, request, partial=partial)
        if "role" not in data:  # a PATCH that changes nothing, as its schema allows
            return Response(s.MembershipSerializer(membership).data)
        membership = services.membership_set(
            project=self.project(), user=membership.user, role=data["role"], actor=request.user
        )
        return Response(s.MembershipSerializer(membership).data)

    def partial_update(self, request: Request, project_pk: str, username: str) -> Response:
        return self.update(request, project_pk, username, partial=True)

    def destroy(self, request: Request, project_pk: str, username: str) -> Response:
        _require_manager(request, self.project())
        membership = self.get_object()
        services.membership_remove(project=self.project(), user=membership.user, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(summary="The caller's API tokens (never their secrets)"),
    retrieve=extend_schema(summary="One of the caller's API tokens"),
    create=extend_schema(
        summary="Create an API token; the plaintext is in this response only",
        request=s.ApiTokenCreateSerializer,
        responses={201: s.ApiTokenCreatedSerializer},
    ),
    destroy=extend_schema(summary="Revoke an API token"),
)
class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.ApiTokenSerializer
    queryset = ApiToken.objects.all()

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.api_tokens_of(self.request.user)

    def create(self, request: Request) -> Response:
        data = _valid(s.ApiTokenCreateSerializer, request)
        issued_with = request.auth if isinstance(request.auth, ApiToken) else None
        token, plaintext = services.api_token_create(
            user=request.user, name=data["name"], expires_at=data["expires_at"], issued_with=issued_with
        )
        token.token = plaintext  # type: ignore[attr-defined]
        return Response(s.ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str | None = None) -> Response:
        services.api_token_revoke(token=self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="Revoke an API token", request=None, responses=s.ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = services.api_token_revoke(token=self.get_object(), actor=request.user)
        return Response(s.ApiTokenSerializer(token).data)


def me_payload(user: Any) -> dict[str, Any]:
    memberships = Membership.objects.filter(user=user).select_related("project").order_by("project__slug")
    return s.MeSerializer(
        {
            "id": user.pk,
            "username": user.get_username(),
            "is_operator": selectors.is_operator(user),
            "memberships": memberships,
        }
    ).data


class MeView(APIView):
    @extend_schema(summary="The caller: name, operator flag and project roles", responses=s.MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(me_payload(request.user))


class SessionView(APIView):
    """Signed in or not, as an answer rather than an error: the portal asks on every load, and a signed-out
    visitor is a state, not a failure (a 401 from /me/ is logged red in every browser console)."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [permissions.AllowAny]

    @extend_schema(
        summary="Whether this browser session is signed in, and as whom (200 either way)",
        responses=s.SessionSerializer,
    )
    def get(self, request: Request) -> Response:
        if not request.user.is_authenticated:
            return Response({"authenticated": False, "user": None})
        return Response({"authenticated": True, "user": me_payload(request.user)})


class CsrfView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(summary="Set the csrftoken cookie for session (portal) clients", responses=s.CsrfSerializer)
    @method_decorator(ensure_csrf_cookie)
    def get(self, request: Request) -> Response:
        from django.middleware.csrf import get_token

        return Response({"csrf_token": get_token(request)})


class LoginView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [permissions.AllowAny]
    schema_error_statuses = ("403",)  # the CSRF check (controlplane/core/api/schema.py)

    # DRF exempts its views from CSRF and checks it only for authenticated session users; a login form
    # must be protected too, or another site could log a victim into the attacker's account.
    @extend_schema(summary="Log in with a session (portal)", request=s.LoginSerializer, responses=s.MeSerializer)
    @method_decorator(csrf_protect)
    def post(self, request: Request) -> Response:
        data = _valid(s.LoginSerializer, request)
        user = authenticate(request._request, username=data["username"], password=data["password"])
        if user is None:
            raise ValidationFailed("The username or password is not correct.", code="invalid_credentials")
        login(request._request, user)
        return Response(me_payload(user))


class LogoutView(APIView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [permissions.AllowAny]

    @extend_schema(summary="End the session", request=None, responses={204: OpenApiResponse(description="Logged out")})
    def post(self, request: Request) -> Response:
        logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _require_manager(request: Request, project: Project) -> None:
    """The role check, made before the body is validated; the service checks it again under its lock."""
    if not selectors.can_manage(request.user, project):
        raise PermissionDenied("Only an owner of this project or an operator may do this.")


def _valid(serializer_class: type, request: Request, *, partial: bool = False) -> dict[str, Any]:
    serializer = serializer_class(data=request.data, partial=partial)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
