from __future__ import annotations

from rest_framework import serializers

from controlplane.fleet.models import JoinToken


class JoinTokenSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()
    created_by: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="username", read_only=True)
    server: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="hostname", allow_null=True, read_only=True
    )

    class Meta:
        model = JoinToken
        fields = [
            "id",
            "lookup",
            "note",
            "status",
            "created_by",
            "created_at",
            "expires_at",
            "used_at",
            "server",
            "revoked_at",
        ]
        read_only_fields = fields

    def get_status(self, obj: JoinToken) -> str:
        return obj.status()


class JoinTokenCreateSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    ttl_s = serializers.IntegerField(
        required=False, min_value=60, max_value=30 * 24 * 3600, allow_null=True, default=None
    )


class JoinTokenIssuedSerializer(JoinTokenSerializer):
    token = serializers.CharField(help_text="The join token. Shown once: only its hash is stored.")

    class Meta(JoinTokenSerializer.Meta):
        fields = [*JoinTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields
