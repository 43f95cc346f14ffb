"""Serializer fields the API's apps share."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


class SlugRelatedField(serializers.SlugRelatedField):  # type: ignore[type-arg]
    """DRF's SlugRelatedField that reads only a string no longer than the model's column.

    A value that could never match (a number, a list, 3 MB of text) is refused before the query, with the
    same messages a CharField gives; the maximum is the slug column's own ``max_length``, so it is written once.
    ``known`` holds objects the view has already read, by slug, so that they are not read twice.
    """

    default_error_messages = {
        **serializers.SlugRelatedField.default_error_messages,
        "not_a_string": "Not a valid string.",
        "max_length": "Ensure this field has no more than {max_length} characters.",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.known: dict[str, Any] = {}

    def max_length(self) -> int | None:
        queryset = self.get_queryset()
        if queryset is None:
            return None
        column = queryset.model._meta.get_field(self.slug_field)
        # A text column's; a UUIDField's max_length (32) is its storage on some databases, not the text's.
        return column.max_length if isinstance(column, models.CharField) else None

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("not_a_string")
        if data in self.known:
            return self.known[data]
        limit = self.max_length()
        if limit is not None and len(data) > limit:
            self.fail("max_length", max_length=limit)
        return super().to_internal_value(data)


class SlugRelatedFieldSchema(OpenApiSerializerFieldExtension):
    """The OpenAPI schema shows the slug's maximum length, as it does a CharField's."""

    target_class = SlugRelatedField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        limit = self.target.max_length()
        if limit is not None and schema.get("type") == "string" and "format" not in schema:
            schema["maxLength"] = limit
        return schema


NAIVE_MESSAGE = "This date-time has no time zone: add Z or an offset, e.g. 2026-05-01T14:00:00Z."
# The first and the last day a date-time can name: with an offset, a time on them may fall outside what can be
# held at all (0001-01-01T00:00+05:00 is in year 0), which the schema cannot tell apart from the rest of the
# day. Refused whole, as the schema's pattern says; no booking, quote or report needs them.
EDGE_DAYS = ("0001-01-01", "9999-12-31")
DATE_TIME_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": "^(?!" + "|".join(EDGE_DAYS) + ")",
    "example": "2026-05-01T14:00:00Z",
}


@extend_schema_field(DATE_TIME_SCHEMA)
class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date-time that says its time zone. DRF would read one without as the server's zone (UTC)
    and book an hour or more off for anyone who is not in UTC; refusing it is the only safe reading."""

    default_error_messages = {**serializers.DateTimeField.default_error_messages, "naive": NAIVE_MESSAGE}

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str) and value.startswith(EDGE_DAYS):
            self.fail("overflow")
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
        elif isinstance(value, datetime) and timezone.is_naive(value):
            self.fail("naive")
        return super().to_internal_value(value)


class StrictBooleanField(serializers.BooleanField):
    """true or false, as the schema says: DRF's BooleanField also takes 0, 1, "yes", "on" from JSON. A form
    (whose every value is text) may still say "true" or "false"."""

    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data: Any) -> bool:
        if isinstance(data, bool):
            return data
        if isinstance(data, str) and data in ("true", "false") and not _is_json(self):
            return data == "true"
        self.fail("invalid")


def _is_json(field: serializers.Field) -> bool:
    from django.http import QueryDict

    return not isinstance(getattr(field.root, "initial_data", None), QueryDict)
