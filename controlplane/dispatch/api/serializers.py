from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.dispatch.models import ImagePull, Launch


@extend_schema_field(
    {
        "type": "object",
        "properties": {
            "layers_done": {"type": "integer"},
            "layers_total": {"type": "integer"},
            "bytes_done": {"type": "integer"},
            "bytes_total": {"type": "integer"},
            "seconds": {"type": "number"},
        },
    }
)
class PullProgressField(serializers.JSONField):
    """``nodeagent.schema.PullProgress`` as the agent reported it."""


class LaunchSerializer(serializers.ModelSerializer):
    """A reservation's container on one server, as its agent saw it: state, exit code and the log's tail."""

    reservation = serializers.UUIDField(source="reservation.public_id", read_only=True)
    server = serializers.CharField(source="server.hostname", read_only=True)
    gpu_uuids = serializers.ListField(child=serializers.CharField(), read_only=True)
    image_digest = serializers.CharField(
        read_only=True, help_text="The repository digest of the image the container was created from: what ran."
    )
    oom_killed = serializers.BooleanField(
        read_only=True, help_text="The container went over its memory limit and was killed; error says so in words."
    )
    pull = PullProgressField(
        read_only=True,
        allow_null=True,
        help_text="While the image is pulled at the window (it was not on the node): layers, bytes and seconds so far.",
    )

    class Meta:
        model = Launch
        fields = [
            "launch_id",
            "reservation",
            "server",
            "gpu_uuids",
            "generation",
            "state",
            "container_id",
            "started_at",
            "finished_at",
            "exit_code",
            "error",
            "log_tail",
            "image_digest",
            "oom_killed",
            "pull",
            "pushed_at",
            "push_attempts",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class LogGapSerializer(serializers.Serializer):
    offset = serializers.IntegerField(help_text="Where in the container's output the missing bytes start.")
    bytes = serializers.IntegerField(help_text="How many bytes are missing there.")


class LaunchLogSerializer(serializers.Serializer):
    """One launch's output as kept: documentation of the logs answer, which the view builds itself."""

    launch_id = serializers.CharField()
    server = serializers.CharField()
    generation = serializers.IntegerField()
    state = serializers.CharField()
    text = serializers.CharField(help_text="The output kept, decoded as UTF-8 (invalid bytes replaced).")
    cut = serializers.IntegerField(help_text="Bytes of output dropped before `text` (older than what is kept).")
    gaps = LogGapSerializer(many=True, help_text="Output missing inside `text` (dropped by the agent).")
    next_offset = serializers.IntegerField(help_text="Bytes received so far: the offset where `text` ends.")
    eof = serializers.BooleanField(help_text="The container exited and all its output arrived.")


class ReservationLogsSerializer(serializers.Serializer):
    reservation = serializers.UUIDField()
    cursor = serializers.CharField(help_text="Give it as `?follow=1&after=` to follow from the end of this answer.")
    finished = serializers.BooleanField(help_text="Every launch ended and all its output arrived.")
    launches = LaunchLogSerializer(many=True)


class ImagePullSerializer(serializers.ModelSerializer):
    """An image pulled ahead of a reservation's window on one of its servers, as that server's agent reported it."""

    server = serializers.CharField(source="server.hostname", read_only=True)
    progress = PullProgressField(read_only=True, allow_null=True)

    class Meta:
        model = ImagePull
        fields = ["server", "image", "state", "digest", "size_bytes", "progress", "error", "reported_at"]
        read_only_fields = fields
