from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from controlplane.accounts.models import Project
from controlplane.ledger.models import LedgerEntry, QuotaPolicy
from controlplane.reservations.models import Reservation


class LedgerEntrySerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    reservation = serializers.UUIDField(source="reservation.public_id", default=None, read_only=True)

    class Meta:
        model = LedgerEntry
        fields = [
            "id",
            "project",
            "kind",
            "amount",
            "reservation",
            "period_key",
            "actor_label",
            "reason",
            "data",
            "created_at",
        ]
        read_only_fields = fields


class BalanceSerializer(serializers.Serializer):
    project = serializers.CharField()
    balance = serializers.DecimalField(max_digits=16, decimal_places=4, help_text="The sum of all entries.")
    held = serializers.DecimalField(
        max_digits=16, decimal_places=4, help_text="Credits held for booked windows (already taken off the balance)."
    )
    by_kind = serializers.DictField(child=serializers.DecimalField(max_digits=16, decimal_places=4))


class QuotaPolicySerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    updated_by = serializers.CharField(source="updated_by.username", default=None, read_only=True)

    class Meta:
        model = QuotaPolicy
        fields = [
            "project",
            "credits_per_period",
            "period",
            "max_concurrent_gpus",
            "max_reservation_hours",
            "updated_at",
            "updated_by",
        ]
        read_only_fields = ["project", "period", "updated_at", "updated_by"]
        extra_kwargs = {"max_concurrent_gpus": {"min_value": 0}}


class _OperatorMoveSerializer(serializers.Serializer):
    project = serializers.SlugRelatedField(slug_field="slug", queryset=Project.objects.all())
    amount = serializers.DecimalField(max_digits=16, decimal_places=4)
    reason = serializers.CharField(max_length=1000)


class GrantSerializer(_OperatorMoveSerializer):
    amount = serializers.DecimalField(max_digits=16, decimal_places=4, min_value=Decimal("0.0001"))


class AdjustSerializer(_OperatorMoveSerializer):
    def validate_amount(self, value: Decimal) -> Decimal:
        if value == 0:
            raise serializers.ValidationError("An adjustment cannot be zero.")
        return value


class RefundSerializer(GrantSerializer):
    reservation = serializers.SlugRelatedField(slug_field="public_id", queryset=Reservation.objects.all())

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["reservation"].project_id != attrs["project"].pk:
            raise serializers.ValidationError({"reservation": ["The reservation belongs to another project."]})
        return attrs
