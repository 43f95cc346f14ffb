"""Fields shared by the reservation and availability serializers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


@extend_schema_field(OpenApiTypes.STR)
class StartField(serializers.DateTimeField):
    """An ISO 8601 date-time, or the word ``now``."""

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str) and value.strip().lower() == "now":
            return timezone.now()
        return super().to_internal_value(value)


class StrictStringField(serializers.CharField):
    """A string and only a string: ``1`` or ``true`` are refused rather than quietly turned into text."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
