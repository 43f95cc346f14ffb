from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from controlplane.accounts.models import Project
from controlplane.core.api.fields import SlugRelatedField
from controlplane.ledger.models import CREDIT_LIMIT, BudgetAlert, LedgerEntry, MemberCap, QuotaPolicy


class LedgerEntrySerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    reservation = serializers.UUIDField(source="reservation.public_id", default=None, allow_null=True, read_only=True)

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


def _total(help_text: str = "") -> serializers.DecimalField:
    # No max_digits: new entries keep every total within CREDIT_LIMIT, but a total written before there was
    # a limit is shown as it is (a decimal string) instead of failing the whole answer.
    return serializers.DecimalField(max_digits=None, decimal_places=4, help_text=help_text or None)


class BalanceSerializer(serializers.Serializer):
    project = serializers.CharField()
    balance = _total("The sum of all entries.")
    held = _total("Credits held for booked windows (already taken off the balance).")
    by_kind = serializers.DictField(child=_total(), help_text="The sum of the entries of each kind.")


class QuotaPolicySerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    updated_by = serializers.CharField(source="updated_by.username", default=None, allow_null=True, read_only=True)

    class Meta:
        model = QuotaPolicy
        fields = [
            "project",
            "credits_per_period",
            "period",
            "max_concurrent_gpus",
            "max_reservation_hours",
            "budget_credits",
            "budget_action",
            "idle_util_percent",
            "idle_minutes",
            "idle_grace_minutes",
            "updated_at",
            "updated_by",
        ]
        read_only_fields = ["project", "period", "updated_at", "updated_by"]
        extra_kwargs = {
            "max_concurrent_gpus": {"min_value": 0},
            "budget_credits": {
                "help_text": "The period's spending cap (charges of the period plus what is held); null: none."
            },
            "budget_action": {"help_text": "Past the budget: refuse the booking (409 budget_exceeded) or warn."},
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The idle threshold is three fields or none (QuotaPolicy.clean); a PATCH is judged with what it keeps.
        names = ("idle_util_percent", "idle_minutes", "idle_grace_minutes")
        merged = [attrs[n] if n in attrs else getattr(self.instance, n, None) for n in names]
        if any(v is not None for v in merged) and any(v is None for v in merged):
            raise serializers.ValidationError(
                {"idle_util_percent": ["Set idle_util_percent, idle_minutes and idle_grace_minutes together."]}
            )
        return attrs


class BudgetAlertSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    reservation = serializers.UUIDField(source="reservation.public_id", default=None, allow_null=True, read_only=True)

    class Meta:
        model = BudgetAlert
        fields = ["id", "project", "period_key", "threshold", "spent", "budget", "reservation", "at"]
        read_only_fields = fields


class MemberCapSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = MemberCap
        fields = ["id", "project", "user", "gpu_hours_per_period", "updated_at"]
        read_only_fields = fields


class MemberCapSetSerializer(serializers.Serializer):
    project = SlugRelatedField(slug_field="slug", queryset=Project.objects.all())
    user = serializers.CharField(
        max_length=150, help_text="The member's username; someone not a member of the project is a 404."
    )
    gpu_hours_per_period = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0"),
        allow_null=True,
        help_text="GPU-hours the member may book in the project per UTC month; null removes the cap.",
    )


def _amount(minimum: Decimal, help_text: str) -> serializers.DecimalField:
    # The bounds are the ledger's (its services enforce them, with the project's totals); here they refuse
    # a number outside them before anything is locked, and the help text puts the range in the API schema
    # (which shows a decimal string's pattern, not its bounds).
    return serializers.DecimalField(
        max_digits=16, decimal_places=4, min_value=minimum, max_value=CREDIT_LIMIT, help_text=help_text
    )


class _OperatorMoveSerializer(serializers.Serializer):
    project = SlugRelatedField(slug_field="slug", queryset=Project.objects.all())
    amount = _amount(-CREDIT_LIMIT, f"Credits, either sign, from -{CREDIT_LIMIT} to {CREDIT_LIMIT}.")
    reason = serializers.CharField(max_length=1000)


class GrantSerializer(_OperatorMoveSerializer):
    amount = _amount(Decimal("0.0001"), f"Credits, from 0.0001 to {CREDIT_LIMIT}.")


class AdjustSerializer(_OperatorMoveSerializer):
    def validate_amount(self, value: Decimal) -> Decimal:
        if value == 0:
            raise serializers.ValidationError("An adjustment cannot be zero.")
        return value


class RefundSerializer(GrantSerializer):
    # The reservation model through the ledger's own foreign key: reservations sit above the ledger.
    reservation = SlugRelatedField(
        slug_field="public_id", queryset=LedgerEntry._meta.get_field("reservation").related_model._default_manager.all()
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["reservation"].project_id != attrs["project"].pk:
            raise serializers.ValidationError({"reservation": ["The reservation belongs to another project."]})
        return attrs


class BudgetStatusSerializer(serializers.Serializer):
    project = serializers.CharField()
    period = serializers.CharField(help_text="The UTC month, e.g. 2026-11.")
    budget = serializers.DecimalField(max_digits=None, decimal_places=4, allow_null=True)
    action = serializers.CharField()
    spent = serializers.DecimalField(
        max_digits=None, decimal_places=4, help_text="Charges written in the period plus credits held now."
    )
    share = serializers.FloatField(allow_null=True, help_text="spent / budget; null without a budget.")
    alerts = BudgetAlertSerializer(many=True)
