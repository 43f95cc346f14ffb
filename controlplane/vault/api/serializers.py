"""What the vault's API reads and answers. Values and passwords are write-only: no answer holds one."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.vault import services
from controlplane.vault.models import VaultEntry


class _StrictChar(serializers.CharField):
    """A string as sent: another JSON type is refused, not turned into text; nothing is trimmed."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


def _rule(check: Any) -> Any:
    def validate(value: Any) -> None:
        problem = check(value)
        if problem is not None:
            raise serializers.ValidationError(problem)

    return validate


class SecretSerializer(serializers.ModelSerializer):
    set = serializers.SerializerMethodField(help_text="Always true: the secret has a value (never shown).")
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)
    updated_by = serializers.CharField(
        source="updated_by.username", default=None, read_only=True, help_text="Who set the current value."
    )

    class Meta:
        model = VaultEntry
        fields = ["name", "set", "created_by", "created_at", "updated_by", "updated_at"]
        read_only_fields = fields

    def get_set(self, entry: VaultEntry) -> bool:
        return True


class SecretCreateSerializer(serializers.Serializer):
    name = _StrictChar(
        max_length=services.SECRET_NAME_MAX,
        validators=[_rule(services.secret_name_problem)],
        help_text="Letters, digits and _, not starting with a digit; unique per project. Also the file's name "
        "under /run/secrets/.",
    )
    value = _StrictChar(
        write_only=True,
        max_length=services.SECRET_VALUE_MAX,
        validators=[_rule(services.secret_value_problem)],
        help_text="The value; write-only, stored encrypted, never shown again.",
        style={"input_type": "password"},
    )


class SecretValueSerializer(serializers.Serializer):
    value = _StrictChar(
        write_only=True,
        max_length=services.SECRET_VALUE_MAX,
        validators=[_rule(services.secret_value_problem)],
        help_text="The new value; applies from the next launch.",
        style={"input_type": "password"},
    )


class RegistrySerializer(serializers.ModelSerializer):
    registry = serializers.CharField(source="name", read_only=True, help_text="host[:port], e.g. docker.io.")
    set = serializers.SerializerMethodField(help_text="Always true: a password or token is held (never shown).")
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)
    updated_by = serializers.CharField(source="updated_by.username", default=None, read_only=True)

    class Meta:
        model = VaultEntry
        fields = ["registry", "username", "set", "created_by", "created_at", "updated_by", "updated_at"]
        read_only_fields = fields

    def get_set(self, entry: VaultEntry) -> bool:
        return True


class RegistryCredentialSerializer(serializers.Serializer):
    username = _StrictChar(max_length=services.USERNAME_MAX)
    password = _StrictChar(
        write_only=True,
        max_length=services.PASSWORD_MAX,
        validators=[_rule(services.password_problem)],
        help_text="The password or access token; write-only, stored encrypted, never shown again.",
        style={"input_type": "password"},
    )


class RegistryCreateSerializer(RegistryCredentialSerializer):
    registry = _StrictChar(
        max_length=services.REGISTRY_MAX,
        help_text="host[:port] as an image reference names it: docker.io, nvcr.io, ghcr.io, 127.0.0.1:5000.",
    )

    def validate_registry(self, value: str) -> str:
        from controlplane.core.errors import ValidationFailed

        try:
            return services.registry_host(value)
        except ValidationFailed as exc:
            raise serializers.ValidationError(exc.fields["registry"]) from None
