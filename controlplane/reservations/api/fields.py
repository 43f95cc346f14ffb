"""Fields shared by the reservation and availability serializers."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
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


# A window's length: "1d2h30m" (units d, h, m, s, each at most once, in that order), an ISO 8601 duration
# without years or months, whose length varies ("PT10M", "P1DT12H", "P2W"), or a whole number of seconds.
# Each part is a number from 1 up, without leading zeros, of few enough digits that every text the pattern
# takes is a positive timedelta. The pattern is the schema's too: plain enough for ECMA-262, Python and a
# generator of examples alike (no lookahead, no named groups).
DURATION_MAX_LENGTH = 64
DURATION_MAX_SECONDS = 999_999_999


def _part(digits: int, unit: str) -> str:
    return f"[1-9][0-9]{{0,{digits - 1}}}{unit}"


def _some_of(parts: list[str]) -> str:
    """At least one of ``parts``, in their order, each at most once."""
    return "|".join(part + "".join(f"(?:{later})?" for later in parts[i + 1 :]) for i, part in enumerate(parts))


_SHORT = _some_of([_part(5, "d"), _part(6, "h"), _part(7, "m"), _part(9, "s")])
_ISO_TIME = "T(?:" + _some_of([_part(6, "H"), _part(7, "M"), _part(9, "S")]) + ")"
_ISO = "P(?:" + _some_of([_part(4, "W"), _part(5, "D"), _ISO_TIME]) + ")"
DURATION_PATTERN = f"^(?:{_SHORT}|{_ISO})$"
_DURATION = re.compile(DURATION_PATTERN)
_DURATION_PARTS = re.compile(r"([0-9]+)([A-Za-z])")
# What reads as a duration of zero ("0m", "PT0S"): refused as such rather than as not a duration.
_ZERO = re.compile(r"^P?T?(?:0+[dhmsWDHMS])+$")
_UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(value: str) -> timedelta | None:
    """A duration text ("10m", "PT10M") as a timedelta, or None when it is not one; see DURATION_PATTERN."""
    if len(value) > DURATION_MAX_LENGTH or _DURATION.fullmatch(value) is None:
        return None
    seconds = sum(int(n) * _UNIT_SECONDS[unit.lower()] for n, unit in _DURATION_PARTS.findall(value))
    return timedelta(seconds=seconds)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "pattern": DURATION_PATTERN, "maxLength": DURATION_MAX_LENGTH},
            {"type": "integer", "minimum": 1, "maximum": DURATION_MAX_SECONDS},
        ],
        "examples": ["10m", "1h30m", "PT10M", 600],
    }
)
class DurationField(serializers.Field):  # type: ignore[type-arg]
    """How long a window lasts: "10m", "2h", "1d", "1h30m", an ISO 8601 duration ("PT10M"), or seconds (600)."""

    default_error_messages = {
        "invalid": 'Not a duration: give e.g. "10m", "2h", "1d", "1h30m", "PT10M" (ISO 8601) or whole seconds (600).',
        "min_value": "A duration must be longer than zero.",
        "max_value": f"Ensure this value is less than or equal to {DURATION_MAX_SECONDS} seconds.",
    }

    def to_internal_value(self, data: Any) -> timedelta:
        if type(data) is float and data.is_integer():
            data = int(data)  # 600.0 is the integer 600 to JSON Schema, and so here
        if type(data) is int:
            if data < 1:
                self.fail("min_value")
            if data > DURATION_MAX_SECONDS:
                self.fail("max_value")
            return timedelta(seconds=data)
        if not isinstance(data, str):
            self.fail("invalid")
        parsed = parse_duration(data)
        if parsed is None:
            zero = len(data) <= DURATION_MAX_LENGTH and _ZERO.fullmatch(data) is not None
            self.fail("min_value" if zero else "invalid")
        return parsed

    def to_representation(self, value: timedelta) -> int:
        return int(value.total_seconds())


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
