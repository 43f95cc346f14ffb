from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.notifications.choices import OPERATOR_EVENTS, SUBSCRIBABLE_EVENTS, Channel, EventType
from controlplane.notifications.models import EmailMessage, Notification, WebhookDelivery, WebhookEndpoint

WEBHOOK_EVENTS = [t.value for t in SUBSCRIBABLE_EVENTS if t not in OPERATOR_EVENTS]


class NotificationSerializer(serializers.ModelSerializer):
    type = serializers.ChoiceField(source="event.type", choices=EventType.choices, read_only=True)
    unread = serializers.SerializerMethodField()
    reservation = serializers.SerializerMethodField()
    project = serializers.SerializerMethodField()
    link = serializers.SerializerMethodField()
    occurred_at = serializers.DateTimeField(source="event.occurred_at", read_only=True)
    payload = serializers.JSONField(source="event.payload", read_only=True)

    class Meta:
        model = Notification
        fields = [
            "id",
            "type",
            "title",
            "body",
            "unread",
            "read_at",
            "created_at",
            "occurred_at",
            "reservation",
            "project",
            "link",
            "payload",
        ]

    def get_unread(self, obj: Notification) -> bool:
        return obj.read_at is None

    @extend_schema_field({"type": ["string", "null"], "format": "uuid"})
    def get_reservation(self, obj: Notification) -> str | None:
        r = obj.event.reservation
        return str(r.public_id) if r else None

    @extend_schema_field({"type": ["string", "null"]})
    def get_project(self, obj: Notification) -> str | None:
        p = obj.event.project
        return p.slug if p else None

    def get_link(self, obj: Notification) -> str:
        return str(obj.event.payload.get("link", ""))


class UnreadCountSerializer(serializers.Serializer):
    unread = serializers.IntegerField()


class MarkReadSerializer(serializers.Serializer):
    ids = serializers.ListField(
        # Ids are 64-bit: a larger number is a 400 naming the field, not a database overflow.
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        max_length=1000,
        help_text="Omit for all.",
    )


class MarkedSerializer(serializers.Serializer):
    marked = serializers.IntegerField()
    unread = serializers.IntegerField()


class PreferenceSerializer(serializers.Serializer):
    event_type = serializers.ChoiceField(choices=[(t.value, t.label) for t in SUBSCRIBABLE_EVENTS])
    description = serializers.CharField(read_only=True)
    channel = serializers.ChoiceField(choices=Channel.choices)
    default_channel = serializers.ChoiceField(choices=Channel.choices, read_only=True)


class PreferencesSerializer(serializers.Serializer):
    preferences = PreferenceSerializer(many=True)


class PreferencesUpdateSerializer(serializers.Serializer):
    preferences = serializers.ListField(child=PreferenceSerializer(), max_length=100)

    def to_changes(self) -> dict[str, str]:
        return {p["event_type"]: p["channel"] for p in self.validated_data["preferences"]}


class WebhookEndpointSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    events = serializers.ListField(child=serializers.ChoiceField(choices=WEBHOOK_EVENTS))
    secret = serializers.CharField(read_only=True, help_text="whsec_ + base64: the receiver verifies with it.")

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "events",
            "enabled",
            "disabled_reason",
            "disabled_at",
            "secret",
            "previous_secret_expires_at",
            "created_at",
        ]
        read_only_fields = fields


# The shape of a URL the control plane calls (controlplane/notifications/urlcheck.py: http or https, a host, no
# credentials), as a pattern the API schema states; no blank or control character anywhere, since the URL
# parser would drop them unseen. Whether its host resolves to a public address is checked after, at save and
# at every delivery.
webhook_url_validator = RegexValidator(
    r"\A[Hh][Tt][Tt][Pp][Ss]?://[^/?#@\x00-\x20\x7f]+(?:[/?#][^\x00-\x20\x7f]*)?\Z",
    "An http or https URL with a host, no credentials and no blanks: https://hooks.example.com/path.",
    code="invalid_url",
)


def _webhook_url(**kwargs: Any) -> serializers.CharField:
    return serializers.CharField(max_length=2000, trim_whitespace=False, validators=[webhook_url_validator], **kwargs)


class WebhookEndpointCreateSerializer(serializers.Serializer):
    url = _webhook_url()
    events = serializers.ListField(child=serializers.ChoiceField(choices=WEBHOOK_EVENTS), min_length=1, max_length=50)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class WebhookEndpointUpdateSerializer(serializers.Serializer):
    url = _webhook_url(required=False)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=WEBHOOK_EVENTS), min_length=1, max_length=50, required=False
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)


class RotateSecretSerializer(serializers.Serializer):
    overlap_s = serializers.IntegerField(
        min_value=0,
        max_value=7 * 24 * 3600,
        required=False,
        help_text="How long the old secret keeps signing (a second signature); default NOTIFICATIONS_SECRET_OVERLAP_S.",
    )


class WebhookDeliverySerializer(serializers.ModelSerializer):
    event_id = serializers.UUIDField(source="event.public_id", read_only=True)
    type = serializers.ChoiceField(source="event.type", choices=EventType.choices, read_only=True)
    history = serializers.SerializerMethodField()

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event_id",
            "type",
            "state",
            "attempts",
            "last_status_code",
            "last_response",
            "last_error",
            "next_attempt_at",
            "created_at",
            "delivered_at",
            "history",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "attempt": {"type": "integer"},
                    "at": {"type": "string", "format": "date-time"},
                    "status_code": {"type": ["integer", "null"]},
                    "error": {"type": "string"},
                    "ms": {"type": "number"},
                },
            },
        }
    )
    def get_history(self, obj: WebhookDelivery) -> list[dict[str, Any]]:
        return list(obj.history)


class EmailMessageSerializer(serializers.ModelSerializer):
    class Meta:
        model = EmailMessage
        fields = [
            "id",
            "to_address",
            "subject",
            "body_text",
            "body_html",
            "state",
            "attempts",
            "last_error",
            "created_at",
            "sent_at",
        ]
        read_only_fields = fields
