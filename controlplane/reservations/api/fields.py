"""Fields shared by the reservation and availability serializers."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.core.api.fields import AwareDateTimeField, SlugRelatedField
from controlplane.inventory.models import GpuModel

START_MAX = 64


@extend_schema_field(
    {
        "type": "string",
        "maxLength": START_MAX,
        "anyOf": [{"format": "date-time"}, {"pattern": r"^\s*[Nn][Oo][Ww]\s*$"}],
        "description": 'ISO 8601 with a time zone, or "now".',
    }
)
class StartField(AwareDateTimeField):
    """An ISO 8601 date-time with its time zone, or the word ``now``."""

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str) and value.strip().lower() == "now":
            return timezone.now()
        if isinstance(value, str) and len(value) > START_MAX:
            self.fail("invalid", format="ISO 8601")
        return super().to_internal_value(value)


class StrictStringField(serializers.CharField):
    """A string and only a string: ``1`` or ``true`` are refused rather than quietly turned into text."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# A variable name a shell and Docker both take: no "=", not empty, not starting with a digit.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvField(serializers.DictField):
    """Environment variables: at most ``max_items``, each name matching ENV_NAME and at most ``name_max`` long."""

    default_error_messages = {
        **serializers.DictField.default_error_messages,
        "max_items": "Ensure this map has no more than {max_items} variables.",
        "name": "Not a valid variable name: letters, digits and _, not starting with a digit.",
        "name_length": "Ensure this variable name has no more than {name_max} characters.",
    }

    def __init__(self, *, max_items: int, name_max: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_items = max_items
        self.name_max = name_max

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and len(data) > self.max_items:
            self.fail("max_items", max_items=self.max_items)
        if isinstance(data, dict):
            errors: dict[str, list[str]] = {}
            for name in data:
                if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                    errors[str(name)] = [str(self.error_messages["name"])]
                elif len(name) > self.name_max:
                    errors[name] = [self.error_messages["name_length"].format(name_max=self.name_max)]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class EnvFieldSchema(OpenApiSerializerFieldExtension):
    """The schema states the names' pattern and the bounds, which a DictField's does not."""

    target_class = EnvField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        schema["maxProperties"] = self.target.max_items
        schema["propertyNames"] = {"pattern": f"^{ENV_NAME.pattern}$", "maxLength": self.target.name_max}
        return schema


class GpuModelField(SlugRelatedField):
    """A catalog GPU model by name, in any case (``h100-80gb``); an unknown name is refused with the names
    there are, so a typo is fixed from the error alone."""

    default_error_messages = {
        **SlugRelatedField.default_error_messages,
        "unknown": "No GPU model named {value}. Valid names: {names}.",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(slug_field="name", queryset=GpuModel.objects.all(), **kwargs)

    def to_internal_value(self, data: Any) -> Any:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            if not isinstance(data, str) or len(data) > (self.max_length() or len(data)):
                raise
        matches = list(GpuModel.objects.filter(name__iexact=data)[:2])
        if len(matches) == 1:
            return matches[0]
        names = ", ".join(GpuModel.objects.order_by("name").values_list("name", flat=True)) or "(none yet)"
        self.fail("unknown", value=json.dumps(data), names=names)
