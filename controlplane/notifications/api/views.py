from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts import selectors as accounts
from controlplane.accounts.models import Project
from controlplane.core.errors import NotFound, PermissionDenied, ValidationFailed
from controlplane.notifications import selectors, services
from controlplane.notifications.api import serializers as s
from controlplane.notifications.choices import DeliveryState
from controlplane.notifications.filters import NotificationFilter
from controlplane.notifications.models import EmailMessage, Notification, WebhookEndpoint


class NotificationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Your notifications, newest first (docs/notifications.md). Only your own: nobody else's is listed."""

    serializer_class = s.NotificationSerializer
    filterset_class = NotificationFilter
    queryset = Notification.objects.none()

    def get_queryset(self) -> QuerySet[Notification]:
        if getattr(self, "swagger_fake_view", False):
            return Notification.objects.none()
        return selectors.notifications_of(self.request.user)

    @extend_schema(responses={200: s.UnreadCountSerializer}, summary="How many of your notifications are unread")
    @action(detail=False, methods=["get"], url_path="unread-count", filterset_class=None, pagination_class=None)
    def unread_count(self, request: Request) -> Response:
        return Response({"unread": selectors.unread_count(request.user)})

    @extend_schema(
        request=s.MarkReadSerializer,
        responses={200: s.MarkedSerializer},
        summary="Mark notifications read: those listed in `ids`, or all of them without `ids`",
        description="Ids that are not yours are ignored, as if they did not exist.",
    )
    @action(detail=False, methods=["post"], url_path="mark-read", filterset_class=None, pagination_class=None)
    def mark_read(self, request: Request) -> Response:
        serializer = s.MarkReadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        ids = serializer.validated_data.get("ids")
        marked = services.notifications_mark_read(user=request.user, ids=ids)
        return Response({"marked": marked, "unread": selectors.unread_count(request.user)})


class PreferencesView(APIView):
    """Per event, how it reaches you beyond this list: email, your project's webhooks, or nothing."""

    schema_error_statuses = {"PUT": ("403",)}  # an event only operators receive, chosen by a tenant

    @extend_schema(responses={200: s.PreferencesSerializer}, summary="Your notification preferences")
    def get(self, request: Request) -> Response:
        return Response({"preferences": services.preferences_of(request.user)})

    @extend_schema(
        request=s.PreferencesUpdateSerializer,
        responses={200: s.PreferencesSerializer},
        summary="Set the channel of the events listed; the others keep theirs",
    )
    def put(self, request: Request) -> Response:
        serializer = s.PreferencesUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response({"preferences": services.preferences_set(user=request.user, changes=serializer.to_changes())})


class OutboxViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The emails the demo's file backend wrote (var/outbox/): yours, or every one for an operator. 404 when
    the installation sends real email (EMAIL_HOST)."""

    serializer_class = s.EmailMessageSerializer
    queryset = EmailMessage.objects.none()

    def get_queryset(self) -> QuerySet[EmailMessage]:
        if getattr(self, "swagger_fake_view", False):
            return EmailMessage.objects.none()
        if not settings.NOTIFICATIONS_OUTBOX_VISIBLE:
            raise NotFound("This installation sends email through a mail server; it keeps no outbox to show.")
        return selectors.outbox_for(self.request.user)


_OWNERS = "Only an owner of this project or an operator may manage its webhooks."


class WebhookEndpointViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """A project's webhook endpoints (owners and operators). Another project's is 404; a teammate's 403."""

    serializer_class = s.WebhookEndpointSerializer
    queryset = WebhookEndpoint.objects.none()
    lookup_field = "public_id"
    lookup_url_kwarg = "id"
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def project(self) -> Project:
        if not hasattr(self, "_project"):
            visible = accounts.projects_visible_to(self.request.user)
            self._project = get_object_or_404(visible, pk=self.kwargs["project_pk"])
            # Before any body or object is read: a teammate learns nothing of the endpoints.
            if not accounts.can_manage(self.request.user, self._project):
                raise PermissionDenied(_OWNERS)
        return self._project

    def get_queryset(self) -> QuerySet[WebhookEndpoint]:
        if getattr(self, "swagger_fake_view", False):
            return WebhookEndpoint.objects.none()
        return selectors.endpoints_of(self.project())

    @extend_schema(
        request=s.WebhookEndpointCreateSerializer,
        responses={201: s.WebhookEndpointSerializer},
        summary="Add a webhook endpoint; its signing secret is in the answer",
        description="The URL is refused (400 naming `url`) when its host resolves to a loopback, link-local, "
        "private or reserved address, unless the operator allows it (NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE).",
    )
    def create(self, request: Request, project_pk: str) -> Response:
        project = self.project()
        serializer = s.WebhookEndpointCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        endpoint = services.endpoint_create(project=project, actor=request.user, **serializer.validated_data)
        return Response(s.WebhookEndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.WebhookEndpointUpdateSerializer, responses={200: s.WebhookEndpointSerializer})
    def partial_update(self, request: Request, project_pk: str, id: str) -> Response:
        endpoint = self.get_object()
        serializer = s.WebhookEndpointUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        endpoint = services.endpoint_update(endpoint=endpoint, **serializer.validated_data)
        return Response(s.WebhookEndpointSerializer(endpoint).data)

    def perform_destroy(self, instance: WebhookEndpoint) -> None:
        services.endpoint_delete(endpoint=instance)

    @extend_schema(
        request=s.RotateSecretSerializer,
        responses={200: s.WebhookEndpointSerializer},
        summary="A new signing secret; the old one keeps signing beside it for the overlap",
    )
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, project_pk: str, id: str) -> Response:
        endpoint = self.get_object()
        serializer = s.RotateSecretSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        endpoint = services.endpoint_rotate_secret(
            endpoint=endpoint, overlap_s=serializer.validated_data.get("overlap_s")
        )
        return Response(s.WebhookEndpointSerializer(endpoint).data)

    @extend_schema(
        request=None,
        responses={202: s.WebhookDeliverySerializer},
        summary="Send a `webhook.test` event to this endpoint (409 `endpoint_disabled` while disabled)",
        description="Queued behind what the endpoint has pending and sent by a worker; its delivery log shows it.",
    )
    @action(detail=True, methods=["post"])
    def test(self, request: Request, project_pk: str, id: str) -> Response:
        endpoint = self.get_object()
        delivery = services.endpoint_send_test(endpoint=endpoint, actor=request.user)
        return Response(s.WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        responses={200: s.WebhookDeliverySerializer(many=True)},
        summary="The endpoint's delivery log, newest first",
        parameters=[OpenApiParameter("state", enum=DeliveryState.values, required=False)],
    )
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, project_pk: str, id: str) -> Response:
        endpoint = self.get_object()
        qs: Any = selectors.deliveries_of(endpoint)
        wanted = request.query_params.get("state")
        if wanted:
            if wanted not in DeliveryState.values:
                message = f"Not one of {', '.join(DeliveryState.values)}."
                raise ValidationFailed(message, fields={"state": [message]})
            qs = qs.filter(state=wanted)
        page = self.paginate_queryset(qs)
        data = s.WebhookDeliverySerializer(page if page is not None else qs, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)
