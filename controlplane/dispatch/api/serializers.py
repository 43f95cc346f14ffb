from __future__ import annotations

from rest_framework import serializers

from controlplane.dispatch.models import Launch


class LaunchSerializer(serializers.ModelSerializer):
    """A reservation's container on one server, as its agent saw it: state, exit code and the log's tail."""

    reservation = serializers.UUIDField(source="reservation.public_id", read_only=True)
    server = serializers.CharField(source="server.hostname", read_only=True)
    gpu_uuids = serializers.ListField(child=serializers.CharField(), read_only=True)

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
            "pushed_at",
            "push_attempts",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields
